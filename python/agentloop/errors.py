"""The exceptions of agentloop. Each carries the stable code of the Rust runtime's error (the
same codes the CLI prints), so callers match on ``e.code``, never on the message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Tuple

if TYPE_CHECKING:  # the outcome's module imports this one
    from ._outcome import RunOutcome


class AgentloopError(Exception):
    """An error of the runtime: an agent that cannot be built, a journal or session that cannot be
    read, a run that cannot be resumed. ``code`` is the stable code (``agent_file.invalid``,
    ``journal.unknown_run``, ``config.unpriced_model``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> Tuple[Any, ...]:
        # Pickled (multiprocessing, a process pool) and copied with its code and message: the
        # default would call ``__init__`` with the one joined text.
        return (type(self), (self.code, self.message), self.__dict__)


class RunStopped(AgentloopError):
    """A run that did not finish, raised by :meth:`RunOutcome.raise_for_stop`. ``code`` is the
    run error's code (``model.authentication``, ``model.refused``, ``limit.reached`` for a limit,
    ``run.deadline``, ``run.cancelled``, ...), else ``stop.<reason>`` for a stop that has no
    error (``stop.suspended``); ``outcome`` is the whole outcome."""

    def __init__(self, code: str, message: str, outcome: "RunOutcome") -> None:
        super().__init__(code, message)
        self.outcome: "RunOutcome" = outcome

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self.code, self.message, self.outcome), self.__dict__)


class SessionNotSaved(AgentloopError):
    """A run of a stored conversation (``run(..., session=...)``) that ran, but whose session
    could not be written afterwards (a full disk, a store another program holds past its busy
    timeout). ``code`` is the session error's (``session.io``); ``outcome`` is the run's whole
    outcome: it happened (its tools ran, its spend is real), only the stored conversation lacks
    this turn. The CLI shows the same run's outcome with this error and exits 10."""

    def __init__(self, code: str, message: str, outcome: "RunOutcome") -> None:
        super().__init__(code, message)
        self.outcome: "RunOutcome" = outcome

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self.code, self.message, self.outcome), self.__dict__)


class ToolError(Exception):
    """Raised by a tool: the model reads ``code`` and ``message`` and may recover. Any other
    exception is reported to the model as ``tool.exception`` with its type and message, its
    traceback kept for the operator (:attr:`ToolCallRecord.traceback`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self.code, self.message), self.__dict__)


class FatalToolError(Exception):
    """Raised by a tool: the run cannot go on. It fails (code ``tool.fatal``); the message is for
    the operator, never the model."""
