"""Runs: limits and stop reasons, cancellation, streamed events, sessions, agent files and the
errors' codes."""

from __future__ import annotations

import _thread
import asyncio
import copy
import dataclasses
import json
import logging
import pathlib
import pickle
import signal
import sqlite3
import threading
import time
from typing import Any, List, Tuple

import pytest

from agentloop import (
    Agent,
    AgentloopError,
    Event,
    FatalToolError,
    FunctionModel,
    Limits,
    ModelRequest,
    RunOutcome,
    RunStopped,
    ScriptedModel,
    SessionNotSaved,
    ToolCall,
    ToolCallRecord,
    ToolError,
    tool,
)


@tool
def noop(n: int) -> str:
    """Does nothing."""
    return "ok"


def forever(request: ModelRequest):
    """A model that never stops calling tools."""
    turn = len([m for m in request.messages if m.get("role") == "assistant"])
    return [ToolCall("noop", {"n": turn}, id=f"c{turn}")]


def test_max_turns_stops_the_run_and_keeps_what_it_did() -> None:
    out = Agent(model=FunctionModel(forever), tools=[noop], limits=Limits(max_turns=3)).run("Go.")
    assert out.stop_reason == "max_turns"
    assert out.answered_by == "agent"
    assert out.limit is not None and out.limit.limit == "max_turns" and out.limit.bound == 3
    assert out.turns == 3
    # Every call the model made has its result: the last turn's was refused, since no model call
    # would read it.
    assert [(c.id, c.status) for c in out.tool_calls] == [("c0", "ok"), ("c1", "ok"), ("c2", "refused")]
    assert out.tool_calls[2].error is not None and out.tool_calls[2].error.code == "limit.max_turns"
    with pytest.raises(RunStopped) as e:
        out.raise_for_stop()
    assert e.value.code == "limit.reached"
    assert e.value.outcome is out


def test_max_tool_calls_refuses_the_calls_past_the_bound() -> None:
    calls = [ToolCall("noop", {"n": i}) for i in range(3)]
    out = Agent(
        model=ScriptedModel([calls, "done"]), tools=[noop], limits=Limits(max_tool_calls=2)
    ).run("Go.")
    assert out.stop_reason == "max_tool_calls"
    assert [c.ok for c in out.tool_calls].count(True) <= 2


def test_the_default_limits_bound_every_run() -> None:
    out = Agent(model=FunctionModel(forever), tools=[noop]).run("Go.")
    assert out.stop_reason in ("max_turns", "max_model_calls", "max_tool_calls", "stuck_loop")


def test_a_stuck_loop_is_stopped() -> None:
    same = FunctionModel(lambda r: [ToolCall("noop", {"n": 1})])
    out = Agent(model=same, tools=[noop]).run("Go.")
    assert out.stop_reason == "stuck_loop"


def test_a_deadline_stops_a_slow_tool() -> None:
    @tool
    async def slow() -> str:
        """Takes a minute."""
        await asyncio.sleep(60)
        return "late"

    out = Agent(
        model=ScriptedModel([[ToolCall("slow", {})], "never"]), tools=[slow], limits=Limits(timeout=0.3)
    ).run("Go.")
    assert out.stop_reason == "deadline"
    [call] = out.tool_calls
    assert call.status == "cancelled"


def test_a_tool_timeout_is_an_error_the_model_reads() -> None:
    @tool(timeout=0.2)
    async def slow() -> str:
        """Takes a minute."""
        await asyncio.sleep(60)
        return "late"

    out = Agent(model=ScriptedModel([[ToolCall("slow", {})], "it timed out"]), tools=[slow]).run("Go.")
    assert out.stop_reason == "finished"
    [call] = out.tool_calls
    assert call.error is not None and call.error.code == "timeout"


def test_limits_and_timeouts_hold_in_a_run_on_the_callers_loop() -> None:
    # run_async drives the run on the loop's own thread: the runtime's timers must still fire.
    @tool
    async def slow() -> str:
        """Takes a minute."""
        await asyncio.sleep(60)
        return "late"

    @tool(timeout=0.2)
    async def bounded() -> str:
        """Takes a minute, bounded to 0.2 s."""
        await asyncio.sleep(60)
        return "late"

    async def main() -> Tuple[RunOutcome, RunOutcome]:
        deadline = Agent(
            model=ScriptedModel([[ToolCall("slow", {})], "never"]), tools=[slow], limits=Limits(timeout=0.3)
        )
        timeout = Agent(model=ScriptedModel([[ToolCall("bounded", {})], "it timed out"]), tools=[bounded])
        return await deadline.run_async("Go."), await timeout.run_async("Go.")

    late, timed_out = asyncio.run(main())
    assert late.stop_reason == "deadline" and late.tool_calls[0].status == "cancelled"
    assert timed_out.stop_reason == "finished", timed_out
    [call] = timed_out.tool_calls
    assert call.error is not None and call.error.code == "timeout"


def test_a_run_on_the_callers_loop_calls_its_model_there_and_never_blocks_it() -> None:
    threads: dict = {}

    def model(request: ModelRequest):
        threads.setdefault("model", set()).add(threading.get_ident())
        return "done" if request.last_tool_results() else [ToolCall("where", {}, id="c1")]

    @tool
    def where() -> str:
        """Says where it runs."""
        threads["tool"] = threading.get_ident()
        return "here"

    async def slow_model(request: ModelRequest) -> str:
        await asyncio.sleep(0.3)
        return "slow but done"

    async def main() -> Tuple[RunOutcome, int]:
        threads["loop"] = threading.get_ident()
        out = await Agent(model=model, tools=[where]).run_async("Go.")
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        slow = await Agent(model=slow_model).run_async("Go.")
        ticker.cancel()
        assert slow.output == "slow but done"
        return out, ticks

    out, ticks = asyncio.run(main())
    assert out.output == "done" and out.tool_calls[0].output == "here"
    # The function model is a plain call on the loop's thread; a sync tool still runs on the pool.
    assert threads["model"] == {threads["loop"]}
    assert threads["tool"] != threads["loop"]
    # An async function model's 0.3 s on the caller's loop left that loop running.
    assert ticks >= 10


def test_an_outcomes_tool_call_records_are_the_dataclass_field_for_field() -> None:
    out = Agent(
        model=ScriptedModel([[ToolCall("noop", {"n": 1}, id="c1")], "done"]), tools=[noop]
    ).run("Go.")
    [call] = out.tool_calls
    made = ToolCallRecord(**{f.name: getattr(call, f.name) for f in dataclasses.fields(ToolCallRecord)})
    assert call == made and repr(call) == repr(made) and vars(call) == vars(made)
    assert (call.id, call.tool, call.input, call.ok, call.status, call.output) == (
        "c1", "noop", {"n": 1}, True, "ok", "ok"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.status = "changed"  # type: ignore[misc]


def hanging_agent() -> Tuple[Agent, threading.Event, List[bool]]:
    """An agent whose one tool call waits until it is cancelled; the call's start, and a record
    of its cancellation."""
    started = threading.Event()
    cancelled: List[bool] = []

    @tool
    async def hang() -> str:
        """Waits forever."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    return Agent(model=ScriptedModel([[ToolCall("hang", {})], "never"]), tools=[hang]), started, cancelled


def test_cancelling_the_task_cancels_the_run_and_its_running_tool() -> None:
    agent, started, cancelled = hanging_agent()

    async def main() -> None:
        task = asyncio.ensure_future(agent.run_async("Go."))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cancelled == [True]


def test_streaming_yields_the_runs_events_in_order_then_the_outcome() -> None:
    agent = Agent(
        model=ScriptedModel([[ToolCall("noop", {"n": 1}, id="c1")], "The answer."]), tools=[noop]
    )

    async def main():
        stream = agent.stream("Go.")
        events: List[Event] = [e async for e in stream]
        return events, stream.outcome

    events, outcome = asyncio.run(main())
    types = [e.type for e in events]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert types.index("tool_started") < types.index("tool_finished")
    assert "".join(e.text or "" for e in events if e.type == "text_delta") == "The answer."
    assert {e.run_id for e in events} == {outcome.run_id}
    assert outcome is not None and outcome.stop_reason == "finished"


def test_honest5_a_stream_read_slowly_holds_its_run_and_loses_no_event() -> None:
    # A reader that takes nothing for a while: the run waits once 1024 events wait for it
    # (its tool calls stop well before its end), instead of queueing every event; once read,
    # every call's events are there.
    turns = 1000
    counted: List[int] = []

    @tool
    def count(n: int) -> str:
        """Counts."""
        counted.append(n)
        return "ok"

    script: List[Any] = [[ToolCall("count", {"n": n}, id=f"c{n}")] for n in range(turns)]
    agent = Agent(
        model=ScriptedModel(script + ["done"]),
        tools=[count],
        limits=Limits(max_turns=turns + 5, max_tool_calls=turns + 5, max_model_calls=turns + 5),
    )

    async def main() -> Tuple[int, List[Event], Any]:
        stream = agent.stream("Go.")
        events = stream.__aiter__()
        first = await events.__anext__()
        await asyncio.sleep(2)
        held = len(counted)
        await asyncio.sleep(0.5)
        assert len(counted) == held, "the run went on"
        rest = [e async for e in events]
        return held, [first] + rest, stream.outcome

    held, events, outcome = asyncio.run(main())
    assert held < turns // 2, f"{held} of {turns} calls ran while nobody read their events"
    assert outcome is not None and outcome.stop_reason == "finished"
    assert len(counted) == turns
    assert len([e for e in events if e.type == "tool_finished"]) == turns
    assert events[0].type == "run_started" and events[-1].type == "run_finished"


def test_leaving_a_stream_early_cancels_the_run() -> None:
    agent, started, cancelled = hanging_agent()

    async def main() -> None:
        async for event in agent.stream("Go."):
            if event.type == "tool_started":
                # The event comes before the coroutine's first line runs: leave once the tool
                # is really running, so that its cancellation is what is checked.
                while not started.is_set():
                    await asyncio.sleep(0.01)
                break

    asyncio.run(main())
    assert cancelled == [True]


def test_a_session_carries_the_conversation_by_name(tmp_path: pathlib.Path) -> None:
    seen: List[int] = []

    def answer(request: ModelRequest):
        seen.append(len([m for m in request.messages if m.get("role") == "user"]))
        return f"answer {len(seen)}"

    agent = Agent(model=FunctionModel(answer))
    store = tmp_path / "sessions.db"
    first = agent.run("Hello.", session="alice", sessions=store)
    second = agent.run("Again.", session="alice", sessions=store)
    other = agent.run("Hi.", session="bob", sessions=store)
    assert [first.output, second.output, other.output] == ["answer 1", "answer 2", "answer 3"]
    assert seen == [1, 2, 1]


def test_a_session_turn_that_cannot_be_saved_keeps_its_outcome(tmp_path: pathlib.Path) -> None:
    # The run happened (its tool ran, its spend is real) though its session could not be
    # written: its outcome is reachable from the error, as the CLI prints it (review D5).
    ran: List[str] = []

    @tool
    def get_weather(city: str) -> str:
        """The temperature of a city."""
        ran.append(city)
        return "18"

    agent = Agent(
        model=ScriptedModel([[ToolCall("get_weather", {"city": "Paris"}, id="w")], "18 degrees in Paris."]),
        tools=[get_weather],
    )
    store = tmp_path / "sessions.db"
    assert agent.run("Weather?", session="other", sessions=store).stop_reason == "finished"
    # From now on every write of a session fails, as on a full disk: the real store's own write,
    # refused by SQLite.
    db = sqlite3.connect(store)
    db.execute(
        "CREATE TRIGGER full BEFORE INSERT ON sessions "
        "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )
    db.commit()
    db.close()

    def check(e: SessionNotSaved) -> None:
        assert isinstance(e, AgentloopError) and e.code == "session.io", e
        assert "could not be saved" in e.message and "database or disk is full" in e.message, e
        out = e.outcome
        assert out.stop_reason == "finished" and out.error is None, out
        assert out.output == "18 degrees in Paris."
        assert out.turns == 2 and out.model_calls == 2
        assert [(c.tool, c.status) for c in out.tool_calls] == [("get_weather", "ok")]
        copied = pickle.loads(pickle.dumps(e))
        assert type(copied) is SessionNotSaved and copied.outcome == out and copied.code == e.code

    with pytest.raises(SessionNotSaved) as blocking:
        agent.run("Weather in Paris?", session="trip", sessions=store)
    check(blocking.value)

    async def both() -> Tuple[SessionNotSaved, SessionNotSaved, Any]:
        with pytest.raises(SessionNotSaved) as awaited:
            await agent.run_async("Weather in Paris?", session="trip", sessions=store)
        stream = agent.stream("Weather in Paris?", session="trip", sessions=store)
        with pytest.raises(SessionNotSaved) as streamed:
            async for _ in stream:
                pass
        return awaited.value, streamed.value, stream.outcome

    awaited, streamed, stream_outcome = asyncio.run(both())
    check(awaited)
    check(streamed)
    assert stream_outcome == streamed.outcome
    assert ran == ["Paris"] * 4
    # The stored conversation lacks those turns.
    db = sqlite3.connect(store)
    assert [r[0] for r in db.execute("SELECT id FROM sessions")] == ["other"]
    db.close()


def test_an_agent_file_runs_as_the_cli_runs_it(repo_root: pathlib.Path) -> None:
    agent = Agent.from_file(repo_root / "examples/quickstart/agent.toml")
    out = agent.run("Compare the weather in Paris and Lisbon, in Fahrenheit.")
    agent.close()
    assert agent.name == "weather"
    assert out.stop_reason == "finished", out
    assert [c.tool for c in out.tool_calls][:2] == ["get_weather", "get_weather"]
    assert out.tool_calls[0].ok and out.tool_calls[1].ok
    assert out.output is not None and "73.4" in out.output
    assert out.usage.input_tokens > 0


def test_each_run_of_a_scripted_agent_starts_the_script_over(repo_root: pathlib.Path) -> None:
    agent = Agent(model=ScriptedModel([[ToolCall("noop", {"n": 1})], "done"]), tools=[noop])
    first, second = agent.run("Go."), agent.run("Again.")
    for out in (first, second):
        assert out.stop_reason == "finished" and out.output == "done", out
        assert [c.tool for c in out.tool_calls] == ["noop"]

    async def at_once() -> List[RunOutcome]:
        return list(await asyncio.gather(*(agent.run_async(f"Run {i}.") for i in range(4))))

    for out in asyncio.run(at_once()):
        assert out.output == "done" and [c.tool for c in out.tool_calls] == ["noop"], out

    # An agent file's script too, as each `agentloop run` of the file starts it.
    weather = Agent.from_file(repo_root / "examples/quickstart/agent.toml")
    outputs = [weather.run("Paris and Lisbon, in Fahrenheit?").output for _ in range(2)]
    weather.close()
    assert all(o is not None and "73.4" in o for o in outputs), outputs


def test_errors_carry_the_runtimes_codes(tmp_path: pathlib.Path) -> None:
    with pytest.raises(AgentloopError) as e:
        Agent.from_file(tmp_path / "missing.toml")
    assert e.value.code == "agent_file.unreadable"
    bad = tmp_path / "agent.toml"
    bad.write_text('name = "x"\n[model]\nprovider = "nope"\n')
    with pytest.raises(AgentloopError) as e:
        Agent.from_file(bad)
    assert e.value.code == "agent_file.invalid"
    with pytest.raises(AgentloopError) as e:
        Agent(model=ScriptedModel([]), limits=Limits(max_cost_usd=1.0))
    assert e.value.code == "config.unpriced_model"
    agent = Agent(model=ScriptedModel(["hi"]))
    with pytest.raises(AgentloopError) as e:
        agent.resume("no-such-run", journal=tmp_path / "journal.db")
    assert e.value.code.startswith("journal.")


def test_a_failed_model_fails_the_run_with_its_code() -> None:
    def broken(request: ModelRequest):
        raise RuntimeError("the model fell over")

    out = Agent(model=FunctionModel(broken)).run("Hi.")
    assert out.stop_reason == "failed"
    assert out.error is not None and "the model fell over" in out.error.message
    with pytest.raises(RunStopped) as e:
        out.raise_for_stop()
    assert e.value.code == out.error.code


def test_a_trace_file_records_the_run(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trace.ndjson"
    agent = Agent(model=ScriptedModel([[ToolCall("noop", {"n": 1}, id="c1")], "done"]), tools=[noop])
    out = agent.run("Go.", trace=path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records, "the trace is empty"
    assert {r.get("run_id") for r in records if "run_id" in r} == {out.run_id}
    assert any(r.get("tool") == "noop" or r.get("name") == "noop" for r in records), records


def test_an_async_function_is_a_model_and_its_answers_drive_the_run() -> None:
    seen: List[int] = []

    async def model(request: ModelRequest):
        # A real await: the answer comes from the package's event loop.
        await asyncio.sleep(0)
        results = request.last_tool_results()
        seen.append(len(results))
        if not results:
            return [ToolCall("noop", {"n": 1}, id="c1")]
        return "done: " + json.dumps(results[0]["content"])

    out = Agent(model=model, tools=[noop]).run("Go.")
    assert out.stop_reason == "finished", out
    assert out.output is not None and out.output.startswith("done: ") and "ok" in out.output
    assert seen == [0, 1]

    async def greeting(request: ModelRequest) -> str:
        await asyncio.sleep(0)
        return f"hello after {len(request.messages)} message(s)"

    async def inside() -> str:
        out = await Agent(model=FunctionModel(greeting)).run_async("Hi.")
        return str(out.output)

    # From a running event loop too: the model's coroutine runs on that loop.
    assert asyncio.run(inside()) == "hello after 1 message(s)"


def test_an_agent_file_takes_python_tools_beside_its_own(tmp_path: pathlib.Path) -> None:
    (tmp_path / "agent.toml").write_text(
        'name = "mixed"\n[model]\nprovider = "scripted"\nscript = "script.json"\n'
        '[[tools]]\nname = "echo"\ndescription = "Echoes its input."\n'
        'command = ["python3", "-c", "import sys; print(sys.stdin.read())"]\n'
        'input_schema = { type = "object", properties = { text = { type = "string" } } }\n'
    )
    calls = [
        {"id": "a", "name": "echo", "arguments": {"text": "hi"}},
        {"id": "b", "name": "shout", "arguments": {"text": "hi"}},
    ]
    (tmp_path / "script.json").write_text(json.dumps([{"tool_calls": calls}, {"text": "done"}]))

    @tool
    def shout(text: str) -> str:
        """Says it louder."""
        return text.upper()

    agent = Agent.from_file(tmp_path / "agent.toml", tools=[shout])
    out = agent.run("Go.")
    agent.close()
    assert out.stop_reason == "finished", out
    assert [c.tool for c in out.tool_calls] == ["echo", "shout"]
    assert all(c.ok for c in out.tool_calls), out.tool_calls
    assert "hi" in str(out.tool_calls[0].output)
    assert out.tool_calls[1].output == "HI"

    @tool(ask=True)
    def risky() -> str:
        """Asks."""
        return "no"

    with pytest.raises(AgentloopError) as refused:
        Agent.from_file(tmp_path / "agent.toml", tools=[risky])
    assert refused.value.code == "agent_file.invalid"


def test_an_agent_files_permissions_govern_the_python_tools_beside_it(tmp_path: pathlib.Path) -> None:
    # The file declares no tools of its own; its permissions ask about the Python tool and
    # deny it a path.
    (tmp_path / "agent.toml").write_text(
        'name = "cleaner"\n[model]\nprovider = "scripted"\nscript = "script.json"\n'
        '[permissions]\nask = ["remove"]\n'
        '[[permissions.rules]]\ntool = "remove"\npermission = "deny"\n'
        'path_glob = { field = "path", glob = "secrets/**" }\n'
    )
    calls = [
        {"id": "a", "name": "remove", "arguments": {"path": "notes.txt"}},
        {"id": "b", "name": "remove", "arguments": {"path": "secrets/key"}},
    ]
    (tmp_path / "script.json").write_text(json.dumps([{"tool_calls": calls}, {"text": "done"}]))
    removed: List[str] = []
    asked: List[str] = []

    @tool
    def remove(path: str) -> str:
        """Removes a file."""
        removed.append(path)
        return "removed"

    def approve(requests: List[Any]) -> List[bool]:
        asked.extend(r.call_id for r in requests)
        return [True for _ in requests]

    agent = Agent.from_file(tmp_path / "agent.toml", tools=[remove], approve=approve)
    out = agent.run("Clean up.")
    agent.close()
    assert out.stop_reason == "finished", out
    assert asked == ["a"]
    assert [c.status for c in out.tool_calls] == ["ok", "denied"], out.tool_calls
    assert removed == ["notes.txt"]

    # A rule on an argument the Python tool does not take is refused when the file loads.
    (tmp_path / "agent.toml").write_text(
        (tmp_path / "agent.toml").read_text().replace('field = "path"', 'field = "file"')
    )
    with pytest.raises(AgentloopError) as refused:
        Agent.from_file(tmp_path / "agent.toml", tools=[remove])
    assert refused.value.code == "agent_file.invalid"
    assert "file" in str(refused.value)


def test_errors_survive_pickling_and_copying_with_their_code() -> None:
    # As multiprocessing, a process pool or a task queue sends them, and copy.deepcopy copies them.
    outcome = Agent(model=FunctionModel(forever), tools=[noop], limits=Limits(max_turns=1)).run("Go.")
    with pytest.raises(RunStopped) as stopped:
        outcome.raise_for_stop()
    errors = [AgentloopError("journal.unknown_run", "no run abc"), ToolError("unknown_city", "no such city"), stopped.value]
    for e in errors:
        for copied in (pickle.loads(pickle.dumps(e)), copy.deepcopy(e), copy.copy(e)):
            assert type(copied) is type(e)
            assert (copied.code, copied.message, str(copied)) == (e.code, e.message, str(e))
    copied_stop = pickle.loads(pickle.dumps(stopped.value))
    assert copied_stop.outcome == outcome and copied_stop.outcome.stop_reason == "max_turns"


def test_async_function_models_of_blocking_runs_never_hold_the_runtimes_threads() -> None:
    # Blocking runs (from threads) whose async model takes its time: a run beside them goes on.
    release = threading.Event()

    async def slow(request: ModelRequest) -> str:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return "slow"

    outputs: List[object] = []
    slow_runs = [threading.Thread(target=lambda: outputs.append(Agent(model=slow).run("Go.").output)) for _ in range(3)]
    for t in slow_runs:
        t.start()
    # Should the quick run wait for them, they end anyway (the test fails rather than hangs).
    threading.Timer(5, release.set).start()
    try:
        time.sleep(0.3)
        started = time.monotonic()
        quick = Agent(model=ScriptedModel(["quick"]), limits=Limits(timeout=10)).run("Go.")
        assert quick.output == "quick"
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
        for t in slow_runs:
            t.join()
    assert outputs == ["slow"] * 3


def test_zero_lifts_every_bound_the_deadline_included() -> None:
    limits = Limits(max_turns=0, max_tool_calls=0, max_model_calls=0, max_cost_usd=0, timeout=0)
    out = Agent(model=ScriptedModel([[ToolCall("noop", {"n": 1})], "done"]), tools=[noop], limits=limits).run("Go.")
    assert out.stop_reason == "finished", out
    assert out.output == "done"


def test_a_cancelled_run_tells_its_running_tool_at_once_and_its_cleanup_ends_before_the_run() -> None:
    # Not at the end of the run's grace period (2 s): the tool's `finally` runs first, and the
    # run ends after it (its subprocesses stopped, its files closed).
    told: List[float] = []
    cleaned: List[float] = []

    @tool
    async def hang() -> str:
        """Never returns."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            told.append(time.monotonic())
            raise
        finally:
            await asyncio.sleep(0.1)
            cleaned.append(time.monotonic())
        return "never"

    def agent(limits: Limits = Limits()) -> Agent:
        return Agent(model=ScriptedModel([[ToolCall("hang", {})], "never"]), tools=[hang], limits=limits)

    async def cancelled() -> float:
        task = asyncio.ensure_future(agent().run_async("Go."))
        await asyncio.sleep(0.3)
        at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cleaned, "the run ended before the tool's cleanup"
        return at

    at = asyncio.run(cancelled())
    assert told[0] - at < 1.0

    started = time.monotonic()
    out = agent(Limits(timeout=0.3)).run("Go.")
    assert out.stop_reason == "deadline" and out.tool_calls[0].status == "cancelled"
    assert len(cleaned) == 2 and told[1] - started < 1.3


def test_a_cancelled_run_ends_as_soon_as_its_tools_have_stopped() -> None:
    # The run's grace period (2 s) bounds the tools that do not stop when told; a run whose
    # tools stop (their `finally` done) ends then, its call recorded `cancelled` all the same.
    agent, started, cancelled = hanging_agent()

    async def cancel_the_task() -> float:
        task = asyncio.ensure_future(agent.run_async("Go."))
        while not started.is_set():
            await asyncio.sleep(0.01)
        at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - at

    assert asyncio.run(cancel_the_task()) < 1.5
    assert cancelled == [True]

    agent, started, cancelled = hanging_agent()

    async def leave_the_stream() -> Tuple[float, object]:
        stream = agent.stream("Go.")
        events = stream.__aiter__()
        async for event in events:
            if event.type == "tool_started":
                while not started.is_set():
                    await asyncio.sleep(0.01)
                break
        at = time.monotonic()
        await events.aclose()  # type: ignore[attr-defined]
        return time.monotonic() - at, stream.outcome

    took, outcome = asyncio.run(leave_the_stream())
    assert took < 1.5
    assert isinstance(outcome, RunOutcome) and outcome.stop_reason == "cancelled", outcome
    assert [c.status for c in outcome.tool_calls] == ["cancelled"], outcome.tool_calls
    assert cancelled == [True]

    # Ctrl-C in a blocking run: the run is cancelled, its tool stops, and the interrupt goes on.
    # The run has a deadline far past the test's bounds: an interrupt that never came fails the
    # test rather than hanging it.
    agent, started, cancelled = hanging_agent()
    agent = Agent(
        model=ScriptedModel([[ToolCall("hang", {})], "never"]),
        tools=agent.tools,
        limits=Limits(timeout=60),
    )
    interrupted: List[float] = []

    def press_ctrl_c() -> None:
        if started.wait(30):
            interrupted.append(time.monotonic())
            _thread.interrupt_main()

    # Python's own Ctrl-C handler, whatever this process inherited: a process started in the
    # background by a non-interactive shell ignores SIGINT, and then `interrupt_main` does
    # nothing (which is what hung this case under such a CI run).
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=press_ctrl_c, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            agent.run("Go.")
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert time.monotonic() - interrupted[0] < 1.5
    assert cancelled == [True]

    agent, started, cancelled = hanging_agent()
    out = Agent(
        model=ScriptedModel([[ToolCall("hang", {})], "never"]),
        tools=agent.tools,
        limits=Limits(timeout=0.3),
    ).run("Go.")
    assert out.stop_reason == "deadline" and out.duration_ms < 1500, out
    assert [c.status for c in out.tool_calls] == ["cancelled"]
    assert cancelled == [True]


def test_an_async_model_call_is_cancelled_with_its_run() -> None:
    # A run that stops while an async function model is answering (a request to a provider, in
    # a user's own model) cancels that coroutine: it does not go on for nobody.
    told: List[str] = []

    async def slow_model(request: ModelRequest) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            told.append("cancelled")
            raise
        return "late"

    async def cancel_the_task() -> None:
        task = asyncio.ensure_future(Agent(model=slow_model).run_async("Go."))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_the_task())
    out = Agent(model=slow_model, limits=Limits(timeout=0.3)).run("Go.")
    assert out.stop_reason == "deadline"
    waited = time.monotonic() + 5
    while len(told) < 2 and time.monotonic() < waited:
        time.sleep(0.01)
    assert told == ["cancelled", "cancelled"]


def test_an_async_model_of_a_run_a_coroutine_tool_started_answers() -> None:
    # A coroutine tool of a blocking run holds the package's loop while it runs another agent
    # with the blocking `run`: that run's async function model answers on another of the
    # package's loops (as its coroutine tools do), not on the one held, where it waited forever.
    async def inner_model(request: ModelRequest) -> str:
        await asyncio.sleep(0)
        return "inner done"

    @tool
    async def nested() -> str:
        """Runs another agent."""
        out = Agent(model=inner_model, limits=Limits(timeout=5)).run("Hi.")
        return f"{out.stop_reason}: {out.output}"

    out = Agent(model=ScriptedModel([[ToolCall("nested", {})], "ok"]), tools=[nested]).run("Go.")
    assert out.stop_reason == "finished", out
    assert [c.output for c in out.tool_calls] == ["finished: inner done"]


def test_a_call_that_answers_after_the_run_is_cancelled_is_reported_at_once() -> None:
    # A sync call cannot be stopped: when it answers (here its own error) within the grace
    # period, the run ends with it, rather than at the end of the period.
    @tool
    def slow() -> str:
        """Fails after a while."""
        time.sleep(0.5)
        raise ValueError("too late")

    started = time.monotonic()
    out = Agent(
        model=ScriptedModel([[ToolCall("slow", {})], "never"]), tools=[slow], limits=Limits(timeout=0.2)
    ).run("Go.")
    assert out.stop_reason == "deadline"
    [call] = out.tool_calls
    assert call.error is not None and call.error.code == "tool.exception", call
    assert time.monotonic() - started < 1.5


def test_a_stream_left_early_keeps_the_cancelled_runs_outcome_and_no_traceback() -> None:
    # A server whose clients leave mid-stream: what their runs' failed calls left (tracebacks)
    # goes with the runs, and each stream has its run's outcome all the same.
    @tool
    def boom(n: int) -> str:
        """Always fails."""
        raise ValueError(f"failure {n}")

    @tool
    async def hang() -> str:
        """Never returns."""
        await asyncio.sleep(60)
        return "never"

    def model(request: ModelRequest) -> List[ToolCall]:
        if request.last_tool_results():
            return [ToolCall("hang", {})]
        return [ToolCall("boom", {"n": len(request.messages)})]

    agent = Agent(model=model, tools=[boom, hang])

    async def main() -> List[object]:
        outcomes: List[object] = []
        for _ in range(2):
            stream = agent.stream("Go.")
            events = stream.__aiter__()
            async for event in events:
                if event.type == "tool_finished":
                    break
            await events.aclose()  # type: ignore[attr-defined]
            outcomes.append(stream.outcome)
        cancelled = asyncio.ensure_future(agent.run_async("Go."))
        while not agent._dispatcher.tracebacks:
            await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return outcomes

    outcomes = asyncio.run(main())
    assert all(isinstance(o, RunOutcome) and o.tool_calls for o in outcomes), outcomes
    assert agent._dispatcher.tracebacks == {}


def test_a_runs_tracebacks_end_with_it_whatever_way_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    # The tracebacks of a run's failed calls are for its outcome: a run that failed, or one whose
    # call failed only after the run stopped waiting for it (its deadline, its task cancelled:
    # Python cannot stop a thread), leaves none behind in the agent, for good.
    caplog.set_level(logging.WARNING, logger="agentloop")

    @tool
    def broken() -> str:
        """Fails for good."""
        raise FatalToolError("the disk is gone")

    agent = Agent(model=ScriptedModel([[ToolCall("broken", {})], "never"]), tools=[broken])
    out = agent.run("Go.")
    assert out.stop_reason == "failed", out
    assert agent._dispatcher.tracebacks == {}

    @tool
    def late() -> str:
        """Fails past the run's grace period (2 s)."""
        time.sleep(2.4)
        raise ValueError("too late for the run")

    def raised() -> int:
        return sum("raised" in r.getMessage() and "too late for the run" in r.getMessage() for r in caplog.records)

    def after_it_raised(count: int) -> None:
        waited = time.monotonic() + 5
        while raised() < count and time.monotonic() < waited:
            time.sleep(0.01)
        assert raised() == count

    agent = Agent(
        model=ScriptedModel([[ToolCall("late", {})], "never"]), tools=[late], limits=Limits(timeout=0.2)
    )
    out = agent.run("Go.")
    assert out.stop_reason == "deadline", out
    after_it_raised(1)
    assert agent._dispatcher.tracebacks == {}

    agent = Agent(model=ScriptedModel([[ToolCall("late", {})], "never"]), tools=[late])

    async def cancelled() -> None:
        task = asyncio.ensure_future(agent.run_async("Go."))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    after_it_raised(2)
    assert agent._dispatcher.tracebacks == {}


def test_run_async_awaits_the_users_coroutines_on_the_callers_loop(tmp_path: pathlib.Path) -> None:
    # An async model (and a sync tool's awaitable, an async tool, an approval) of a run on the
    # caller's loop runs there: it can await that loop's objects (a future, a queue, a client
    # session made on it), here a future made before the run and resolved by a task of the loop
    # while the run waits for the model.
    loops: List[str] = []

    async def main(how: str) -> RunOutcome:
        loop = asyncio.get_running_loop()
        answer: "asyncio.Future[str]" = loop.create_future()
        results: "asyncio.Queue[str]" = asyncio.Queue()

        async def model(request: ModelRequest):
            loops.append("caller" if asyncio.get_running_loop() is loop else "other")
            results_now = request.last_tool_results()
            if not results_now:
                return [ToolCall("fetch", {}, id="c1")]
            return f"{await answer} / {await results.get()}"

        async def fetch_async() -> str:
            loops.append("caller" if asyncio.get_running_loop() is loop else "other")
            await results.put("queued on the caller's loop")
            return "fetched"

        @tool
        def fetch():
            """A sync wrapper of a coroutine function: its awaitable is awaited on the run's loop."""
            return fetch_async()

        async def resolve() -> None:
            await asyncio.sleep(0.05)
            answer.set_result("resolved by the caller's loop")

        resolver = asyncio.ensure_future(resolve())
        agent = Agent(model=model, tools=[fetch], limits=Limits(timeout=10))
        if how == "stream":
            stream = agent.stream("Go.")
            async for _ in stream:
                pass
            out = stream.outcome
            assert out is not None
        elif how == "traced":
            # A run that writes a trace is not driven on the loop's thread, but its coroutines
            # still run on the loop.
            out = await agent.run_async("Go.", trace=tmp_path / "trace.ndjson")
        else:
            out = await agent.run_async("Go.")
        await resolver
        return out

    for how in ("run_async", "stream", "traced"):
        out = asyncio.run(main(how))
        assert out.stop_reason == "finished", (how, out)
        assert out.output == "resolved by the caller's loop / queued on the caller's loop", (how, out)
        assert out.tool_calls[0].output == "fetched"
    # Two model calls and one call of the tool, each run.
    assert loops == ["caller"] * 9
