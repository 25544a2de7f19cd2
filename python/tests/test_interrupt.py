"""Ctrl-C while the package waits for the runtime outside a run: ``Agent.from_file`` waiting for
an MCP server that never finishes its handshake raises ``KeyboardInterrupt`` at once (not after
the server's timeout), and the server's process is stopped with it. A fresh interpreter gets the
signal, as a program's user would send it."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

CHILD = """
import sys, time
from agentloop import Agent
print("loading", flush=True)
started = time.monotonic()
try:
    Agent.from_file(sys.argv[1])
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s", flush=True)
    sys.exit(0)
print("loaded", flush=True)
sys.exit(1)
"""

# A stdio MCP server that starts, says so, and never answers its handshake.
SERVER = """
import os, pathlib, time
pathlib.Path("server.pid").write_text(str(os.getpid()))
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not reaped yet) is gone all the same.
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_ctrl_c_interrupts_from_file_while_an_mcp_server_hangs_in_its_handshake(tmp_path: pathlib.Path) -> None:
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "script.json").write_text('[{"text": "done"}]')
    (tmp_path / "agent.toml").write_text(
        'name = "x"\n[model]\nprovider = "scripted"\nscript = "script.json"\n'
        f'[[mcp]]\nname = "hang"\ncommand = ["{sys.executable}", "server.py"]\nsandbox = "off"\n'
        "timeout_secs = 120\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "agent.toml")],
        # Not the source folder, whose package has no native module: the installed one.
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid_file = tmp_path / "server.pid"
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the server never started"
            time.sleep(0.05)
        server = int(pid_file.read_text())
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, (out, err)
    assert "interrupted after" in out, (out, err)
    # Its process is stopped with the wait, not left to sleep out its ten minutes.
    deadline = time.monotonic() + 10
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(server):
        os.kill(server, signal.SIGKILL)
        raise AssertionError("the MCP server outlived the interrupted from_file")
