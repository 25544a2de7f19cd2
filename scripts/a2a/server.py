"""An A2A agent made of the official Python SDK (`a2a-sdk` on PyPI, with its Starlette server),
for the tests of agentloop's A2A client: it answers with the message's text in capitals.

    python server.py DIR [--no-streaming] [--key KEY] [--cut-stream] [--flaky-get N]

It listens on a free loopback port and prints its URL on one line once it serves. What a message
asks (by its first word):
    fail ...   the task fails, its status saying why
    slow ...   the task works until it is cancelled: it writes DIR/started when it begins, and
               DIR/cancelled (the task id) when a CancelTask reaches it
    flood ...  a status message of 100,000 bytes, then one artifact appended to three times with
               1 MiB of text each ("a" * 1 MiB, then "b", then "c"), then the task completes
    pause ...  works for 3 s (DIR/cancelled written if a CancelTask reaches it), then answers as
               below
    anything   one status update ("uppercasing"), then an artifact with the text in capitals
--no-streaming: the card says the agent does not stream (a client sends `SendMessage`).
--key KEY: every request (the card's too) needs `key=KEY` in its query, or basic authentication
    with the password KEY; others are answered 401. The card names the URL without the key.
--cut-stream: the first stream of a task's events is cut (the connection dropped mid-body) after
    its first event; the task goes on.
--flaky-get N: the first N GetTask requests are answered 502, as by a proxy.
"""

import asyncio
import base64
import os
import socket
import sys
from urllib.parse import parse_qs

import uvicorn
from a2a.helpers.proto_helpers import new_task, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Role,
    TaskState,
)
from starlette.applications import Starlette


class Uppercase(AgentExecutor):
    def __init__(self, folder):
        self.folder = folder

    async def execute(self, context: RequestContext, event_queue):
        text = context.get_user_input()
        if context.current_task is None:
            await event_queue.enqueue_event(
                new_task(
                    context.task_id,
                    context.context_id,
                    TaskState.TASK_STATE_SUBMITTED,
                    history=[context.message],
                )
            )
        task = TaskUpdater(event_queue, context.task_id, context.context_id)

        def say(words):
            return new_text_message(
                words, context_id=context.context_id, task_id=context.task_id, role=Role.ROLE_AGENT
            )

        first = text.split(maxsplit=1)[0].lower() if text.strip() else ""
        if first == "fail":
            await task.start_work(say("looking into it"))
            await task.failed(say("the remote agent cannot do that"))
        elif first == "flood":
            await task.start_work(say("x" * 100_000))
            for letter in "abc":
                await task.add_artifact(
                    [new_text_part(letter * (1 << 20))],
                    artifact_id="flood",
                    name="flood",
                    append=letter != "a",
                )
            await task.complete()
        elif first == "pause":
            await task.start_work(say("pausing"))
            await asyncio.sleep(3)
            await task.add_artifact([new_text_part(text.upper())], name="result")
            await task.complete()
        elif first == "slow":
            await task.start_work(say("starting slowly"))
            with open(os.path.join(self.folder, "started"), "w") as f:
                f.write(context.task_id)
            await asyncio.sleep(120)
            await task.complete(say("too late"))
        else:
            await task.start_work(say("uppercasing"))
            await task.add_artifact([new_text_part(text.upper())], name="result")
            await task.complete()

    async def cancel(self, context: RequestContext, event_queue):
        with open(os.path.join(self.folder, "cancelled"), "w") as f:
            f.write(context.task_id)
        task = TaskUpdater(event_queue, context.task_id, context.context_id)
        await task.cancel()


def flag(name):
    """The value after `name` among the arguments, or None."""
    args = sys.argv[2:]
    return args[args.index(name) + 1] if name in args else None


class Gate:
    """ASGI middleware for the flags: the key, the cut stream, the flaky GetTask."""

    def __init__(self, app):
        self.app = app
        self.key = flag("--key")
        self.cut = "--cut-stream" in sys.argv[2:]
        self.flaky = int(flag("--flaky-get") or 0)

    async def answer(self, send, status):
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def allowed(self, scope):
        query = parse_qs(scope.get("query_string", b"").decode())
        if query.get("key") == [self.key]:
            return True
        for name, value in scope.get("headers", []):
            if name == b"authorization" and value.startswith(b"Basic "):
                user_pass = base64.b64decode(value[6:]).decode()
                return user_pass.split(":", 1)[-1] == self.key
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.key is not None and not self.allowed(scope):
            return await self.answer(send, 401)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if b'"GetTask"' in body and self.flaky > 0:
            self.flaky -= 1
            return await self.answer(send, 502)

        replayed = False

        async def replay():
            # The body once, as it came; then what the connection says (a disconnect).
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        if self.cut and b'"SendStreamingMessage"' in body:
            self.cut = False
            chunks = 0

            async def cut(message):
                nonlocal chunks
                if message["type"] == "http.response.body" and message.get("body"):
                    chunks += 1
                    if chunks > 1:
                        raise ConnectionAbortedError("the stream is cut, as the test asks")
                await send(message)

            return await self.app(scope, replay, cut)
        return await self.app(scope, replay, send)


async def main():
    folder = sys.argv[1]
    streaming = "--no-streaming" not in sys.argv[2:]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = AgentCard(
        name="shouter",
        description="Answers with the text it is given in capitals.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="shout",
                name="shout",
                description="Puts a text in capitals.",
                tags=["text"],
            )
        ],
    )
    handler = DefaultRequestHandler(
        agent_executor=Uppercase(folder), task_store=InMemoryTaskStore(), agent_card=card
    )
    app = Gate(
        Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/"))
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.02)
    print(url, flush=True)
    await serving


asyncio.run(main())
