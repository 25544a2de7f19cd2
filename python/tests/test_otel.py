"""OpenTelemetry from Python: ``Agent(otel=True)`` and an agent file's ``otel = true`` export the
runs' GenAI spans over OTLP, as ``agentloop run --otel`` does, to the real OTLP receiver the CLI's
tests use (``scripts/otel/receiver.sh``: the official ``opentelemetry-proto`` classes and
``grpcio``, in a venv of its own), on loopback, over OTLP/HTTP and OTLP/gRPC."""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import subprocess
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from agentloop import Agent, Reply, ScriptedModel, ToolCall, tool

from conftest import ROOT

Span = Dict[str, Any]


class Receiver:
    def __init__(self, out: pathlib.Path) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [str(ROOT / "scripts/otel/receiver.sh"), str(out)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        words = self.proc.stdout.readline().split()
        assert words[:1] == ["ready"], f"the receiver said {words!r}"
        self.http, self.grpc = int(words[1]), int(words[2])

    def spans(self) -> List[Span]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines()]

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def receiver(tmp_path: pathlib.Path) -> Iterator[Receiver]:
    r = Receiver(tmp_path / "spans.jsonl")
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> Receiver:
    for name in (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agentloop-python-test")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.http}")
    return receiver


@tool
def lookup(city: str) -> str:
    """The weather of a city."""
    if city == "Atlantis":
        raise LookupError("no such city")
    return f"sunny in {city}"


def _script() -> ScriptedModel:
    return ScriptedModel(
        [
            Reply(
                tool_calls=[
                    ToolCall("lookup", {"city": "Paris"}, id="call_paris"),
                    ToolCall("lookup", {"city": "Atlantis"}, id="call_atlantis"),
                ],
                input_tokens=120,
                output_tokens=30,
            ),
            Reply(text="Sunny in Paris; Atlantis is unknown.", input_tokens=200, output_tokens=12),
        ]
    )


def _by_name(spans: List[Span], name: str) -> List[Span]:
    return [s for s in spans if s["name"] == name]


def _one_run(spans: List[Span], agent: str) -> Tuple[Span, List[Span], List[Span]]:
    runs = _by_name(spans, f"invoke_agent {agent}")
    assert len(runs) == 1, spans
    run = runs[0]
    children = [s for s in spans if s["trace_id"] == run["trace_id"] and s is not run]
    chats = [s for s in children if s["name"].startswith("chat ")]
    tools = [s for s in children if s["name"].startswith("execute_tool ")]
    return run, chats, tools


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json", "grpc"])
def test_a_run_is_exported_as_genai_spans_with_its_attributes(
    otel_env: Receiver, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    port = otel_env.grpc if protocol == "grpc" else otel_env.http
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    agent = Agent(model=_script(), tools=[lookup], name="weather", otel=True)
    assert agent.otel
    out = agent.run("Weather in Paris and Atlantis?")
    assert out.stop_reason == "finished"
    # The spans were sent before the outcome came back: no waiting here.
    spans = otel_env.spans()
    assert {s["transport"] for s in spans} == {protocol}
    run, chats, tools = _one_run(spans, "weather")
    a = run["attributes"]
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "weather"
    assert a["agentloop.stop_reason"] == "finished"
    assert a["gen_ai.usage.input_tokens"] == 320
    assert a["gen_ai.usage.output_tokens"] == 42
    assert run["parent_span_id"] == ""
    assert run["resource"]["service.name"] == "agentloop-python-test"
    assert run["status"]["code"] == 1
    assert len(chats) == 2 and len(tools) == 2
    for s in chats + tools:
        assert s["parent_span_id"] == run["span_id"]
    assert chats[0]["attributes"]["gen_ai.usage.input_tokens"] in (120, 200)
    paris = next(t for t in tools if t["attributes"]["gen_ai.tool.call.id"] == "call_paris")
    assert paris["name"] == "execute_tool lookup"
    assert paris["attributes"]["gen_ai.tool.name"] == "lookup"
    assert paris["status"]["code"] != 2
    # The Python exception is an error span with its code as the error's type.
    failed = next(t for t in tools if t["attributes"]["gen_ai.tool.call.id"] == "call_atlantis")
    assert failed["status"]["code"] == 2
    assert failed["attributes"]["error.type"] == "tool.exception"
    # No payload without asking for it.
    for s in spans:
        assert "gen_ai.input.messages" not in s["attributes"]
        assert "gen_ai.tool.call.arguments" not in s["attributes"]
        assert "Atlantis" not in json.dumps(s)


def test_async_runs_are_exported_and_payloads_only_when_asked(otel_env: Receiver) -> None:
    agent = Agent(model=_script(), tools=[lookup], name="weather", otel_payloads=True)
    out = asyncio.run(agent.run_async("Weather in Paris and Atlantis?"))
    assert out.stop_reason == "finished"
    run, _, tools = _one_run(otel_env.spans(), "weather")
    assert "Sunny in Paris" in run["attributes"]["gen_ai.output.messages"]
    paris = next(t for t in tools if t["attributes"]["gen_ai.tool.call.id"] == "call_paris")
    assert "Paris" in paris["attributes"]["gen_ai.tool.call.arguments"]
    # Without otel, nothing is sent.
    plain = Agent(model=_script(), tools=[lookup], name="quiet")
    assert not plain.otel
    asyncio.run(plain.run_async("Weather?"))
    assert _by_name(otel_env.spans(), "invoke_agent quiet") == []


def test_an_agent_file_with_otel_true_exports_its_runs(
    otel_env: Receiver, tmp_path: pathlib.Path
) -> None:
    folder = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples/quickstart", folder)
    toml = folder / "agent.toml"
    toml.write_text(toml.read_text().replace("[model]", "otel = true\n\n[model]", 1))
    agent = Agent.from_file(toml)
    assert agent.otel
    try:
        out = agent.run("Compare the weather in Paris and Lisbon, in Fahrenheit.")
    finally:
        agent.close()
    assert out.stop_reason == "finished"
    run, chats, tools = _one_run(otel_env.spans(), "weather")
    assert run["attributes"]["agentloop.stop_reason"] == "finished"
    assert run["attributes"]["gen_ai.usage.input_tokens"] == 182 + 268 + 331 + 402
    assert len(chats) == 4 and len(tools) == 5
    assert all(c["attributes"]["gen_ai.provider.name"] == "scripted" for c in chats)
    # `otel=False` turns the file's export off; the file without the key exports nothing.
    before = len(otel_env.spans())
    off = Agent.from_file(toml, otel=False)
    try:
        assert not off.otel
        off.run("Compare the weather in Paris and Lisbon, in Fahrenheit.")
    finally:
        off.close()
    assert len(otel_env.spans()) == before


def test_a_bad_protocol_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentloop import AgentloopError

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    with pytest.raises(AgentloopError) as e:
        Agent(model=_script(), tools=[lookup], otel=True)
    assert e.value.code == "otel.config"
