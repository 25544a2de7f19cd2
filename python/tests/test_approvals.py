"""Approvals: a tool made with ask=True runs only when a person says so, through a Python
callback, or, in a journaled run with no callback, after the run suspended and the answer was
recorded."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import time
from typing import List, Tuple, Union

import pytest

from agentloop import (
    Agent,
    AgentloopError,
    ApprovalRequest,
    Limits,
    RunOutcome,
    ScriptedModel,
    ToolCall,
    tool,
)


def deleting_agent(deleted: List[str], approve=None, limits: Union[Limits, None] = None) -> Agent:
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
        name="cleaner",
        model=ScriptedModel([calls, "done"]),
        tools=[delete, look],
        approve=approve,
        limits=limits,
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


class FalsyApprover:
    """An approval callback that is a callable object false as a bool: a queue of a person's
    answers (``__len__``: how many wait), or an object with a ``__bool__`` of its own. Being
    falsy says nothing about being given."""

    def __init__(self, by: str) -> None:
        self.by = by
        self.asked: List[str] = []

    def __call__(self, requests: List[ApprovalRequest]) -> List[bool]:
        self.asked.extend(r.call_id for r in requests)
        return [True for _ in requests]

    def __bool__(self) -> bool:
        if self.by == "__bool__":
            return False
        return len(self) > 0

    def __len__(self) -> int:
        return 0


def test_a_falsy_callable_is_an_approval_callback_all_the_same(tmp_path: pathlib.Path) -> None:
    for by in ("__bool__", "__len__"):
        approver = FalsyApprover(by)
        assert not approver
        deleted: List[str] = []
        out = deleting_agent(deleted, approver).run("Clean up.")
        assert approver.asked == ["c2"], by
        assert [c.status for c in out.tool_calls] == ["ok", "ok"], (by, out.tool_calls)
        assert deleted == ["a"]

    # An agent file's permissions ask it too.
    (tmp_path / "agent.toml").write_text(
        'name = "cleaner"\n[model]\nprovider = "scripted"\nscript = "script.json"\n'
        '[[tools]]\nname = "delete"\ndescription = "Deletes a file."\n'
        'command = ["python3", "-c", "print(\'deleted\')"]\n'
        'input_schema = { type = "object", properties = { path = { type = "string" } } }\n'
        '[permissions]\nask = ["delete"]\n'
    )
    calls = [{"id": "c1", "name": "delete", "arguments": {"path": "b"}}]
    (tmp_path / "script.json").write_text(json.dumps([{"tool_calls": calls}, {"text": "done"}]))
    approver = FalsyApprover("__len__")
    agent = Agent.from_file(tmp_path / "agent.toml", approve=approver)
    out = agent.run("Clean up.")
    agent.close()
    assert approver.asked == ["c1"]
    assert [c.status for c in out.tool_calls] == ["ok"], out.tool_calls
    assert "deleted" in str(out.tool_calls[0].output)


def test_falsy_limits_still_bound_the_run() -> None:
    @dataclasses.dataclass(frozen=True)
    class NamedLimits(Limits):
        """Limits with a label, empty (falsy) when it has none."""

        label: str = ""

        def __len__(self) -> int:
            return len(self.label)

    limits = NamedLimits(max_turns=1)
    assert not limits
    script = ScriptedModel([[ToolCall("look", {"path": "a"})], [ToolCall("look", {"path": "b"})], "done"])

    @tool
    def look(path: str) -> str:
        """Looks at a file."""
        return "a file"

    out = Agent(model=script, tools=[look], limits=limits).run("Look.")
    assert out.stop_reason == "max_turns", out


def test_a_question_of_the_model_takes_a_reply_not_an_approval(tmp_path: pathlib.Path) -> None:
    # The `ask_user` built-in: a journaled run suspends on the question. An approval word is no
    # reply (it used to be recorded, and the resumed run asked again, for ever); a reply is
    # checked against the question's schema, then the resumed run hands it to the model.
    (tmp_path / "agent.toml").write_text(
        'name = "asker"\n[model]\nprovider = "scripted"\nscript = "script.json"\n'
        '[[tools]]\nbuiltin = "ask_user"\n'
    )
    question = {"question": "Which colour?", "schema": {"enum": ["red", "green"]}}
    script = [{"tool_calls": [{"id": "q1", "name": "ask_user", "arguments": question}]}, {"text": "Painting it."}]
    (tmp_path / "script.json").write_text(json.dumps(script))
    journal = tmp_path / "journal.db"
    agent = Agent.from_file(tmp_path / "agent.toml", approve=lambda requests: [True for _ in requests])
    try:
        out = agent.run("Paint it.", journal=journal)
        assert out.stop_reason == "suspended", out.raw
        assert out.run_id is not None
        [pending] = out.pending_approvals
        assert pending["call_id"] == "q1" and pending["question"]["text"] == "Which colour?", pending
        with pytest.raises(AgentloopError) as refused:
            Agent.answer(out.run_id, "q1", True, journal=journal)
        assert refused.value.code == "approval.invalid"
        assert "is a question" in refused.value.message
        with pytest.raises(AgentloopError) as wrong:
            Agent.reply(out.run_id, "q1", "blue", journal=journal)
        assert wrong.value.code == "answer.invalid", wrong.value
        Agent.reply(out.run_id, "q1", "green", journal=journal)
        resumed = agent.resume(out.run_id, journal=journal)
    finally:
        agent.close()
    assert resumed.stop_reason == "finished", resumed.raw
    assert resumed.output == "Painting it."
    [asked] = resumed.tool_calls
    assert asked.status == "ok" and "green" in str(asked.output), asked


def test_a_suspended_runs_wait_counts_toward_its_deadline(tmp_path: pathlib.Path) -> None:
    # As in the CLI: the time a run waited for its answer is the run's. Resumed past its
    # deadline it stops there, the call it waited on not run (answered or not), rather than
    # going on (answered) or being refused for the unanswered call.
    journal = tmp_path / "journal.db"
    deleted: List[str] = []
    limits = Limits(timeout=1.0)
    unanswered = deleting_agent(deleted, limits=limits).run("Clean up.", journal=journal)
    answered = deleting_agent(deleted, limits=limits).run("Clean up.", journal=journal)
    assert unanswered.stop_reason == answered.stop_reason == "suspended"
    assert unanswered.run_id is not None and answered.run_id is not None
    Agent.answer(answered.run_id, "c2", True, journal=journal)
    time.sleep(1.2)
    for run_id in (unanswered.run_id, answered.run_id):
        resumed = deleting_agent(deleted, limits=limits).resume(run_id, journal=journal)
        assert resumed.stop_reason == "deadline", resumed.raw
    assert deleted == []
