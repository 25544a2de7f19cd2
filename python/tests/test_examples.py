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
