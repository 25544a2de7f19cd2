"""The native module (Rust, PyO3): what the pure-Python part of the package calls. Users use the
``agentloop`` package's classes instead."""

import concurrent.futures
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

__version__: str

# ``(outcome, None, None)``; ``(None, code, message)`` when nothing ran; ``(outcome, code,
# message)`` when the run ran but its session could not be saved (the save's error). The outcome
# is its JSON text, or with ``objects=True`` the object itself.
_End = Tuple[Optional[Any], Optional[str], Optional[str]]
_OnDone = Callable[[Optional[Any], Optional[str], Optional[str]], None]
# An approval callback: given the requests' JSON and the run's event loop, the answers' words or
# (an async callback) a ``concurrent.futures.Future`` of them.
_Approve = Callable[[str, Any], Union[List[str], "concurrent.futures.Future[List[str]]"]]
# A run's ``scope`` (``agentloop._tools.RunScope``) goes with each of its tool calls to the
# dispatcher, as its last argument.

def answer(journal: str, run_id: str, call_id: str, word: str) -> None: ...
def reply(journal: str, run_id: str, call_id: str, json: str) -> None: ...
def _before_exit() -> None:
    """The package's exit hook: wakes of runs from other threads stop, and those under way finish."""

def protect_process() -> None:
    """Makes this process non-dumpable (Linux; nothing elsewhere): no process it starts can read
    its environment or memory. Raises ``AgentloopError`` (``sandbox.protect``) if it cannot."""

# Each method takes any object as its text (its ``str()``), a lone surrogate becoming U+FFFD.
class ToolReply:
    def text(self, text: object) -> None: ...
    def json(self, json: object) -> None: ...
    def error(self, code: object, message: object) -> None: ...
    def fatal(self, message: object) -> None: ...

class RunHandle:
    def cancel(self) -> None: ...
    def taken(self) -> None: ...
    def wait(self, timeout: float) -> Optional[_End]: ...

class NativeAgent:
    def __init__(
        self,
        *,
        name: str,
        instructions: Optional[str],
        model_kind: str,
        model_spec: str,
        model_base: str,
        model_callable: Optional[Callable[[str, str, Any], Any]],
        tools: List[Dict[str, Any]],
        dispatcher: Callable[..., Any],
        limits: str,
        approve: Optional[_Approve] = None,
        otel: bool = False,
        otel_payloads: bool = False,
    ) -> None: ...
    @staticmethod
    def from_file(
        path: str,
        approve: Optional[_Approve] = None,
        tools: List[Dict[str, Any]] = ...,
        dispatcher: Optional[Callable[..., Any]] = None,
        otel: Optional[bool] = None,
        otel_payloads: bool = False,
        journal: Optional[str] = None,
        sessions: Optional[str] = None,
        trace: Optional[str] = None,
    ) -> NativeAgent: ...
    @property
    def name(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def otel(self) -> bool: ...
    def start(
        self,
        input: str,
        *,
        on_done: Optional[_OnDone] = None,
        on_event: Optional[Callable[[str], None]] = None,
        event_loop: Optional[Any] = None,
        journal: Optional[str] = None,
        sessions: Optional[str] = None,
        session: Optional[str] = None,
        trace: Optional[str] = None,
        trace_payloads: bool = False,
        objects: bool = False,
        scope: Optional[Any] = None,
        stream_backlog: bool = False,
    ) -> RunHandle: ...
    def resume(
        self,
        run_id: str,
        journal: Optional[str] = None,
        *,
        on_done: Optional[_OnDone] = None,
        on_event: Optional[Callable[[str], None]] = None,
        event_loop: Optional[Any] = None,
        force: bool = False,
        trace: Optional[str] = None,
        trace_payloads: bool = False,
        objects: bool = False,
        scope: Optional[Any] = None,
    ) -> RunHandle: ...
    def close(self) -> None: ...
