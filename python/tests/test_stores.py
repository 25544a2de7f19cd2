"""The stores an agent file's runs write (journal, session store, trace) are kept from the agent's
own tools, as ``agentloop run`` keeps them: named at ``Agent.from_file``, they are protected from
its built-in file tools, opened before its stdio MCP servers start (so the servers' views bind
them read-only) and held open until ``close()`` stops the servers. A store a run names that was
not named there, where the agent's tools may write, is warned about, not refused."""

from __future__ import annotations

import json
import pathlib
import sqlite3
import sys
import warnings
from typing import Any, Dict, Iterator, List

import pytest

from agentloop import Agent, AgentloopError, ToolCallRecord

ROOT = pathlib.Path(__file__).resolve().parents[2]
WRITE_SERVER = ROOT / "scripts/mcp/write_server.py"
SCRIPTED = 'name = "a"\n[model]\nprovider = "scripted"\nscript = "script.json"\n'


def agent_file(folder: pathlib.Path, tools: str, calls: List[Dict[str, Any]]) -> pathlib.Path:
    """An agent file in `folder` whose scripted model makes `calls` (if any) and then answers."""
    turns: List[Dict[str, Any]] = [{"tool_calls": calls}] if calls else []
    (folder / "script.json").write_text(json.dumps(turns + [{"text": "done"}]))
    path = folder / "agent.toml"
    path.write_text(SCRIPTED + tools)
    return path


def write_calls(tool: str, **paths: str) -> List[Dict[str, Any]]:
    """A call of `tool` writing junk to each path, its id the keyword's name."""
    return [{"id": id, "name": tool, "arguments": {"path": p, "content": "junk\n"}} for id, p in paths.items()]


def server(*at_exit: str) -> str:
    """The agent-file entry of `write_server.py` as stdio MCP server `w` (tool `w__write`): it
    writes in the agent file's folder; with `at_exit`, it tries those files when stopped."""
    command = [sys.executable, str(WRITE_SERVER)] + (["--at-exit", *at_exit] if at_exit else [])
    return f'\n[[mcp]]\nname = "w"\ncommand = {json.dumps(command)}\n\n[permissions]\nallow = ["w__write"]\n'


def from_file_confined(path: pathlib.Path, **stores: Any) -> Agent:
    """`Agent.from_file`, skipping the test where this system cannot keep files read-only for a
    server (the file is then refused at load, naming the way out)."""
    try:
        return Agent.from_file(path, **stores)
    except AgentloopError as e:
        if e.code == "agent_file.invalid" and "cannot keep" in str(e):
            pytest.skip("this system cannot keep files read-only for a process")
        raise


@pytest.fixture
def no_warnings() -> Iterator[None]:
    """Runs the test with every warning an error: a store named at `from_file` warns of nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def is_sqlite(path: pathlib.Path) -> bool:
    return path.read_bytes().startswith(b"SQLite format 3\0")


def one_session_turn(agent: Agent) -> Dict[str, ToolCallRecord]:
    """Runs one turn of session `s1` in the stores named at `from_file` (the run names none),
    closes the agent, and gives the run's tool calls by id."""
    try:
        out = agent.run("go", session="s1")
    finally:
        agent.close()
    assert out.stop_reason == "finished", out
    assert out.journal is not None and out.journal.endswith("j.db"), out
    return {c.id: c for c in out.tool_calls}


def assert_stores_whole(folder: pathlib.Path) -> None:
    assert is_sqlite(folder / "j.db") and is_sqlite(folder / "sessions.db")
    assert not (folder / "t.ndjson").read_text().startswith("junk")
    with sqlite3.connect(folder / "sessions.db") as db:
        assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1


def test_the_file_tools_cannot_rewrite_the_stores_named_at_from_file(
    tmp_path: pathlib.Path, no_warnings: None
) -> None:
    calls = write_calls("write_file", journal="j.db", sessions="sessions.db", trace="t.ndjson", own="notes.txt")
    path = agent_file(tmp_path, '[[tools]]\nbuiltin = "write_file"\n', calls)
    stores = {"journal": tmp_path / "j.db", "sessions": tmp_path / "sessions.db", "trace": tmp_path / "t.ndjson"}
    by_id = one_session_turn(Agent.from_file(path, **stores))
    for id in ["journal", "sessions", "trace"]:
        assert not by_id[id].ok, by_id[id]
        assert by_id[id].error is not None and by_id[id].error.code == "workspace.protected", by_id[id]
    assert by_id["own"].ok, by_id["own"]
    assert_stores_whole(tmp_path)


def test_an_mcp_server_cannot_rewrite_the_stores_named_at_from_file(
    tmp_path: pathlib.Path, no_warnings: None
) -> None:
    calls = write_calls(
        "w__write",
        trace="t.ndjson",
        sessions="sessions.db",
        # SQLite's rollback journal, which the next open would replay, and the lock folders.
        side="sessions.db-journal",
        locks="sessions.db.locks/planted.lock",
        owners="j.db.owners/planted.lock",
        journal="j.db",
        own="notes.txt",
    )
    path = agent_file(tmp_path, server(), calls)
    stores = {"journal": tmp_path / "j.db", "sessions": tmp_path / "sessions.db", "trace": tmp_path / "t.ndjson"}
    by_id = one_session_turn(from_file_confined(path, **stores))
    for id in ["trace", "sessions", "side", "locks", "owners", "journal"]:
        assert not by_id[id].ok, by_id[id]
        assert "Read-only file system" in json.dumps(by_id[id].output or "") + str(by_id[id].error), by_id[id]
    assert by_id["own"].ok, by_id["own"]
    assert_stores_whole(tmp_path)
    assert not (tmp_path / "sessions.db.locks/planted.lock").exists()


def test_the_stores_named_at_from_file_stay_open_until_close(tmp_path: pathlib.Path) -> None:
    # The server tries SQLite's side files of both stores as it is stopped: closed before it,
    # a store would have deleted them, and the server could write a -wal the next open replays.
    side = ["j.db-wal", "j.db-shm", "sessions.db-wal", "sessions.db-shm"]
    path = agent_file(tmp_path, server(*side), [])
    agent = from_file_confined(path, journal=tmp_path / "j.db", sessions=tmp_path / "sessions.db")
    try:
        out = agent.run("go", session="s1")
        assert out.stop_reason == "finished", out
        # A second run goes on in the same stores, opened once.
        again = agent.run("go", session="s1")
        assert again.stop_reason == "finished", again
    finally:
        agent.close()
    said = (tmp_path / "at-exit.txt").read_text()
    for name in side:
        assert f"{name} refused 30\n" in said, said
        assert not (tmp_path / name).exists() or not (tmp_path / name).read_bytes().startswith(b"junk")


def test_a_run_warns_of_a_store_in_the_agents_folder_not_named_at_from_file(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "agent"
    folder.mkdir()
    path = agent_file(folder, '[[tools]]\nbuiltin = "write_file"\n', [])
    agent = Agent.from_file(path)
    try:
        with pytest.warns(UserWarning, match="j.db") as caught:
            out = agent.run("go", journal=folder / "j.db")
        assert out.stop_reason == "finished", out
        said = str(caught[0].message)
        assert "Agent.from_file" in said and "journal=" in said, said
        # Outside the folder (and every tool's root), nothing to warn of.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = agent.run("go", journal=tmp_path / "j.db", session="s1", sessions=tmp_path / "s.db")
        assert out.stop_reason == "finished", out
    finally:
        agent.close()


def test_a_suspended_run_resumes_in_the_journal_named_at_from_file(
    tmp_path: pathlib.Path, no_warnings: None
) -> None:
    calls = write_calls("write_file", note="notes.txt")
    tools = '[[tools]]\nbuiltin = "write_file"\n\n[permissions]\nask = ["write_file"]\n'
    agent = Agent.from_file(agent_file(tmp_path, tools, calls), journal=tmp_path / "j.db")
    try:
        out = agent.run("go")
        assert out.stop_reason == "suspended", out
        [waiting] = out.pending_approvals
        Agent.answer(out.run_id or "", waiting["call_id"], True, journal=tmp_path / "j.db")
        resumed = agent.resume(out.run_id or "")
    finally:
        agent.close()
    assert resumed.stop_reason == "finished", resumed
    assert (tmp_path / "notes.txt").read_text() == "junk\n"
