"""The child process of test_protect.py: a fresh interpreter, so that the secret is in the
environment it started with (what ``/proc/<pid>/environ`` shows: a variable set later inside a
running process never appears there) and so that nothing the other tests did has changed its
dumpable flag. Prints one JSON object.

``protect_child.py peek AGENT_FILE``: runs the agent file, whose command tool reads this
process's environment through ``/proc/$PPID/environ``; prints what the tool read, this
process's pid and its dumpable flag after the run.

``protect_child.py quiet AGENT_FILE``: the dumpable flag after importing the package, after a
run of an agent of Python tools, after loading and running AGENT_FILE (an agent file whose tools
start no process), and after ``agentloop.protect_process()``.

``protect_child.py load AGENT_FILE``: the dumpable flag after loading AGENT_FILE, and the code
of the error loading it raised, if any.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

# Imported before this process may become `nobody` (below): the package lives under root's home.
import agentloop
from agentloop import Agent, ScriptedModel, ToolCall, tool

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
LIBC = ctypes.CDLL(None, use_errno=True)


def dumpable() -> int:
    return int(LIBC.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))


def become_an_ordinary_user() -> None:
    """Run as root (as CI is), a tool whose capabilities were dropped is refused its root
    parent's environ anyway; as an ordinary user only the parent's dumpable flag stands between
    them, which is what is tested. So root becomes `nobody`, then dumpable again (a change of
    user clears the flag): the state of an ordinary user's process. As agentloop-sandbox's
    tests/parent.rs does."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
    if LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 1)")


def peek(agent_file: str) -> None:
    become_an_ordinary_user()
    agent = Agent.from_file(agent_file)
    try:
        out = agent.run("Read it.")
    finally:
        agent.close()
    [call] = out.tool_calls
    read = call.output if call.ok else (call.error.message if call.error else "")
    print(json.dumps({"pid": os.getpid(), "read": str(read), "dumpable": dumpable()}))


def quiet(agent_file: str) -> None:
    flags = {"import": dumpable()}

    @tool
    def noop() -> str:
        """Does nothing."""
        return "ok"

    Agent(model=ScriptedModel([[ToolCall("noop", {})], "done"]), tools=[noop]).run("Go.")
    flags["python_tools"] = dumpable()
    agent = Agent.from_file(agent_file)
    try:
        agent.run("Go.")
    finally:
        agent.close()
    flags["file_without_processes"] = dumpable()
    agentloop.protect_process()
    flags["protect_process"] = dumpable()
    print(json.dumps(flags))


def load(agent_file: str) -> None:
    code = None
    try:
        Agent.from_file(agent_file).close()
    except agentloop.AgentloopError as e:
        code = e.code
    print(json.dumps({"dumpable": dumpable(), "error": code}))


if __name__ == "__main__":
    {"peek": peek, "quiet": quiet, "load": load}[sys.argv[1]](sys.argv[2])
