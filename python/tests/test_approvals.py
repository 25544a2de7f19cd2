"""Approvals: a tool made with ask=True runs only when a person says so, through a Python
callback, or, in a journaled run with no callback, after the run suspended and the answer was
recorded."""

from __future__ import annotations

import asyncio
import pathlib
from typing import List, Tuple, Union

from agentloop import Agent, ApprovalRequest, RunOutcome, ScriptedModel, ToolCall, tool


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


def test_an_async_callback_is_awaited_on_the_runs_loop_and_its_answer_holds() -> None:
    deleted: List[str] = []
    loops: List[asyncio.AbstractEventLoop] = []

    async def approve(requests: List[ApprovalRequest]) -> List[Union[bool, str]]:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0.01)  # a person answering in a UI, elsewhere on the loop
        return [r.arguments == {"path": "a"} for r in requests]

    agent = deleting_agent(deleted, approve)
    out = agent.run("Clean up.")
    assert [c.status for c in out.tool_calls] == ["ok", "ok"], out.tool_calls
    assert deleted == ["a"]

    async def on_my_loop() -> Tuple[RunOutcome, asyncio.AbstractEventLoop]:
        return await agent.run_async("Clean up."), asyncio.get_running_loop()

    out, mine = asyncio.run(on_my_loop())
    assert [c.status for c in out.tool_calls] == ["ok", "ok"], out.tool_calls
    assert deleted == ["a", "a"]
    assert len(loops) == 2 and loops[1] is mine

    async def deny(requests: List[ApprovalRequest]) -> List[str]:
        return ["deny" for _ in requests]

    out = deleting_agent(deleted, deny).run("Clean up.")
    assert out.tool_calls[1].status == "denied"
    assert deleted == ["a", "a"]


def test_an_async_callback_that_raises_denies_with_its_error() -> None:
    deleted: List[str] = []

    async def approve(requests: List[ApprovalRequest]) -> List[bool]:
        await asyncio.sleep(0)
        raise RuntimeError("the approval service is down")

    for run in (
        lambda a: a.run("Clean up."),
        lambda a: asyncio.run(a.run_async("Clean up.")),
    ):
        out = run(deleting_agent(deleted, approve))
        assert out.stop_reason == "finished"
        delete = out.tool_calls[1]
        assert delete.status == "denied" and delete.error is not None
        assert "RuntimeError: the approval service is down" in delete.error.message
    assert deleted == []
