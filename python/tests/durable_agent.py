"""The agent of the crash test, the same in the process that dies and the one that resumes it
(a journaled run resumes only with the same definition). Run as a script it starts a journaled
run, prints its run id, and hangs in the tool until it is killed."""

from __future__ import annotations

import asyncio
import sys
import threading

from agentloop import Agent, ScriptedModel, ToolCall, tool

#: Set by the dying process: its tool call never returns.
HANG = threading.Event()


def make_agent(marker: str, idempotent: bool) -> Agent:
    @tool(idempotent=idempotent)
    def append_line(path: str) -> str:
        """Appends a line to a file."""
        with open(path, "a") as f:
            f.write("ran\n")
        if HANG.is_set():
            threading.Event().wait()
        return "written"

    return Agent(
        name="durable",
        model=ScriptedModel([[ToolCall("append_line", {"path": marker}, id="c1")], "All written."]),
        tools=[append_line],
    )


async def _run_until_killed(journal: str, marker: str, idempotent: bool) -> None:
    HANG.set()
    async for event in make_agent(marker, idempotent).stream("Write the line.", journal=journal):
        if event.type == "run_started":
            print(event.run_id, flush=True)


if __name__ == "__main__":
    asyncio.run(_run_until_killed(sys.argv[1], sys.argv[2], sys.argv[3] == "1"))
