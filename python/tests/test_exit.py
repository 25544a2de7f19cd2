"""A script may end while the runtime still works for it: a sync tool's thread still waking the
run it answered (the run finished by another wake-up), or a run on the runtime's threads still
going, the interpreter finalizing. The process must still exit cleanly, with the script's own
status, never abort ("FATAL: exception not rethrown") or crash from such a thread, and no such
thread may run Python any more."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
import time

# Garbage the interpreter collects as it finalizes (the collector is off till then), slow to go:
# the threads the scripts hold come back meanwhile.
SLOW_TO_FINALIZE = textwrap.dedent(
    """
    import asyncio, gc, sys, threading, time
    from agentloop import Agent, FunctionModel, ScriptedModel, ToolCall, tool

    class SlowToCollect:
        def __del__(self, sleep=time.sleep):
            sleep(2.0)

    gc.disable()
    garbage = SlowToCollect()
    garbage.cycle = garbage
    del garbage
    """
)

# The tool's thread queues the run's next poll, then is held inside the loop's
# `call_soon_threadsafe` with the GIL let go (as a thread the system descheduled there would
# be): the run finishes on the main thread and the script ends before that thread is back,
# which it is while the interpreter finalizes (held there by garbage slow to go).
SCRIPT = SLOW_TO_FINALIZE + textwrap.dedent(
    """
    @tool
    def echo(x: int) -> int:
        \"\"\"Gives x back, after the loop has gone idle waiting for it.\"\"\"
        time.sleep(0.3)
        return x

    class SlowWakeLoop(asyncio.SelectorEventLoop):
        def call_soon_threadsafe(self, callback, *args, context=None):
            handle = super().call_soon_threadsafe(callback, *args, context=context)
            if threading.current_thread() is not threading.main_thread():
                time.sleep(1.0)
            return handle

    agent = Agent(
        model=ScriptedModel([[ToolCall("echo", {"x": 1})], "done"]),
        instructions="Echo.",
        tools=[echo],
    )

    async def main():
        out = await agent.run_async("go")
        print(out.stop_reason, out.output, flush=True)

    SlowWakeLoop().run_until_complete(main())
    """
)


def test_a_script_ending_while_a_tool_thread_wakes_its_run_exits_cleanly(tmp_path: pathlib.Path) -> None:
    # Run elsewhere than python/, where `-c` would import the package's sources, not the wheel.
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout.splitlines() == ["finished done"], out.stdout
    assert "FATAL" not in out.stderr, out.stderr


# A run on the runtime's threads (a trace file keeps it off the loop's thread) is still going
# when the script ends, and goes on while the interpreter finalizes (held there by garbage slow
# to go): a call into Python it has under way is given time to end, and from then on it runs
# no Python but ends all the same, as its trace shows (`wait` holds a run: its attempt times
# out on the runtime's clock, its thread asleep). The process exits with the script's own
# status.
RUNTIME_RUN = SLOW_TO_FINALIZE + textwrap.dedent(
    """
    TRACE = sys.argv[1]
    pending = []
    started = threading.Event()

    @tool(timeout=0.5)
    def wait() -> str:
        \"\"\"Outlasts its timeout.\"\"\"
        started.set()
        time.sleep(30)
        return "late"

    def end_once(run, loop):
        async def main():
            pending.append(asyncio.ensure_future(run()))
            while not started.is_set():
                await asyncio.sleep(0.01)
            print("ending", flush=True)

        # The loop is left as it is, the run's task pending: nothing awaits the run any more.
        loop.run_until_complete(main())
    """
)

# Events to a Python callback (a stream's, which hands each to the loop): the first is under
# way when the script ends, held in the loop's `call_soon_threadsafe` with the GIL let go.
SINK_SCRIPT = RUNTIME_RUN + textwrap.dedent(
    """
    class SlowWakeLoop(asyncio.SelectorEventLoop):
        def call_soon_threadsafe(self, callback, *args, context=None):
            handle = super().call_soon_threadsafe(callback, *args, context=context)
            if threading.current_thread() is not threading.main_thread() and not started.is_set():
                started.set()
                time.sleep(1.0)
            return handle

    agent = Agent(model=ScriptedModel(["done"]), instructions="Answer.")

    async def consume():
        async for event in agent.stream("go", trace=TRACE):
            pass

    end_once(consume, SlowWakeLoop())
    """
)

# A function model, on the runtime's threads. `slow`: its first answer is under way when the
# script ends. `quick`: its second call comes while the interpreter finalizes, after the tool's
# attempt timed out on the runtime's clock. A third argument: the run's journal.
MODEL_SCRIPT = RUNTIME_RUN + textwrap.dedent(
    """
    slow_answer = sys.argv[2] == "slow"
    journal = sys.argv[3] if len(sys.argv) > 3 else None
    calls = []

    def answer(request):
        calls.append(1)
        if len(calls) == 1:
            if slow_answer:
                started.set()
                time.sleep(1.0)
            return [ToolCall("wait", {}, id="w1")]
        return "done"

    agent = Agent(model=FunctionModel(answer), instructions="Wait.", tools=[wait])
    end_once(lambda: agent.run_async("go", trace=TRACE, journal=journal), asyncio.new_event_loop())
    sys.exit(3)
    """
)


def run_script(script: str, tmp_path: pathlib.Path, *args: str) -> "tuple[subprocess.CompletedProcess[str], list[dict]]":
    """The script's run, and the records of its run's trace."""
    trace = tmp_path / "trace.ndjson"
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", script, str(trace), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    # The slow garbage holds the exit 2 s; a call under way, 5 s more at most.
    assert time.monotonic() - started < 20, out.stderr
    assert out.stdout.splitlines() == ["ending"], (out.stdout, out.stderr)
    assert "FATAL" not in out.stderr and "Fatal" not in out.stderr, out.stderr
    return out, [json.loads(line) for line in trace.read_text().splitlines()]


def ended(trace: "list[dict]") -> dict:
    """The run's last record: its end, when it ended."""
    last = trace[-1]
    assert last["kind"] == "run" and last["status"] != "running", trace
    return last


def test_an_event_under_way_when_the_script_ends_is_finished_and_the_run_ends_without_python(
    tmp_path: pathlib.Path,
) -> None:
    out, trace = run_script(SINK_SCRIPT, tmp_path)
    assert out.returncode == 0, (out.returncode, out.stderr)
    # Its later events were dropped; the run went on to its answer.
    assert ended(trace)["stop_reason"] == "finished", trace


def not_ended(trace: "list[dict]") -> None:
    """The run never ended: the exit left it as a killed process leaves it."""
    assert not [r for r in trace if r["kind"] == "run" and r["status"] != "running"], trace


def test_a_function_model_answering_when_the_script_ends_finishes_its_answer_first(
    tmp_path: pathlib.Path,
) -> None:
    out, trace = run_script(MODEL_SCRIPT, tmp_path, "slow")
    assert out.returncode == 3, (out.returncode, out.stderr)
    # The answer came (a call of the tool). The tool's Python never ran, as no Python runs once
    # the exit began: the call waited until its timeout, and the model was never asked again.
    models = [r for r in trace if r["kind"] == "model_call" and r["status"] != "running"]
    assert [m["status"] for m in models] == ["ok"], trace
    calls = [r for r in trace if r["kind"] == "tool_call" and r["status"] != "running"]
    assert [(c["status"], c["error"]["code"]) for c in calls] == [("error", "timeout")], trace
    not_ended(trace)


def test_a_journaled_run_whose_model_is_asked_as_the_interpreter_finalizes_resumes_from_there(
    tmp_path: pathlib.Path,
) -> None:
    journal = tmp_path / "journal.db"
    out, trace = run_script(MODEL_SCRIPT, tmp_path, "quick", str(journal))
    assert out.returncode == 3, (out.returncode, out.stderr)
    # The tool's attempt timed out, and the next model call was never made: the run did not
    # end, so its journal holds it in flight (a failure recorded at the exit would have ended it,
    # and a resume would refuse it as finished).
    [call] = [r for r in trace if r["kind"] == "tool_call" and r["status"] != "running"]
    assert (call["status"], call["error"]["code"]) == ("error", "timeout"), call
    not_ended(trace)
    run_id = trace[0]["run_id"]

    # The same agent, in this process: the run goes on from its journal to its answer.
    from agentloop import Agent, FunctionModel, tool

    @tool(timeout=0.5)
    def wait() -> str:
        """Outlasts its timeout."""
        raise AssertionError("a finished call never runs again")

    asked = []

    def answer(request):
        asked.append(1)
        return "done"

    resumed = Agent(model=FunctionModel(answer), instructions="Wait.", tools=[wait]).resume(
        run_id, journal=journal
    )
    assert resumed.stop_reason == "finished", resumed
    assert resumed.output == "done"
    assert len(asked) == 1
    [record] = resumed.tool_calls
    assert (record.status, record.error.code) == ("error", "timeout"), record


# A blocking run waited for on a daemon thread (the thread waits in the runtime's code without
# the GIL, a slice at a time, and is back for the next slice while the interpreter finalizes:
# made to exit there, it goes quietly). Its run goes on past its tool's timeout to its answer.
DAEMON_SCRIPT = RUNTIME_RUN + textwrap.dedent(
    """
    agent = Agent(
        model=ScriptedModel([[ToolCall("wait", {})], "done"]), instructions="Wait.", tools=[wait]
    )
    threading.Thread(target=lambda: agent.run("go", trace=TRACE), daemon=True).start()
    started.wait()
    print("ending", flush=True)
    """
)


def test_a_run_waited_for_on_a_daemon_thread_when_the_script_ends_exits_cleanly(
    tmp_path: pathlib.Path,
) -> None:
    out, trace = run_script(DAEMON_SCRIPT, tmp_path)
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert ended(trace)["stop_reason"] == "finished", trace


# An exit handler registered before the package was imported runs after the package's own: a run
# it starts could never call its Python tool, and must be refused rather than wait for ever.
LATE_HANDLER_SCRIPT = textwrap.dedent(
    """
    import atexit, sys

    def late():
        from agentloop import Agent, ScriptedModel, ToolCall, tool
        from agentloop.errors import AgentloopError

        @tool
        def echo(x: int) -> int:
            \"\"\"Gives x back.\"\"\"
            return x

        agent = Agent(
            model=ScriptedModel([[ToolCall("echo", {"x": 1})], "done"]),
            instructions="Echo.",
            tools=[echo],
        )
        try:
            out = agent.run("go")
            print("ran", out.stop_reason, flush=True)
        except AgentloopError as e:
            print("refused", e.code, flush=True)

    atexit.register(late)
    import agentloop  # its exit hook runs before `late`
    print("ending", flush=True)
    """
)


def test_a_run_started_by_an_exit_handler_after_the_packages_own_is_refused_not_hung(
    tmp_path: pathlib.Path,
) -> None:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", LATE_HANDLER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert time.monotonic() - started < 20, out.stderr
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout.splitlines() == ["ending", "refused python.exiting"], (out.stdout, out.stderr)
