"""The Python process is out of its tools' sight, as the CLI's is: once an agent file whose tools
start processes is loaded, a tool cannot read the process's environment (its API keys) through
``/proc/<pid>/environ``, even with ``sandbox = "off"``; importing the package, or running agents
whose tools start no process, leaves the process as it was (core dumps, debuggers).

Each test runs a fresh interpreter (``protect_child.py``): the secret must be in the environment
the process started with, and this process's own flag depends on what the other tests ran."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc and PR_SET_DUMPABLE are Linux's"
)

HERE = pathlib.Path(__file__).resolve().parent
#: The model of every agent file here: script.json, beside it.
SCRIPTED = '[model]\nprovider = "scripted"\nscript = "script.json"\n'
COMMAND = '[[tools]]\nname = "echo"\ndescription = "Echoes."\ncommand = ["cat"]\n'


@pytest.fixture
def folder() -> Iterator[pathlib.Path]:
    """A folder `nobody` can read (the child drops to it when run as root); pytest's own
    temporary folders are root's alone."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="agentloop-protect-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def agent_file(folder: pathlib.Path, tools: str, calls: Any) -> pathlib.Path:
    (folder / "script.json").write_text(json.dumps([{"tool_calls": calls}, {"text": "done"}]))
    path = folder / "agent.toml"
    path.write_text(f'name = "probe"\n{SCRIPTED}{tools}')
    return path


def child(mode: str, path: pathlib.Path, env: Dict[str, str]) -> Dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE / "protect_child.py"), mode, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report: Dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return report


def test_a_command_tool_cannot_read_the_key_of_the_python_process(folder: pathlib.Path) -> None:
    # Unsandboxed, and what the tool writes to stderr (a refusal) reaches stdout, which the
    # model reads. The tool's parent is the supervisor agentloop forks for each call (a copy of
    # the Python process, its environment included) and its grandparent the Python process: it
    # tries both; its pid line says whose environ it looked at last.
    path = agent_file(
        folder,
        '[[tools]]\nname = "peek"\ndescription = "Reads the parent\'s environment."\n'
        'sandbox = "off"\n'
        "command = [\"sh\", \"-c\", \"g=$(cut -d' ' -f4 /proc/$PPID/stat); "
        "for p in $PPID $g; do cat /proc/$p/environ 2>&1 | tr '\\\\0' '\\\\n'; done; "
        "echo pid=$g\"]\n",
        [{"id": "c1", "name": "peek", "arguments": {}}],
    )
    secret = "sk-agentloop-test-" + secrets.token_hex(12)
    report = child("peek", path, dict(os.environ, OPENAI_API_KEY=secret))
    read = report["read"]
    assert f"pid={report['pid']}" in read, read
    assert secret not in read, "the tool read the key from the Python process's environment"
    assert report["dumpable"] == 0


def test_importing_or_running_agents_without_process_tools_leaves_the_process_dumpable(
    folder: pathlib.Path,
) -> None:
    path = agent_file(
        folder,
        '[[tools]]\nbuiltin = "read_file"\n',
        [{"id": "c1", "name": "read_file", "arguments": {"path": "script.json"}}],
    )
    flags = child("quiet", path, dict(os.environ))
    assert flags == {
        "import": 1,
        "python_tools": 1,
        "file_without_processes": 1,
        # Asked for explicitly, it is protected.
        "protect_process": 0,
    }


@pytest.mark.parametrize(
    "tools, others, loads",
    [
        ('[[tools]]\nbuiltin = "shell"\nsandbox = "read-only"\n', {}, True),
        ('[[tools]]\nname = "helper"\ndescription = "Helps."\nagent = "sub.toml"\n', {"sub.toml": COMMAND}, True),
        ('[[handoffs]]\nagent = "desk.toml"\n', {"desk.toml": COMMAND}, True),
        # A stdio server that cannot start: the process was protected before it was tried.
        ('[[mcp]]\nname = "srv"\ncommand = ["false"]\ntimeout_secs = 5\n', {}, False),
    ],
    ids=["shell", "subagent", "handoff", "mcp"],
)
def test_every_way_an_agent_file_starts_processes_protects_on_load(
    folder: pathlib.Path, tools: str, others: Dict[str, str], loads: bool
) -> None:
    for name, body in others.items():
        (folder / name).write_text(f'name = "{name[:-5]}"\ndescription = "A desk."\n{SCRIPTED}{body}')
    path = agent_file(folder, tools, [])
    report = child("load", path, dict(os.environ))
    assert (report["error"] is None) == loads, report
    assert report["dumpable"] == 0, report
