"""A journaled run resumed after its process was killed (SIGKILL, mid-call): a call in flight is
run again only if its tool is idempotent; otherwise the model reads that it was interrupted."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import durable_agent

HERE = pathlib.Path(__file__).resolve().parent


def kill_mid_call(journal: pathlib.Path, marker: pathlib.Path, idempotent: bool) -> str:
    """Starts the run in a child process, kills it once the tool is running; its run id."""
    child = subprocess.Popen(
        [sys.executable, str(HERE / "durable_agent.py"), str(journal), str(marker), "1" if idempotent else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text() == "ran\n"):
            assert child.poll() is None, "the child ended before it was killed"
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    assert run_id
    return run_id


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_run_killed_mid_call_resumes_in_another_process(tmp_path: pathlib.Path, idempotent: bool) -> None:
    journal, marker = tmp_path / "journal.db", tmp_path / "marker.txt"
    run_id = kill_mid_call(journal, marker, idempotent)
    durable_agent.HANG.clear()
    out = durable_agent.make_agent(str(marker), idempotent).resume(run_id, journal=journal)
    assert out.run_id == run_id
    assert out.stop_reason == "finished", out
    assert out.output == "All written."
    assert out.journal == str(journal)
    [call] = out.tool_calls
    if idempotent:
        # Run again, since running it twice is safe.
        assert call.ok and call.output == "written"
        assert marker.read_text() == "ran\nran\n"
    else:
        # Never run twice: the model reads that it was interrupted.
        assert call.error is not None and call.error.code == "interrupted"
        assert marker.read_text() == "ran\n"


def test_a_finished_run_is_not_resumed(tmp_path: pathlib.Path) -> None:
    journal, marker = tmp_path / "journal.db", tmp_path / "marker.txt"
    agent = durable_agent.make_agent(str(marker), idempotent=False)
    out = agent.run("Write the line.", journal=journal)
    assert out.stop_reason == "finished" and out.run_id
    from agentloop import AgentloopError

    with pytest.raises(AgentloopError) as e:
        agent.resume(out.run_id, journal=journal)
    assert e.value.code.startswith("journal.")
    assert marker.read_text() == "ran\n"
