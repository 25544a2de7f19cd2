"""A run's outcome and events as typed Python objects. The outcome is the CLI's ``--json`` object
(``agentloop run --json``), field for field but for ``subagents``, ``compactions``, ``todos`` and
``dry_run``, which only :attr:`RunOutcome.raw` holds; it keeps the object whole."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional

from .errors import RunStopped

#: Every stop reason a run can end with (the CLI's and the Rust core's).
STOP_REASONS = (
    "finished",
    "terminated",
    "max_turns",
    "max_tool_calls",
    "max_model_calls",
    "deadline",
    "budget",
    "stuck_loop",
    "cancelled",
    "failed",
    "truncated",
    "refused",
    "content_filter",
    "guardrail",
    "suspended",
)


@dataclasses.dataclass(frozen=True)
class Usage:
    """Tokens a run spent: the CLI's ``usage``, field for field."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    #: Tokens written to the provider's prompt cache (Anthropic's cache writes, priced apart).
    cache_write_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class CallError:
    """How a tool call failed: a stable code (``tool.exception``, ``invalid_arguments``,
    ``timeout``, ``denied``, ``interrupted``, ...) and what the model read."""

    code: str
    message: str


@dataclasses.dataclass(frozen=True)
class ToolCallRecord:
    """One tool call of the run and how it ended."""

    id: str
    tool: str
    input: Any
    ok: bool
    status: str
    turn: int
    duration_ms: int
    retries: int
    output: Any = None
    error: Optional[CallError] = None
    #: The Python traceback of a tool that raised, for the operator (never sent to the model).
    traceback: Optional[str] = None


def _record(**fields: Any) -> ToolCallRecord:
    """A :class:`ToolCallRecord` of every one of its fields, the same object its ``__init__``
    makes without that frozen ``__init__``'s ``object.__setattr__`` per field: an outcome has one
    record per tool call, and this is most of the cost of reading it."""
    record: ToolCallRecord = object.__new__(ToolCallRecord)
    record.__dict__.update(fields)
    return record


@dataclasses.dataclass(frozen=True)
class LimitHit:
    """The limit that stopped the run."""

    limit: str
    bound: Any
    consumed: Any
    requested: Any = None


@dataclasses.dataclass(frozen=True)
class RunErrorInfo:
    """Why a failed run failed: a stable code and a message."""

    code: str
    message: str


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a run ended. A limit is not an exception: the outcome keeps what was done, and
    :meth:`raise_for_stop` turns any stop but ``finished``/``terminated`` into one."""

    run_id: Optional[str]
    stop_reason: str
    output: Optional[str]
    structured_output: Any
    turns: int
    model_calls: int
    usage: Usage
    cost_usd: Optional[float]
    tool_calls: List[ToolCallRecord]
    limit: Optional[LimitHit]
    error: Optional[RunErrorInfo]
    duration_ms: int
    transcript: List[Dict[str, Any]]
    #: The agent whose answer ended the run: its own, or the one a hand-off (an agent file's
    #: ``[[handoffs]]``) passed the conversation to, at the end of the chain.
    answered_by: Optional[str] = None
    #: The journal of a durable run, and the calls a suspended run waits on.
    journal: Optional[str] = None
    pending_approvals: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    #: What the run noticed without stopping for it: its model answers' warnings (a tool call
    #: cut by the output limit and dropped, a stream that ended without a finish reason), each
    #: naming its turn.
    warnings: List[str] = dataclasses.field(default_factory=list)
    raw: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """True when the run ended with an answer (``finished``) or a tool ended it
        (``terminated``)."""
        return self.stop_reason in ("finished", "terminated")

    def raise_for_stop(self) -> "RunOutcome":
        """This outcome when the run finished, else :class:`RunStopped` with the run error's code
        (or ``stop.<reason>``)."""
        if self.finished:
            return self
        if self.error is not None:
            raise RunStopped(self.error.code, self.error.message, self)
        raise RunStopped(f"stop.{self.stop_reason}", f"the run stopped: {self.stop_reason}", self)

    @classmethod
    def from_json(cls, text: str, tracebacks: Optional[Dict[Any, str]] = None) -> "RunOutcome":
        """The outcome of the runtime's ``--json`` text."""
        return cls.from_raw(json.loads(text), tracebacks)

    @classmethod
    def from_raw(cls, raw: Dict[str, Any], tracebacks: Optional[Dict[Any, str]] = None) -> "RunOutcome":
        """The outcome of the runtime's ``--json`` object, already parsed (kept as :attr:`raw`)."""
        if tracebacks is None:
            tracebacks = {}
        run_id = raw.get("run_id")
        calls = []
        for c in raw.get("tool_calls", []):
            err = c.get("error")
            calls.append(
                _record(
                    id=c["id"],
                    tool=c["tool"],
                    input=c.get("input"),
                    ok=c["ok"],
                    status=c["status"],
                    turn=c.get("turn", 0),
                    duration_ms=c.get("duration_ms", 0),
                    retries=c.get("retries", 0),
                    output=c.get("output"),
                    error=CallError(err.get("code", ""), err.get("message", "")) if err else None,
                    traceback=tracebacks.pop((run_id, c["id"]), None),
                )
            )
        limit = raw.get("limit")
        error = raw.get("error")
        return cls(
            run_id=run_id,
            stop_reason=raw.get("stop_reason") or "failed",
            output=raw.get("output"),
            structured_output=raw.get("structured_output"),
            turns=raw.get("turns", 0),
            model_calls=raw.get("model_calls", 0),
            usage=Usage(**{k: v for k, v in raw.get("usage", {}).items() if k in Usage.__dataclass_fields__}),
            cost_usd=raw.get("cost_usd"),
            tool_calls=calls,
            limit=LimitHit(limit["limit"], limit.get("bound"), limit.get("consumed"), limit.get("requested"))
            if limit
            else None,
            error=RunErrorInfo(error["code"], error["message"]) if error else None,
            duration_ms=raw.get("duration_ms", 0),
            transcript=raw.get("transcript", []),
            answered_by=raw.get("answered_by"),
            journal=raw.get("journal"),
            pending_approvals=raw.get("pending_approvals", []),
            warnings=list(raw.get("warnings") or []),
            raw=raw,
        )


@dataclasses.dataclass(frozen=True)
class Event:
    """An event of a run: ``type`` is the runtime's event name (``run_started``,
    ``turn_started``, ``text_delta``, ``model_retrying``, ``tool_started``, ``tool_finished``,
    ``limit_reached``, ``run_finished``, ...); ``data`` holds its fields. A ``model_retrying``
    event voids the ``text_delta`` events of the model call since its start (or its last
    retry): ``data["discarded"]`` says how much, and the answer is what streams after it."""

    type: str
    run_id: str
    turn: int
    data: Dict[str, Any]

    @classmethod
    def from_json(cls, text: str) -> "Event":
        """The event of the runtime's JSON."""
        raw = json.loads(text)
        kind = raw.pop("event", "unknown")
        return cls(type=kind, run_id=raw.pop("run_id", ""), turn=raw.pop("turn", 0), data=raw)

    @property
    def text(self) -> Optional[str]:
        """A text delta's text."""
        value = self.data.get("text")
        return value if isinstance(value, str) else None
