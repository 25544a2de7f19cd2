"""An A2A client made of the official Python SDK (`a2a-sdk` on PyPI), for the tests of
`agentloop a2a serve`: it reads the agent card at URL, takes its steps, and prints what happened
as one JSON object (protocol buffers as their JSON).

    python client.py http://127.0.0.1:PORT/NAME STEPS

STEPS is a JSON list, each step one of:
    {"do": "card"}                                     the agent card, as the SDK read it
    {"do": "send", "text": T, "context": C, "streaming": B}
        sends a message in context C (a name the script keeps an id for; or "context_id": ID,
        a context another run of the script made), streaming or not, and returns every event
        the SDK yields
    {"do": "start", "text": T, "task": K}             sends a message answered at once (the task
                                                       working); keeps its id as K
    {"do": "get", "task": K}                          the task
    {"do": "cancel", "task": K, "when_exists": PATH}  cancels the task once PATH exists
    {"do": "reply", "task": K, "text": T, "streaming": B}
        sends a message on task K (in its context), streaming or not, and returns every event
    {"do": "wait", "task": K, "until": [STATES]}      gets the task until its state is one of
                                                       STATES (at most 120 s), and returns it
A task K is a name the script keeps an id for, or {"id": ID}: a task another run of the script
started (the server may have restarted since).
"""

import asyncio
import json
import os
import sys
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.utils.errors import A2AError
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
)
from google.protobuf import json_format


def dump(proto):
    return json_format.MessageToDict(proto)


async def main():
    url, steps = sys.argv[1], json.loads(sys.argv[2])
    contexts, tasks, out = {}, {}, []
    async with httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        clients = {}

        async def client(streaming, polling=False):
            key = (streaming, polling)
            if key not in clients:
                config = ClientConfig(streaming=streaming, polling=polling, httpx_client=http)
                clients[key] = await create_client(card, client_config=config)
            return clients[key]

        def task_id(step):
            key = step["task"]
            return key["id"] if isinstance(key, dict) else tasks[key]

        def message(step, task=None):
            context = contexts.setdefault(step.get("context", "default"), str(uuid.uuid4()))
            if "context_id" in step:
                context = step["context_id"]
            if task is not None:
                context = task.context_id
            return SendMessageRequest(
                message=Message(
                    role=Role.ROLE_USER,
                    message_id=str(uuid.uuid4()),
                    parts=[Part(text=step["text"])],
                    context_id=context,
                    task_id=task.id if task is not None else None,
                )
            )

        for step in steps:
            try:
                if step["do"] == "card":
                    out.append({"card": dump(card)})
                elif step["do"] == "send":
                    c = await client(step.get("streaming", False))
                    events = [dump(e) async for e in c.send_message(message(step))]
                    out.append({"events": events})
                elif step["do"] == "start":
                    c = await client(False, polling=True)
                    events = [dump(e) async for e in c.send_message(message(step))]
                    tasks[step["task"]] = events[-1]["task"]["id"]
                    out.append({"events": events})
                elif step["do"] == "get":
                    c = await client(False)
                    task = await c.get_task(GetTaskRequest(id=task_id(step)))
                    out.append({"task": dump(task)})
                elif step["do"] == "reply":
                    c = await client(False)
                    task = await c.get_task(GetTaskRequest(id=task_id(step)))
                    c = await client(step.get("streaming", False))
                    events = [dump(e) async for e in c.send_message(message(step, task))]
                    out.append({"events": events})
                elif step["do"] == "wait":
                    c = await client(False)
                    for _ in range(1200):
                        task = await c.get_task(GetTaskRequest(id=task_id(step)))
                        state = dump(task)["status"]["state"]
                        if state in step["until"]:
                            break
                        await asyncio.sleep(0.1)
                    out.append({"task": dump(task)})
                elif step["do"] == "cancel":
                    while step.get("when_exists") and not os.path.exists(step["when_exists"]):
                        await asyncio.sleep(0.05)
                    c = await client(False)
                    task = await c.cancel_task(CancelTaskRequest(id=task_id(step)))
                    out.append({"task": dump(task)})
                else:
                    raise SystemExit(f"unknown step {step['do']!r}")
            except (A2AClientError, A2AError) as e:
                out.append({"error": {"type": type(e).__name__, "message": str(e)}})
    print(json.dumps(out))


asyncio.run(main())
