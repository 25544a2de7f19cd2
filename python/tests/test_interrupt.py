"""Ctrl-C while the package waits for the runtime outside a run: ``Agent.from_file`` waiting for
an MCP server that never finishes its handshake raises ``KeyboardInterrupt`` at once (not after
the server's timeout), its server stopped before the program handles it; ``agent.close()``
waiting for a server that will not stop raises it too, the server still stopped. A fresh
interpreter gets the signal, as a program's user would send it.

Each child puts Python's own SIGINT handler back first. A process started with SIGINT ignored
(pytest run as a background job of a non-interactive shell, as a CI script may start it) passes
``SIG_IGN`` on to every process it starts, and Python leaves an inherited ``SIG_IGN`` alone: the
child would then never see the signal, whatever the package does."""

from __future__ import annotations

import inspect
import os
import pathlib
import signal
import subprocess
import sys
import time


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


# What each child runs first (`alive` is this module's own).
PRELUDE = """
import os, pathlib, signal, sys, time
from agentloop import Agent
# As an interactive program has it, whatever this process inherited (see the module's doc).
signal.signal(signal.SIGINT, signal.default_int_handler)
""" + inspect.getsource(alive) + """
def server_gone():
    # Said while this process still runs: a server that died with it would prove nothing.
    pid = int(pathlib.Path("server.pid").read_text())
    deadline = time.monotonic() + 8
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)
"""

# A child that does SETUP, then CALL, which Ctrl-C should interrupt: it says how long CALL took
# to raise KeyboardInterrupt, and whether the server is gone then.
CHILD = PRELUDE + """
SETUP
started = time.monotonic()
try:
    CALL
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s", flush=True)
    print(f"server gone: {server_gone()}", flush=True)
    sys.exit(0)
print("not interrupted", flush=True)
sys.exit(1)
"""

LOAD = CHILD.replace("SETUP", "").replace("CALL", "Agent.from_file(sys.argv[1])")
CLOSE = CHILD.replace("SETUP", "agent = Agent.from_file(sys.argv[1])").replace(
    "CALL", "agent.close()"
)

# A stdio MCP server that starts, says so, and never answers its handshake.
HANGS_IN_HANDSHAKE = """
import os, pathlib, time
pathlib.Path("server.pid").write_text(str(os.getpid()))
time.sleep(600)
"""

# A stdio MCP server that answers its handshake (the tests' own server, listing no tool), then
# will not stop: it ignores SIGTERM, and says when its stdin closes (the first step of a
# shutdown) before it sleeps on.
WONT_STOP = """
import os, pathlib, runpy, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path("server.pid").write_text(str(os.getpid()))
sys.argv = ["named_server.py", "stuck"]
runpy.run_path({server!r})
pathlib.Path("stopping").write_text("")
time.sleep(600)
"""


def interrupted(tmp_path: pathlib.Path, server: str, child_script: str, ready: str) -> str:
    """Runs `child_script` on an agent file whose one MCP server is `server`, sends it SIGINT once
    the file `ready` exists in `tmp_path`, and gives what it printed; the server is killed
    afterwards whatever happened, so that a failure leaves nothing behind."""
    (tmp_path / "server.py").write_text(server)
    (tmp_path / "script.json").write_text('[{"text": "done"}]')
    (tmp_path / "agent.toml").write_text(
        'name = "x"\n[model]\nprovider = "scripted"\nscript = "script.json"\n'
        f'[[mcp]]\nname = "stuck"\ncommand = ["{sys.executable}", "server.py"]\nsandbox = "off"\n'
        "timeout_secs = 120\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", child_script, str(tmp_path / "agent.toml")],
        # Not the source folder, whose package has no native module: the installed one.
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid_file = tmp_path / "server.pid"
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / ready).exists() or not pid_file.read_text():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, f"{ready} never appeared"
            time.sleep(0.05)
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert child.returncode == 0, (out, err)
    return out


def seconds(out: str) -> float:
    line = next(l for l in out.splitlines() if l.startswith("interrupted after"))
    return float(line.split()[2])


def test_ctrl_c_interrupts_from_file_while_an_mcp_server_hangs_in_its_handshake(tmp_path: pathlib.Path) -> None:
    out = interrupted(tmp_path, HANGS_IN_HANDSHAKE, LOAD, "server.pid")
    # At once, not after the server's two minutes.
    assert seconds(out) < 5, out
    # Its process is stopped with the wait, before the program goes on: not left to sleep out
    # its ten minutes.
    assert "server gone: True" in out, out


def test_ctrl_c_interrupts_close_while_an_mcp_server_will_not_stop(
    tmp_path: pathlib.Path, repo_root: pathlib.Path
) -> None:
    server = WONT_STOP.format(server=str(repo_root / "scripts/mcp/named_server.py"))
    out = interrupted(tmp_path, server, CLOSE, "stopping")
    # Before the stop's own bound (stdin closed, then SIGTERM: 5 s) runs out.
    assert seconds(out) < 3, out
    # The stopping goes on: the server is killed all the same.
    assert "server gone: True" in out, out
