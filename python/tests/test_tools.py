"""Tools from type hints and docstrings: the schema the runtime validates against, the arguments
a function receives, what its result or exception becomes, and parallel coroutine tools."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import functools
import pathlib
import subprocess
import sys
import threading
import time
import warnings
from typing import Dict, List, Literal, Optional, Set, Tuple

import pytest

from agentloop import (
    EXCEPTION_CODE,
    Agent,
    AgentloopError,
    FunctionModel,
    Limits,
    ModelRequest,
    ScriptedModel,
    ToolCall,
    ToolError,
    tool,
)
from agentloop import _schema


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


def forecast(city: str, days: int = 1, unit: Unit = Unit.CELSIUS, tags: Optional[List[str]] = None) -> dict:
    """The forecast of a city.

    Args:
        city: The city's name,
            as people write it.
        days: How many days ahead.
        unit: The temperature unit.
        tags: Labels to echo back.
    """
    return {"city": city, "days": days, "unit": unit.value, "tags": tags or []}


def test_schema_from_hints_and_docstring_without_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_schema, "pydantic", None)
    t = tool(forecast)
    assert t.name == "forecast"
    assert t.description == "The forecast of a city."
    assert t.schema == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city's name, as people write it."},
            "days": {"type": "integer", "description": "How many days ahead.", "default": 1},
            "unit": {"enum": ["celsius", "fahrenheit"], "description": "The temperature unit."},
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "description": "Labels to echo back.",
                "default": None,
            },
        },
        "required": ["city"],
        "additionalProperties": False,
    }


def test_schema_from_hints_with_pydantic() -> None:
    t = tool(forecast)
    props = t.schema["properties"]
    assert t.schema["required"] == ["city"]
    assert t.schema["additionalProperties"] is False
    assert props["city"] == {"type": "string", "description": "The city's name, as people write it."}
    assert props["days"]["type"] == "integer" and props["days"]["default"] == 1
    assert "$ref" in props["unit"] or "enum" in props["unit"]


@pytest.mark.parametrize("use_pydantic", [True, False])
def test_a_call_gets_typed_arguments_and_its_result_reaches_the_model(
    use_pydantic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not use_pydantic:
        monkeypatch.setattr(_schema, "pydantic", None)
    seen: List[dict] = []

    def answer(request: ModelRequest):
        results = request.last_tool_results()
        if not results:
            return [ToolCall("forecast", {"city": "Oslo", "days": 3, "unit": "fahrenheit"}, id="c1")]
        seen.append(results[0])
        return "done"

    agent = Agent(model=FunctionModel(answer), tools=[tool(forecast)])
    out = agent.run("Forecast for Oslo?")
    assert out.stop_reason == "finished", out
    assert out.output == "done"
    [call] = out.tool_calls
    assert call.ok and call.status == "ok"
    # The enum arrived as an Unit (its .value made the output), the default of tags as None.
    assert call.output == {"city": "Oslo", "days": 3, "unit": "fahrenheit", "tags": []}
    assert seen[0]["call_id"] == "c1" and "Oslo" in str(seen[0]["content"])


def test_arguments_that_fail_the_schema_never_reach_the_function() -> None:
    ran = threading.Event()

    @tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        ran.set()
        return a + b

    agent = Agent(
        model=ScriptedModel([[ToolCall("add", {"a": 1, "b": "two"}, id="c1")], "gave up"]),
        tools=[add],
    )
    out = agent.run("1 + two?")
    [call] = out.tool_calls
    assert not call.ok
    assert call.error is not None and call.error.code == "invalid_arguments"
    assert not ran.is_set()


def test_an_exception_is_a_result_the_model_reads_and_its_traceback_is_kept() -> None:
    read_by_model: List[dict] = []

    @tool
    def lookup(city: str) -> str:
        """Looks a city up."""
        raise ValueError(f"no station in {city}")

    def answer(request: ModelRequest):
        results = request.last_tool_results()
        if not results:
            return [ToolCall("lookup", {"city": "Atlantis"}, id="c1")]
        read_by_model.extend(results)
        return "Atlantis has no station."

    out = Agent(model=FunctionModel(answer), tools=[lookup]).run("Weather in Atlantis?")
    assert out.stop_reason == "finished"
    [call] = out.tool_calls
    assert call.status == "error"
    assert call.error is not None
    assert call.error.code == EXCEPTION_CODE
    assert call.error.message == "ValueError: no station in Atlantis"
    assert call.traceback is not None and 'raise ValueError(f"no station in {city}")' in call.traceback
    # The model read the error as an error, without the traceback.
    assert read_by_model[0]["is_error"] is True
    assert "no station in Atlantis" in str(read_by_model[0]["content"])
    assert "Traceback" not in str(read_by_model[0]["content"])


def test_a_tool_error_gives_the_model_its_own_code() -> None:
    @tool
    def lookup(city: str) -> str:
        """Looks a city up."""
        raise ToolError("unknown_city", f"no station in {city}")

    out = Agent(
        model=ScriptedModel([[ToolCall("lookup", {"city": "Atlantis"})], "sorry"]), tools=[lookup]
    ).run("?")
    [call] = out.tool_calls
    assert call.error is not None and call.error.code == "unknown_city"
    assert call.traceback is None


def _barrier_tools(n: int):
    """`n` coroutine tools that each wait until all `n` have started: they can only all finish
    when they run at the same time."""
    started: List[str] = []
    all_in = {"event": None}

    @tool
    async def wait_for_all(name: str) -> str:
        """Waits for its siblings."""
        if all_in["event"] is None:
            all_in["event"] = asyncio.Event()
        started.append(name)
        if len(started) == n:
            all_in["event"].set()
        await asyncio.wait_for(all_in["event"].wait(), timeout=10)
        return f"{name} ran beside {len(started) - 1} others"

    calls = [ToolCall("wait_for_all", {"name": f"t{i}"}, id=f"c{i}") for i in range(n)]
    return wait_for_all, calls, started


def test_async_tools_of_a_batch_run_in_parallel_on_the_callers_loop() -> None:
    t, calls, started = _barrier_tools(3)
    agent = Agent(model=ScriptedModel([calls, "all three ran"]), tools=[t])

    async def main():
        loop_thread = threading.get_ident()
        seen_threads = []

        @tool
        async def where() -> str:
            """Says which thread it ran on."""
            seen_threads.append(threading.get_ident())
            return "here"

        out = await agent.run_async("Run them.")
        other = Agent(model=ScriptedModel([[ToolCall("where", {})], "ok"]), tools=[where])
        await other.run_async("Where?")
        return out, loop_thread, seen_threads

    out, loop_thread, seen_threads = asyncio.run(main())
    assert out.stop_reason == "finished", out
    assert [c.ok for c in out.tool_calls] == [True, True, True]
    assert sorted(c.output for c in out.tool_calls) == [f"t{i} ran beside 2 others" for i in range(3)]
    assert seen_threads == [loop_thread]


def test_async_tools_run_in_parallel_under_a_blocking_run_too() -> None:
    t, calls, _ = _barrier_tools(3)
    out = Agent(model=ScriptedModel([calls, "done"]), tools=[t]).run("Run them.")
    assert [c.ok for c in out.tool_calls] == [True, True, True], out.tool_calls


def test_an_async_tool_runs_as_a_task_of_the_loop_from_its_first_step() -> None:
    # A batch's coroutines are started together, eagerly on Python 3.12+: each is still a task
    # of the run's loop from its first line, so what needs a current task works in a tool.
    @tool
    async def inside(n: int) -> str:
        """Reports the task it runs in."""
        task = asyncio.current_task()
        assert task is not None and task.get_loop() is asyncio.get_running_loop()
        if n == 0:
            return "no wait"
        await asyncio.wait_for(asyncio.sleep(0), timeout=10)
        return f"waited in a task {asyncio.current_task() is task}"

    calls = [ToolCall("inside", {"n": i}, id=f"c{i}") for i in range(3)]

    def agent() -> Agent:
        return Agent(model=ScriptedModel([calls, "done"]), tools=[inside])

    # On the caller's loop (run_async), and on the package's own (run).
    for out in (asyncio.run(agent().run_async("Go.")), agent().run("Go.")):
        assert out.stop_reason == "finished", out
        assert [c.output for c in out.tool_calls] == ["no wait"] + ["waited in a task True"] * 2


def test_sync_tools_run_on_a_thread_pool_in_parallel() -> None:
    barrier = threading.Barrier(3, timeout=10)

    @tool
    def meet(name: str) -> str:
        """Waits for two others on a barrier."""
        barrier.wait()
        return name

    calls = [ToolCall("meet", {"name": f"m{i}"}) for i in range(3)]
    out = Agent(model=ScriptedModel([calls, "met"]), tools=[meet]).run("Meet.")
    assert [c.ok for c in out.tool_calls] == [True, True, True], out.tool_calls


def test_a_sequential_tool_never_runs_beside_another() -> None:
    running = {"now": 0, "most": 0}
    lock = threading.Lock()

    @tool(sequential=True)
    def one_at_a_time(n: int) -> int:
        """Counts how many run at once."""
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        threading.Event().wait(0.05)
        with lock:
            running["now"] -= 1
        return n

    calls = [ToolCall("one_at_a_time", {"n": i}) for i in range(3)]
    out = Agent(model=ScriptedModel([calls, "ok"]), tools=[one_at_a_time]).run("Go.")
    assert [c.output for c in out.tool_calls] == [0, 1, 2]
    assert running["most"] == 1


def test_an_async_tool_that_raises_cancelled_error_of_its_own_does_not_hold_the_run() -> None:
    # A coroutine that awaits a future someone else cancelled raises CancelledError though the
    # run never cancelled it: the call is answered at once and the run goes on (without the
    # deadline set here, it would have waited forever).
    @tool
    async def fetch() -> str:
        """Awaits a cancelled future."""
        future: "asyncio.Future[str]" = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future

    def agent() -> Agent:
        script = ScriptedModel([[ToolCall("fetch", {})], "it was cancelled"])
        return Agent(model=script, tools=[fetch], limits=Limits(timeout=5))

    for out in (agent().run("Go."), asyncio.run(agent().run_async("Go."))):
        assert out.stop_reason == "finished", out
        [call] = out.tool_calls
        assert call.error is not None and call.error.code == "cancelled"


def test_sync_tools_that_block_past_their_timeout_never_starve_later_calls() -> None:
    # Python cannot stop a thread: each call that times out keeps its thread while it blocks.
    # More of them than a thread pool's workers must not leave a later sync call waiting.
    release = threading.Event()

    @tool(timeout=0.2)
    def stuck(i: int) -> str:
        """Blocks until the test ends."""
        release.wait(30)
        return "late"

    @tool
    def quick() -> str:
        """Answers at once."""
        return "quick"

    try:
        calls = [ToolCall("stuck", {"i": i}) for i in range(40)]
        blocked = Agent(
            model=ScriptedModel([calls, "they timed out"]), tools=[stuck], limits=Limits(max_concurrency=64)
        ).run("Go.")
        assert {c.error.code for c in blocked.tool_calls if c.error} == {"timeout"}
        out = Agent(
            model=ScriptedModel([[ToolCall("quick", {})], "done"]), tools=[quick], limits=Limits(timeout=5)
        ).run("Go.")
        assert out.stop_reason == "finished", out
        assert out.tool_calls[0].output == "quick"
    finally:
        release.set()


def test_a_sync_tool_still_blocking_does_not_keep_the_process_from_exiting(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "blocked.py"
    script.write_text(
        "import time\n"
        "from agentloop import Agent, ScriptedModel, ToolCall, tool\n"
        "@tool(timeout=0.2)\n"
        "def stuck() -> str:\n"
        "    time.sleep(60)\n"
        "    return 'late'\n"
        "out = Agent(model=ScriptedModel([[ToolCall('stuck', {})], 'done']), tools=[stuck]).run('Go.')\n"
        "print(out.tool_calls[0].error.code)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "timeout"
    assert time.monotonic() - started < 20


def test_a_result_reaches_the_model_as_json_with_nested_dataclasses_enums_and_sets() -> None:
    @dataclasses.dataclass
    class Reading:
        station: str
        unit: Unit
        at: datetime.datetime

    at = datetime.datetime(2024, 5, 1, 12, 30)

    @tool
    def readings() -> dict:
        """The last readings."""
        return {
            "readings": [Reading("Paris", Unit.CELSIUS, at), Reading("Oslo", Unit.FAHRENHEIT, at)],
            "units": {Unit.CELSIUS},
            "raw": b"18.5",
        }

    @tool
    def not_a_number() -> float:
        """Not JSON."""
        return float("nan")

    calls = [ToolCall("readings", {}), ToolCall("not_a_number", {})]
    out = Agent(model=ScriptedModel([calls, "done"]), tools=[readings, not_a_number]).run("Go.")
    first, second = out.tool_calls
    assert first.output == {
        "readings": [
            {"station": "Paris", "unit": "celsius", "at": "2024-05-01T12:30:00"},
            {"station": "Oslo", "unit": "fahrenheit", "at": "2024-05-01T12:30:00"},
        ],
        "units": ["celsius"],
        "raw": "18.5",
    }
    assert second.error is not None and second.error.code == "tool.output_not_json"
    assert "not JSON compliant" in second.error.message


def test_a_result_of_pydantic_models_in_a_list_reaches_the_model_as_json() -> None:
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        unit: Unit

    @tool
    def cities() -> list:
        """Cities."""
        return [City(name="Paris", unit=Unit.CELSIUS)]

    out = Agent(model=ScriptedModel([[ToolCall("cities", {})], "done"]), tools=[cities]).run("Go.")
    assert out.tool_calls[0].output == [{"name": "Paris", "unit": "celsius"}]


@pytest.mark.parametrize("use_pydantic", [True, False])
def test_nested_enums_floats_sets_and_tuples_arrive_as_their_types(
    use_pydantic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's types without pydantic too: an enum inside a list or a dict is the enum, a
    # float given as 2 is 2.0, a set and a tuple are a set and a tuple.
    if not use_pydantic:
        monkeypatch.setattr(_schema, "pydantic", None)
    seen: List[tuple] = []

    def convert(
        units: List[Unit],
        by_city: Dict[str, Unit],
        scale: float,
        tags: Set[str],
        point: Tuple[float, float],
        maybe: Optional[List[Unit]] = None,
    ) -> str:
        """Converts."""
        seen.append((units, by_city, scale, tags, point, maybe))
        return "ok"

    args = {
        "units": ["celsius"],
        "by_city": {"Oslo": "fahrenheit"},
        "scale": 2,
        "tags": ["a", "b"],
        "point": [1, 2.5],
        "maybe": ["fahrenheit"],
    }
    out = Agent(model=ScriptedModel([[ToolCall("convert", args)], "done"]), tools=[convert]).run("Go.")
    assert out.tool_calls[0].ok, out.tool_calls
    [(units, by_city, scale, tags, point, maybe)] = seen
    assert units == [Unit.CELSIUS] and by_city == {"Oslo": Unit.FAHRENHEIT} and maybe == [Unit.FAHRENHEIT]
    assert type(scale) is float and scale == 2.0
    assert tags == {"a", "b"} and point == (1.0, 2.5) and type(point[0]) is float


def test_callable_objects_partials_and_wrappers_of_coroutines_are_tools() -> None:
    class Fetcher:
        """Fetches a page."""

        async def __call__(self, url: str) -> str:
            await asyncio.sleep(0)
            return f"fetched {url}"

    def scaled(factor: int, x: int) -> int:
        return factor * x

    async def lookup(city: str) -> str:
        await asyncio.sleep(0)
        return f"18 in {city}"

    def logged(city: str) -> "asyncio.Future[str]":
        # A sync wrapper (as some decorators make) whose call returns the coroutine.
        return lookup(city)  # type: ignore[return-value]

    fetch = tool(Fetcher())
    assert fetch.name == "Fetcher" and fetch.is_async and fetch.description == "Fetches a page."
    triple = tool(name="triple")(functools.partial(scaled, 3))
    assert triple.schema["required"] == ["x"]
    calls = [ToolCall("Fetcher", {"url": "a.org"}), ToolCall("triple", {"x": 2}), ToolCall("logged", {"city": "Oslo"})]
    out = Agent(model=ScriptedModel([calls, "done"]), tools=[fetch, triple, logged]).run("Go.")
    assert [c.output for c in out.tool_calls] == ["fetched a.org", 6, "18 in Oslo"], out.tool_calls


def test_an_empty_tool_name_is_a_value_error_as_the_runtime_refuses_it() -> None:
    def weather(city: str) -> str:
        return city

    said = r'^tool\.invalid_name: invalid tool name "": the name is empty'
    with pytest.raises(ValueError, match=said):
        tool(name="")(weather)
    with pytest.raises(ValueError, match=said):
        tool(weather, name="")
    # Unset is the function's name, as before.
    assert tool(weather).name == "weather"
    assert tool(name=None)(weather).name == "weather"
    # The runtime's own words and code for a tool made with an empty name some other way.
    unnamed = dataclasses.replace(tool(weather), name="")
    with pytest.raises(AgentloopError) as e:
        Agent(model=ScriptedModel(["done"]), tools=[unnamed])
    assert e.value.code == "tool.invalid_name"
    assert 'invalid tool name "": the name is empty' in e.value.message


def test_parameters_named_as_pydantics_attributes_or_with_an_underscore_are_kept() -> None:
    pytest.importorskip("pydantic")
    seen: List[tuple] = []

    def lookup(schema: str, model_config: str, json: bool, _cursor: int, unit: Unit = Unit.CELSIUS) -> str:
        """Looks up a database schema."""
        seen.append((schema, model_config, json, _cursor, unit))
        return "ok"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "shadows an attribute in parent BaseModel"
        t = tool(lookup)
    assert sorted(t.schema["required"]) == ["_cursor", "json", "model_config", "schema"]
    args = {"schema": "public", "model_config": "strict", "json": True, "_cursor": 4, "unit": "fahrenheit"}
    out = Agent(model=ScriptedModel([[ToolCall("lookup", args)], "done"]), tools=[t]).run("Go.")
    assert out.tool_calls[0].ok, out.tool_calls
    assert seen == [("public", "strict", True, 4, Unit.FAHRENHEIT)]


def test_a_coroutine_tool_of_a_blocking_run_can_run_an_agent_with_run() -> None:
    # Agents as tools, two levels deep, each run blocking: the loop that runs the outer run's
    # coroutine tools waits for the inner run, whose coroutine tools must run elsewhere.
    @tool
    async def leaf() -> str:
        """The deepest tool."""
        await asyncio.sleep(0)
        return "leaf"

    def agent_calling(name: str, tools: list, answer: str) -> Agent:
        return Agent(model=ScriptedModel([[ToolCall(name, {})], answer]), tools=tools, limits=Limits(timeout=5))

    @tool
    async def middle() -> str:
        """Runs an agent."""
        await asyncio.sleep(0)
        return agent_calling("leaf", [leaf], "middle done").run("Go.").output or ""

    @tool
    async def top() -> str:
        """Runs an agent that runs an agent."""
        await asyncio.sleep(0)
        return agent_calling("middle", [middle], "top done").run("Go.").output or ""

    out = agent_calling("top", [top], "all done").run("Go.")
    assert out.stop_reason == "finished", out
    assert out.tool_calls[0].output == "top done", out.tool_calls


@pytest.mark.parametrize("use_pydantic", [True, False])
def test_annotations_naming_local_classes_are_resolved(use_pydantic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # This module has `from __future__ import annotations`: every annotation is a string, and
    # these name classes local to the test.
    if not use_pydantic:
        monkeypatch.setattr(_schema, "pydantic", None)

    class Mode(enum.Enum):
        FAST = "fast"
        SAFE = "safe"

    seen: List[tuple] = []

    @tool
    def move(mode: Mode, steps: int = 1, note: Optional[str] = None) -> str:
        """Moves."""
        seen.append((mode, steps, note))
        return "moved"

    def stop(mode: Mode) -> str:
        """Stops."""
        seen.append((mode,))
        return "stopped"

    assert move.schema["properties"]["steps"]["type"] == "integer"
    calls = [ToolCall("move", {"mode": "safe", "steps": 2}), ToolCall("stop", {"mode": "fast"})]
    out = Agent(model=ScriptedModel([calls, "done"]), tools=[move, stop]).run("Go.")
    assert [c.output for c in out.tool_calls] == ["moved", "stopped"], out.tool_calls
    assert sorted(seen, key=len) == [(Mode.FAST,), (Mode.SAFE, 2, None)]


def test_a_tool_whose_answer_cannot_be_handed_over_as_is_still_answers_the_model() -> None:
    # Each of these used to raise while answering, leaving the call unanswered and the run
    # waiting for it forever (here: until its deadline).
    @tool
    def listing() -> str:
        """A file name with a byte that is not UTF-8, as os.listdir gives it."""
        return b"caf\xe9.txt".decode("utf-8", "surrogateescape")

    @tool
    async def listing_async() -> str:
        """The same, from a coroutine."""
        return b"caf\xe9.txt".decode("utf-8", "surrogateescape")

    @tool
    def lookup() -> str:
        """A code that is not text."""
        raise ToolError(404, "not found")  # type: ignore[arg-type]

    @tool
    def opened() -> str:
        """An exception whose message holds such a byte."""
        raise ValueError(b"no caf\xe9".decode("utf-8", "surrogateescape"))

    class Unserializable:
        def model_dump_json(self) -> str:
            raise RuntimeError("cannot serialize")

    @tool
    def dumped() -> str:
        """A pydantic-like model whose JSON dump raises."""
        return Unserializable()  # type: ignore[return-value]

    @tool
    async def dumped_async() -> str:
        """The same, from a coroutine."""
        return Unserializable()  # type: ignore[return-value]

    names = ["listing", "listing_async", "lookup", "opened", "dumped", "dumped_async"]
    agent = Agent(
        model=ScriptedModel([[ToolCall(n, {}) for n in names], "done"]),
        tools=[listing, listing_async, lookup, opened, dumped, dumped_async],
        limits=Limits(timeout=20),
    )
    out = agent.run("Go.")
    assert out.stop_reason == "finished", out.raw
    calls = {c.tool: c for c in out.tool_calls}
    assert calls["listing"].output == "caf\ufffd.txt"
    assert calls["listing_async"].output == "caf\ufffd.txt"
    lookup_error = calls["lookup"].error
    assert lookup_error is not None and (lookup_error.code, lookup_error.message) == ("404", "not found")
    opened_error = calls["opened"].error
    assert opened_error is not None and opened_error.code == EXCEPTION_CODE
    assert opened_error.message == "ValueError: no caf\ufffd"
    for name in ["dumped", "dumped_async"]:
        error = calls[name].error
        assert error is not None and error.code == "tool.output_invalid", calls[name]
        assert "RuntimeError: cannot serialize" in error.message
