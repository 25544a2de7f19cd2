"""An A2A agent made of the official Python SDK (`a2a-sdk` on PyPI, with its Starlette server),
for the tests of agentloop's A2A client: it answers with the message's text in capitals.

    python server.py DIR [--no-streaming]

It listens on a free loopback port and prints its URL on one line once it serves. What a message
asks (by its first word):
    fail ...   the task fails, its status saying why
    slow ...   the task works until it is cancelled: it writes DIR/started when it begins, and
               DIR/cancelled (the task id) when a CancelTask reaches it
    anything   one status update ("uppercasing"), then an artifact with the text in capitals
--no-streaming: the card says the agent does not stream (a client sends `SendMessage`).
"""

import asyncio
import os
import socket
import sys

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
    app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.02)
    print(url, flush=True)
    await serving


asyncio.run(main())
