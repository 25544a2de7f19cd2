"""Live providers by name and base URL, through the runtime's own clients: an OpenAI-compatible
server on loopback (a few lines of http.server, answering as the API does) gets the requests
and answers with a tool call, then the text."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from typing import Any, Dict, Iterator, List

import pytest

from agentloop import Agent, AgentloopError, Provider, tool

ANSWERS: List[Dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        ],
    },
    {"role": "assistant", "content": "2 + 3 = 5"},
]


class FakeOpenAI:
    """The server's address and the requests it got (each body, with its path and auth header)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.received: List[Dict[str, Any]] = []


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body["_authorization"] = self.headers.get("Authorization")
            body["_path"] = self.path
            fake.received.append(body)
            message = ANSWERS[min(len(fake.received), len(ANSWERS)) - 1]
            reply = json.dumps(
                {
                    "id": f"chatcmpl-{len(fake.received)}",
                    "object": "chat.completion",
                    "model": "test-model",
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield fake
    finally:
        server.shutdown()


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def test_an_openai_compatible_server_by_base_url(
    openai_server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_SERVER_KEY", "sk-test-123")
    url = openai_server.url
    agent = Agent(
        model=Provider("openai", "test-model", base_url=url, api_key_env="TEST_SERVER_KEY", stream=False),
        instructions="Add with the tool.",
        tools=[add],
    )
    out = agent.run("What is 2 + 3?")
    assert out.stop_reason == "finished", out
    assert out.output == "2 + 3 = 5"
    [call] = out.tool_calls
    assert call.tool == "add" and call.output == 5
    assert out.usage.input_tokens == 22 and out.usage.output_tokens == 14
    first, second = openai_server.received
    assert first["_path"] == "/v1/chat/completions"
    assert first["_authorization"] == "Bearer sk-test-123"
    assert first["model"] == "test-model"
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]
    # The second request carries the tool's result back, answering the call by its id.
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}


def test_a_provider_without_its_key_is_refused_with_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(AgentloopError) as e:
        Agent(model="anthropic:claude-sonnet-4-5")
    assert e.value.code == "model.missing_api_key"
    with pytest.raises(ValueError):
        Agent(model="gpt-4.1-mini")


def test_the_model_keys_reach_the_request_and_a_forced_choice_is_released_after_a_call(
    openai_server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_SERVER_KEY", "sk-test-123")
    agent = Agent(
        model=Provider(
            "openai",
            "test-model",
            base_url=openai_server.url,
            api_key_env="TEST_SERVER_KEY",
            stream=False,
            temperature=0.0,
            seed=42,
            max_tokens=64,
            tool_choice="add",
        ),
        tools=[add],
    )
    out = agent.run("What is 2 + 3?")
    assert out.stop_reason == "finished", out
    first, second = openai_server.received
    assert first["temperature"] == 0 and first["seed"] == 42
    assert 64 in (first.get("max_tokens"), first.get("max_completion_tokens"))
    assert first["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert second["tool_choice"] == "auto"


def test_a_forced_choice_of_a_tool_the_agent_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_SERVER_KEY", "sk-test-123")
    model = Provider("openai", "m", base_url="http://127.0.0.1:9/v1", api_key_env="TEST_SERVER_KEY", tool_choice="nope")
    with pytest.raises(AgentloopError) as e:
        Agent(model=model, tools=[add])
    assert "nope" in str(e.value)


def _chunk(delta: Dict[str, Any], finish: Any = None, **extra: Any) -> bytes:
    body = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


# Part of an answer, then OpenRouter's error chunk once the response is committed; then a whole one.
STREAMS: List[bytes] = [
    _chunk({"role": "assistant", "content": "Half "})
    + _chunk({"content": "an ans"})
    + _chunk({"content": ""}, "error", error={"code": "server_error", "message": "Provider disconnected"}),
    _chunk({"role": "assistant", "content": "The whole "})
    + _chunk({"content": "answer."})
    + _chunk({}, "stop")
    + b'data: {"id":"c1","object":"chat.completion.chunk","model":"test-model","choices":[],'
    + b'"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}\n\n'
    + b"data: [DONE]\n\n",
]


def serve_in_turn(bodies: List[bytes], served: List[int], content_type: str) -> http.server.ThreadingHTTPServer:
    """A server on loopback answering each request with the next of `bodies` (the last again
    once they run out), noting each answer's size in `served`; shut it down when done."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            body = bodies[min(len(served), len(bodies) - 1)]
            served.append(len(body))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def streaming_agent(
    streams: List[bytes], served: List[int], monkeypatch: pytest.MonkeyPatch
) -> Any:
    """A server answering each request with the next of `streams` as an event stream (see
    `serve_in_turn`), and an agent of it."""
    server = serve_in_turn(streams, served, "text/event-stream")
    monkeypatch.setenv("TEST_SERVER_KEY", "sk-test-123")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    return server, Agent(model=Provider("openai", "test-model", base_url=url, api_key_env="TEST_SERVER_KEY"))


def streamed(server: http.server.ThreadingHTTPServer, agent: Agent) -> Any:
    """The events of a run of `agent` streamed to its end, and its outcome; `server` shut down
    after."""

    async def main() -> Any:
        stream = agent.stream("Go.")
        events = [e async for e in stream]
        return events, stream.outcome

    try:
        return asyncio.run(main())
    finally:
        server.shutdown()


def test_a_stream_that_fails_part_way_is_retried_and_the_events_say_its_text_was_discarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: List[int] = []
    server, agent = streaming_agent(STREAMS, served, monkeypatch)
    events, outcome = streamed(server, agent)
    assert len(served) == 2
    assert outcome is not None and outcome.stop_reason == "finished", outcome
    assert outcome.output == "The whole answer."
    types = [e.type for e in events]
    retry = types.index("model_retrying")
    before = "".join(e.text or "" for e in events[:retry] if e.type == "text_delta")
    after = "".join(e.text or "" for e in events[retry:] if e.type == "text_delta")
    assert (before, after) == ("Half an ans", "The whole answer.")
    data = events[retry].data
    assert data["code"] == "model.server_error" and data["retry"] == 1
    assert data["discarded"] == {"text_chars": 11, "reasoning_chars": 0, "tool_calls": 0}
    assert outcome.usage.input_tokens == 12 and outcome.usage.output_tokens == 5


def test_an_answers_warning_is_in_the_outcome_and_its_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream that ends with [DONE] and no finish reason still answers, and says so."""
    body = (
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"test-model","choices":'
        + b'[{"index":0,"delta":{"role":"assistant","content":"Done."},"finish_reason":null}]}\n\n'
        + b"data: [DONE]\n\n"
    )
    server, agent = streaming_agent([body], [], monkeypatch)
    events, outcome = streamed(server, agent)
    assert outcome is not None and outcome.stop_reason == "finished", outcome
    assert outcome.output == "Done."
    assert len(outcome.warnings) == 1, outcome.warnings
    assert outcome.warnings[0].startswith("model answer in turn 1: "), outcome.warnings
    assert "no finish_reason" in outcome.warnings[0]
    responses = [e for e in events if e.type == "model_response"]
    assert [r.data.get("warnings") for r in responses] == [["the stream ended with [DONE] but no finish_reason"]]


def test_anthropics_prompt_cache_writes_are_in_the_usage_as_the_clis(monkeypatch: pytest.MonkeyPatch) -> None:
    """``outcome.usage`` is the CLI's ``usage`` field for field: the tokens written to the prompt
    cache (Anthropic's ``cache_creation_input_tokens``) are ``cache_write_tokens``."""
    reply = json.dumps(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Cached."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 12,
                "cache_creation_input_tokens": 300,
                "cache_read_input_tokens": 40,
                "output_tokens": 3,
            },
        }
    ).encode()
    server = serve_in_turn([reply], [], "application/json")
    monkeypatch.setenv("TEST_SERVER_KEY", "sk-test-123")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        model = Provider("anthropic", "claude-sonnet-4-5", base_url=url, api_key_env="TEST_SERVER_KEY", stream=False)
        outcome = Agent(model=model).run("hi")
    finally:
        server.shutdown()
    assert outcome.stop_reason == "finished", outcome
    assert outcome.raw["usage"]["cache_write_tokens"] == 300, outcome.raw["usage"]
    assert outcome.usage.cache_write_tokens == 300
    assert outcome.usage.cached_input_tokens == 40
