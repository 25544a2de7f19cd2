"""The Python example runs, with no key, and says what the README says it does."""

from __future__ import annotations

import pathlib
import subprocess
import sys


def test_the_weather_example_runs_its_two_tools_and_answers(repo_root: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, str(repo_root / "examples/python/weather.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines.count("  get_weather: ok") == 2
    assert lines.count("  convert_temperature: ok") == 2
    assert lines.count("  convert_temperature: error") == 1
    assert "  (the model read: tool.exception: ValueError: unknown unit 'farenheit')" in lines
    assert "Lisbon is warmer: 73.4 °F and sunny, against 64.4 °F and light rain in Paris." in lines
    assert lines[-1] == "[finished: 4 turns, 5 tool calls]"


def test_the_handoff_example_from_its_file_is_answered_by_the_desk_it_handed_to(repo_root: pathlib.Path) -> None:
    from agentloop import Agent

    agent = Agent.from_file(str(repo_root / "examples/handoff/agent.toml"))
    out = agent.run("I was charged twice for invoice 7.")
    assert out.stop_reason == "finished", out
    assert out.answered_by == "billing"
    assert out.output is not None and out.output.startswith("Invoice 7 was charged twice")
    # Both agents' tokens are the run's: triage's hand-off turn and billing's two.
    assert out.usage.input_tokens == 180 + 210 + 290
    [handoff] = out.tool_calls
    assert handoff.tool == "transfer_to_billing" and handoff.ok
