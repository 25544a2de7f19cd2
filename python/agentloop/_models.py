"""The models an agent can name: a live provider (``"openai:gpt-4.1-mini"`` or
:class:`Provider`), :class:`ScriptedModel` (a fixed script, for tests and demos) and
:class:`FunctionModel` (a Python function answering each request, as pydantic-ai's)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import json
import os
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Union

PROVIDERS = ("openai", "openai-responses", "anthropic")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A tool call a model makes: the tool's name, its arguments (a dict, or a raw JSON string
    sent as it is) and its id (generated when empty)."""

    name: str
    arguments: Union[Dict[str, Any], str] = dataclasses.field(default_factory=dict)
    id: str = ""


@dataclasses.dataclass(frozen=True)
class Reply:
    """One answer of a model: text, tool calls, or both, and the tokens it spent."""

    text: Optional[str] = None
    tool_calls: Sequence[ToolCall] = ()
    input_tokens: int = 0
    output_tokens: int = 0


#: What a scripted step or a function model may answer: text, a list of calls, or a Reply.
Answer = Union[str, Sequence[ToolCall], Reply]


#: An answer as the runtime reads it: text (or ``None``), the calls as ``(id, name, raw JSON
#: arguments)``, input and output tokens. Python objects, not JSON: nothing to encode and decode.
_NativeAnswer = Tuple[Optional[str], List[Tuple[str, str, str]], int, int]


def _raw_arguments(arguments: Any) -> str:
    """A call's arguments as the raw JSON text a provider sends (a string is sent as it is)."""
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return ""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _native_answer(answer: Answer) -> _NativeAnswer:
    """What a function model hands to the runtime for an answer; a script's step is made of it too."""
    if isinstance(answer, str):
        return (answer, [], 0, 0)
    if not isinstance(answer, Reply):
        return (None, [(c.id, c.name, _raw_arguments(c.arguments)) for c in answer], 0, 0)
    calls = [(c.id, c.name, _raw_arguments(c.arguments)) for c in answer.tool_calls]
    return (answer.text, calls, answer.input_tokens, answer.output_tokens)


def _step(answer: Answer) -> Dict[str, Any]:
    """The step of an agent file's script (``script.json``) for an answer."""
    text, calls, input_tokens, output_tokens = _native_answer(answer)
    step: Dict[str, Any] = {}
    if text is not None:
        step["text"] = text
    if calls:
        step["tool_calls"] = [{"id": i, "name": n, "arguments": a} for i, n, a in calls]
    if input_tokens or output_tokens:
        step["usage"] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    return step


class ScriptedModel:
    """A model that answers with ``answers`` in order, then fails (``model.exhausted``). Each run
    of an agent starts the script from its first answer, as each ``agentloop run`` of an agent
    file does: runs one after the other, or at once, each get the whole script (a conversation
    over several runs, with ``session``, is scripted with a :class:`FunctionModel` instead). A
    resumed run goes on where its journal left the script."""

    def __init__(self, answers: Sequence[Answer]) -> None:
        self.script = json.dumps([_step(a) for a in answers])

    def _native(self) -> Tuple[str, str, str, Optional[Callable[..., Any]]]:
        return ("scripted", self.script, os.getcwd(), None)


class ModelRequest:
    """What a function model is asked: the instructions, the transcript (the runtime's messages,
    as dicts) and the tools' specs. The transcript is read from the runtime's JSON when first
    asked for; :meth:`last_tool_results` reads only the results at its end."""

    def __init__(self, request_json: str, tail_json: str = "[]") -> None:
        self._json = request_json
        self._tail_json = tail_json
        self._raw: Optional[Dict[str, Any]] = None

    def _parsed(self) -> Dict[str, Any]:
        if self._raw is None:
            self._raw = json.loads(self._json)
        return self._raw

    @property
    def instructions(self) -> Optional[str]:
        """The agent's instructions."""
        value = self._parsed().get("instructions")
        return value if isinstance(value, str) else None

    @property
    def messages(self) -> List[Dict[str, Any]]:
        """The transcript: ``{"role": "user" | "assistant" | "tool", ...}`` each."""
        return list(self._parsed().get("messages", []))

    @property
    def tools(self) -> List[Dict[str, Any]]:
        """The specs of the tools the model may call."""
        return list(self._parsed().get("tools", []))

    def last_tool_results(self) -> List[Dict[str, Any]]:
        """The tool results at the end of the transcript, in order: a dict each (``call_id``,
        ``tool``, ``content`` as ``{"type": "text", "value": ...}``, ``is_error``)."""
        results: List[Dict[str, Any]] = json.loads(self._tail_json)
        return results


#: A function model: sync, or a coroutine function.
ModelFunction = Callable[[ModelRequest], Union[Answer, Awaitable[Answer]]]


class FunctionModel:
    """A Python function as the model: it gets a :class:`ModelRequest` and answers text, a list
    of :class:`ToolCall`, or a :class:`Reply`. A plain function runs on the thread that drives the
    run (the event loop's for ``run_async`` and ``stream``, the runtime's for ``run``), so keep it
    quick (it is for tests); a coroutine function (``async def``) runs on the run's event loop:
    yours for ``run_async`` and ``stream`` (it may await what belongs to that loop: a future, a
    queue, a client session made on it), the package's own for ``run``; the run waits for it
    without the GIL, and without blocking the loop."""

    def __init__(self, fn: ModelFunction, model_id: str = "function") -> None:
        self.fn = fn
        self.model_id = model_id

    def _call(
        self, request_json: str, tail_json: str, run_loop: Optional[asyncio.AbstractEventLoop] = None
    ) -> "Union[_NativeAnswer, concurrent.futures.Future[_NativeAnswer]]":
        answer = self.fn(ModelRequest(request_json, tail_json))
        if inspect.isawaitable(answer):
            # The runtime awaits the future of the answer: neither the event loop of a run driven
            # there nor a thread of the runtime (a blocking ``run``'s) waits blocked for it.
            return _answer_later(answer, run_loop)
        return _native_answer(answer)

    def _native(self) -> Tuple[str, str, str, Optional[Callable[..., Any]]]:
        return ("function", self.model_id, os.getcwd(), self._call)


def _answer_later(
    answer: Awaitable[Answer], run_loop: Optional[asyncio.AbstractEventLoop]
) -> "concurrent.futures.Future[_NativeAnswer]":
    """An async function model's answer, as a future, awaited on the run's loop (see
    :func:`agentloop._tools.on_run_loop`)."""
    from ._tools import on_run_loop

    async def wait() -> _NativeAnswer:
        return _native_answer(await answer)

    return on_run_loop(wait(), run_loop)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


class Provider:
    """A live model: ``provider`` is ``openai`` (Chat Completions, and any server that speaks it:
    llama.cpp, Ollama, vLLM), ``openai-responses`` or ``anthropic``. The keys are an agent file's
    ``[model]`` keys (``base_url``, ``api_key_env``, ``temperature``, ``max_tokens``, ``seed``,
    ``tool_choice``, ``tool_dialect``, ``price``, ...), read by the same loader as the CLI's and
    applied to the agent as the CLI applies them."""

    def __init__(self, provider: str, name: str, **keys: Any) -> None:
        if provider not in PROVIDERS:
            raise ValueError(f"unknown provider {provider!r}: one of {', '.join(PROVIDERS)}")
        self.provider = provider
        self.name = name
        self.keys = keys

    @classmethod
    def parse(cls, spec: str, **keys: Any) -> "Provider":
        """``"provider:model-name"``, as ``"openai:gpt-4.1-mini"``."""
        provider, sep, name = spec.partition(":")
        if not sep or not name:
            raise ValueError(f"a model is named 'provider:name' (as 'openai:gpt-4.1-mini'), not {spec!r}")
        return cls(provider, name, **keys)

    def toml(self) -> str:
        """An agent file with this model, for the runtime's loader."""
        lines = ['name = "python"', "[model]", f"provider = {_toml_value(self.provider)}", f"name = {_toml_value(self.name)}"]
        for key, value in self.keys.items():
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    def _native(self) -> Tuple[str, str, str, Optional[Callable[..., Any]]]:
        return ("provider", self.toml(), os.getcwd(), None)


#: A model: a provider's ``"provider:name"``, a :class:`Provider`, a script, a function model,
#: or a bare function (sync or ``async def``), taken as a :class:`FunctionModel`.
Model = Union[str, Provider, ScriptedModel, FunctionModel, ModelFunction]


def native_model(model: Model) -> Tuple[str, str, str, Optional[Callable[..., Any]]]:
    """The runtime's description of a model."""
    if isinstance(model, str):
        model = Provider.parse(model)
    elif not isinstance(model, (Provider, ScriptedModel, FunctionModel)):
        model = FunctionModel(model)
    return model._native()
