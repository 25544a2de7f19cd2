"""A script may end while a sync tool's thread is still waking the run it answered: the run
finished by another wake-up, the interpreter finalizing. The process must still exit cleanly,
never abort ("FATAL: exception not rethrown") or crash from that thread."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

# The tool's thread queues the run's next poll, then is held inside the loop's
# `call_soon_threadsafe` with the GIL let go (as a thread the system descheduled there would
# be): the run finishes on the main thread and the script ends before that thread is back,
# which it is while the interpreter finalizes (held there by garbage slow to go).
SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, threading, time
    from agentloop import Agent, ScriptedModel, ToolCall, tool

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

    # Garbage the interpreter collects as it finalizes (the collector is off till then), slow
    # to go: the tool's thread comes back to Python meanwhile.
    class SlowToCollect:
        def __del__(self, sleep=time.sleep):
            sleep(2.0)

    gc.disable()
    garbage = SlowToCollect()
    garbage.cycle = garbage
    del garbage

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
