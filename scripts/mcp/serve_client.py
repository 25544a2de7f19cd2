"""An MCP client made of the official Python SDK (`mcp` on PyPI), for the tests of
`agentloop mcp serve`: it connects over stdio (starting the command given) or streamable HTTP (to
the URL given), takes its steps in one session, and prints what happened as one JSON object.

    python serve_client.py stdio '["agentloop", "mcp", "serve", "agent.toml"]' STEPS
    python serve_client.py http http://127.0.0.1:PORT/mcp STEPS

STEPS is a JSON list, each step one of:
    {"do": "list"}                                       the tools, as the server lists them
    {"do": "call", "tool": T, "arguments": A}            the result, with the progress messages
    {"do": "cancel", "tool": T, "arguments": A, "after": TEXT, "when_exists": PATH}
        calls, and cancels the call (the SDK sends notifications/cancelled) once a progress
        message holds TEXT and then the file PATH (optional) exists
    {"do": "together", "calls": [CALL, ...]}             the call steps made at once, their
        results in the order given
A call step may hold "elicit": {"action": "accept"|"decline"|"cancel", "content": {...}}: the
answer to each elicitation the server sends during the call (the requests are returned, as
"elicited"). The client declares elicitation only when a step holds such an answer.
"""

import json
import os
import sys

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


# The answer to the elicitations of the step being taken, and the requests seen.
elicitation = {"answer": None, "seen": []}


async def on_elicitation(context, params):
    elicitation["seen"].append(dump(params))
    answer = elicitation["answer"] or {"action": "decline"}
    return types.ElicitResult(action=answer["action"], content=answer.get("content"))


async def call(session, step):
    progress = []
    elicitation["answer"], elicitation["seen"] = step.get("elicit"), []

    async def on_progress(value, total, message):
        progress.append(message)

    try:
        result = await session.call_tool(
            step["tool"], step.get("arguments", {}), progress_callback=on_progress
        )
        return {"result": dump(result), "progress": progress, "elicited": elicitation["seen"]}
    except MCPError as e:
        return {
            "error": {"code": e.error.code, "message": e.error.message},
            "progress": progress,
            "elicited": elicitation["seen"],
        }


async def cancel(session, step):
    progress = []
    seen = anyio.Event()

    async def on_progress(value, total, message):
        progress.append(message)
        if message and step["after"] in message:
            seen.set()

    outcome = {"cancelled": False}
    async with anyio.create_task_group() as group:

        async def the_call():
            try:
                result = await session.call_tool(
                    step["tool"], step.get("arguments", {}), progress_callback=on_progress
                )
                outcome["result"] = dump(result)
            except anyio.get_cancelled_exc_class():
                outcome["cancelled"] = True
                raise

        group.start_soon(the_call)
        with anyio.fail_after(60):
            await seen.wait()
            while step.get("when_exists") and not os.path.exists(step["when_exists"]):
                await anyio.sleep(0.05)
        group.cancel_scope.cancel()
    outcome["progress"] = progress
    return outcome


async def together(session, steps):
    results = [None] * len(steps)

    async def one(i, step):
        results[i] = await call(session, step)

    async with anyio.create_task_group() as group:
        for i, step in enumerate(steps):
            group.start_soon(one, i, step)
    return results


async def main():
    mode, target, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if mode == "stdio":
        command = json.loads(target)
        transport = stdio_client(
            StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
        )
    else:
        transport = streamable_http_client(target)
    out = []
    async with transport as streams:
        elicits = any("elicit" in step for step in steps)
        callback = {"elicitation_callback": on_elicitation} if elicits else {}
        async with ClientSession(streams[0], streams[1], **callback) as session:
            await session.initialize()
            for step in steps:
                if step["do"] == "list":
                    listed = await session.list_tools()
                    out.append({"tools": [dump(t) for t in listed.tools]})
                elif step["do"] == "call":
                    out.append(await call(session, step))
                elif step["do"] == "cancel":
                    out.append(await cancel(session, step))
                elif step["do"] == "together":
                    out.append({"results": await together(session, step["calls"])})
                else:
                    raise SystemExit(f"unknown step {step['do']!r}")
    print(json.dumps(out))


anyio.run(main)
