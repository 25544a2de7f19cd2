"""Approvals: a tool made with ask=True runs only when a person says so, through a Python
callback, or, in a journaled run with no callback, after the run suspended and the answer was
recorded."""

from __future__ import annotations

import pathlib
from typing import List

from agentloop import Agent, ApprovalRequest, ScriptedModel, ToolCall, tool


def deleting_agent(deleted: List[str], approve=None) -> Agent:
    @tool(ask=True)
    def delete(path: str) -> str:
        """Deletes a file."""
        deleted.append(path)
        return "deleted"

    @tool
    def look(path: str) -> str:
        """Looks at a file."""
        return "a file"

    calls = [ToolCall("look", {"path": "a"}, id="c1"), ToolCall("delete", {"path": "a"}, id="c2")]
    return Agent(
        name="cleaner", model=ScriptedModel([calls, "done"]), tools=[delete, look], approve=approve
    )


def test_the_callback_is_asked_about_the_calls_that_ask_only() -> None:
    deleted: List[str] = []
    asked: List[ApprovalRequest] = []

    def approve(requests: List[ApprovalRequest]) -> List[bool]:
        asked.extend(requests)
        return [False for _ in requests]

    out = deleting_agent(deleted, approve).run("Clean up.")
    assert [(r.call_id, r.tool, r.arguments) for r in asked] == [("c2", "delete", {"path": "a"})]
    look, delete = out.tool_calls
    assert look.ok
    assert delete.status == "denied" and delete.error is not None and delete.error.code == "denied"
    assert deleted == []


def test_without_a_callback_a_journaled_run_suspends_until_the_answer_is_recorded(
    tmp_path: pathlib.Path,
) -> None:
    deleted: List[str] = []
    journal = tmp_path / "journal.db"
    agent = deleting_agent(deleted)
    out = agent.run("Clean up.", journal=journal)
    assert out.stop_reason == "suspended"
    assert [p["call_id"] for p in out.pending_approvals] == ["c2"]
    assert deleted == []
    assert out.run_id is not None
    Agent.answer(out.run_id, "c2", True, journal=journal)
    resumed = agent.resume(out.run_id, journal=journal)
    assert resumed.stop_reason == "finished"
    assert deleted == ["a"]
    assert [c.ok for c in resumed.tool_calls] == [True, True]


def test_without_a_callback_or_journal_the_call_is_denied() -> None:
    deleted: List[str] = []
    out = deleting_agent(deleted).run("Clean up.")
    assert out.tool_calls[1].status == "denied"
    assert deleted == []
