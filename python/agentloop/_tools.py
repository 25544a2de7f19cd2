"""Tools: plain Python functions, sync or async, and how their calls run.

The Rust runtime admits a batch of calls (arguments validated against the schema, limits and
permissions checked) and hands each admitted call to :class:`Dispatcher`, which starts it and
returns at once: a coroutine on the run's event loop (the caller's, for ``run_async`` and
``stream``; the package's own background loop for ``run``), a sync function on a daemon thread
(an awaitable it returns is awaited on the run's loop too).
Neither ever blocks the runtime or another run. The answer goes back through the call's reply."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import datetime
import enum
import inspect
import json
import logging
import queue
import sys
import threading
import traceback
import weakref
from types import FrameType
from typing import (
    Any,
    Awaitable,
    Callable,
    Coroutine,
    Dict,
    List,
    Optional,
    Tuple,
    TypeVar,
    Union,
    overload,
)

from ._schema import Signature, describe, name_of
from .errors import FatalToolError, ToolError

log = logging.getLogger("agentloop")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: The code of a tool call whose function raised an exception other than :class:`ToolError`.
EXCEPTION_CODE = "tool.exception"

#: The code of a tool call whose answer could not be handed to the runtime (a pydantic model
#: whose ``model_dump_json`` raises, an exception whose ``str()`` raises, ...).
OUTPUT_INVALID_CODE = "tool.output_invalid"


@dataclasses.dataclass(frozen=True)
class Tool:
    """A Python function as a tool: its name, description and argument schema, and its policies.
    Made by :func:`tool`; a plain function given to an agent is wrapped with the defaults."""

    fn: Callable[..., Any]
    name: str
    description: str
    schema: Dict[str, Any]
    idempotent: bool = False
    sequential: bool = False
    timeout: Optional[float] = None
    retries: int = 0
    ask: bool = False
    convert: Callable[[Dict[str, Any]], Dict[str, Any]] = dataclasses.field(
        default=lambda a: a, repr=False, compare=False
    )

    @property
    def is_async(self) -> bool:
        """True for a coroutine function (or an object whose ``__call__`` is one): it runs on the
        run's event loop."""
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None)
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def definition(self) -> Dict[str, Any]:
        """What the runtime registers."""
        return {
            "name": self.name,
            "description": self.description,
            "schema": json.dumps(self.schema),
            "idempotent": self.idempotent,
            "sequential": self.sequential,
            "timeout": self.timeout,
            "retries": self.retries,
            "ask": self.ask,
            "is_async": self.is_async,
        }


@overload
def tool(fn: F) -> Tool: ...


@overload
def tool(
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    idempotent: bool = False,
    sequential: bool = False,
    timeout: Optional[float] = None,
    retries: int = 0,
    ask: bool = False,
) -> Callable[[F], Tool]: ...


def tool(
    fn: Optional[F] = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    idempotent: bool = False,
    sequential: bool = False,
    timeout: Optional[float] = None,
    retries: int = 0,
    ask: bool = False,
) -> Union[Tool, Callable[[F], Tool]]:
    """Makes a function a tool. Its JSON Schema comes from its type hints, its description and
    its parameters' descriptions from its docstring (Google ``Args:`` or Sphinx ``:param:``).

    ``idempotent``: safe to run again with the same arguments (a resumed run re-runs it when it
    was in flight at a crash; otherwise the model reads that it was interrupted).
    ``sequential``: never runs beside other calls of its batch. ``timeout``: seconds an attempt
    may take (then the model reads ``timeout``). ``retries``: more attempts after a failure.
    ``ask``: each call needs a person's approval (the agent's ``approve`` callback; without one
    the call is denied, or a journaled run suspends until :meth:`Agent.answer` records it).
    ``name``: the tool's name, the function's when unset (``None``); an empty one is a
    ``ValueError``, as the runtime refuses it (``tool.invalid_name``)."""

    # Refused here, where it is written: falling back to the function's name would register a
    # tool under a name the caller did not give.
    if name is not None and not name:
        raise ValueError(
            'tool.invalid_name: invalid tool name "": the name is empty '
            "(leave name unset to name the tool after its function)"
        )

    # The scope the tool is made in: its annotations may name its local classes.
    localns = _caller_locals()

    def wrap(f: F) -> Tool:
        sig: Signature = describe(f, description, localns)
        return Tool(
            fn=f,
            name=name_of(f) if name is None else name,
            description=sig.description,
            schema=sig.schema,
            idempotent=idempotent,
            sequential=sequential,
            timeout=timeout,
            retries=retries,
            ask=ask,
            convert=sig.convert,
        )

    if fn is not None:
        return wrap(fn)
    return wrap


def _caller_locals() -> Optional[Dict[str, Any]]:
    """The local names of the user's function that made the tool (with :func:`tool`, or giving
    the function to an :class:`Agent`); ``None`` at a module's level, whose names are the
    function's globals already."""
    try:
        frame: Optional[FrameType] = sys._getframe(2)
    except (AttributeError, ValueError):  # an interpreter without frames
        return None
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("agentloop."):
        frame = frame.f_back
    if frame is None or frame.f_globals is frame.f_locals:
        return None
    return dict(frame.f_locals)


def as_tool(t: Union[Tool, Callable[..., Any]]) -> Tool:
    """A tool as given, or a plain function made one with the default policies."""
    return t if isinstance(t, Tool) else tool(t)


#: The package's event loops (:func:`background_loop`), by level.
_loops: List[asyncio.AbstractEventLoop] = []
_lock = threading.Lock()


#: A sync call waiting for a thread: its future, the function and its arguments.
_Work = Tuple["concurrent.futures.Future[None]", Callable[..., None], Tuple[Any, ...]]


class _ToolThreads:
    """The threads sync tools run on: daemon threads, one per call running (an idle one is
    reused, and leaves after a minute idle). Unbounded on purpose: a call that blocks past its
    timeout keeps its thread (Python cannot stop a thread), and in a bounded pool a few such calls
    would leave every later sync call of the process waiting for a free one; and daemon, so that
    such a call does not keep the process from exiting (a ``ThreadPoolExecutor`` joins its threads
    at exit, however long they block)."""

    IDLE_SECONDS = 60.0

    def __init__(self) -> None:
        self._work: "queue.SimpleQueue[_Work]" = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> "concurrent.futures.Future[None]":
        """Runs ``fn(*args)`` on a thread; its future, cancelled before it starts, never runs it."""
        future: "concurrent.futures.Future[None]" = concurrent.futures.Future()
        with self._lock:
            self._work.put((future, fn, args))
            if self._idle > 0:
                self._idle -= 1
                return future
        threading.Thread(target=self._serve, name="agentloop-tool", daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            try:
                future, fn, args = self._work.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    # Leave only when nothing waits: work put meanwhile counted on this thread.
                    if self._idle > 0 and self._work.empty():
                        self._idle -= 1
                        return
                continue
            if future.set_running_or_notify_cancel():
                try:
                    fn(*args)
                    future.set_result(None)
                except BaseException as e:  # noqa: BLE001 - the call's own failure is answered by fn
                    # Kept without its traceback: the traceback's frames hold the call's reply,
                    # and the runtime holds this future while it waits for that reply; with them
                    # a reply never sent would never be dropped either, and the run would wait
                    # for it forever instead of reading that the call never answered.
                    future.set_exception(e.with_traceback(None))
            del future, fn, args
            with self._lock:
                self._idle += 1


_threads = _ToolThreads()


def background_loop(level: int = 0) -> asyncio.AbstractEventLoop:
    """The package's own event loop, on a daemon thread: where coroutine tools of a blocking
    ``run`` execute. ``level`` > 0: another such loop, for the runs a coroutine tool of level - 1
    starts with the blocking ``run`` (see :func:`loop_for_blocking_run`)."""
    with _lock:
        while len(_loops) <= level:
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name=f"agentloop-loop-{len(_loops)}", daemon=True
            ).start()
            _loops.append(loop)
        return _loops[level]


def on_run_loop(
    coro: "Coroutine[Any, Any, T]", run_loop: Optional[asyncio.AbstractEventLoop]
) -> "concurrent.futures.Future[T]":
    """Runs ``coro``, the user's code of a run (an async model's answer, a sync tool's
    awaitable), on the run's loop, and gives its future: ``run_loop`` when the run has one (the
    caller's for ``run_async`` and ``stream``, whose objects that code may await; for a blocking
    ``run`` started by a coroutine tool of another, the package's next loop), else the package's
    first loop (a blocking ``run``'s)."""
    loop = run_loop if run_loop is not None else background_loop()
    try:
        return asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed: the coroutine never runs
        coro.close()
        raise


def loop_for_blocking_run() -> Optional[asyncio.AbstractEventLoop]:
    """Where the coroutine tools of a blocking ``run`` started on this thread go: the package's
    first loop (``None``: the runtime asks for it when a tool needs it), unless this thread runs
    one of the package's loops (a coroutine tool of a blocking run runs an agent with ``run``):
    that loop waits for the run and could not run its tools, so the next one does."""
    running = asyncio._get_running_loop()
    if running is None:
        return None
    with _lock:
        level = next((i for i, loop in enumerate(_loops) if loop is running), None)
    return None if level is None else background_loop(level + 1)


class RunScope:
    """What the tool calls of one run share: its event loop (``loop``: the caller's for
    ``run_async`` and ``stream``; ``None`` for the package's first one), and the tracebacks of
    those that failed, by run and call id, until the run ends. Its outcome then takes them (:meth:`take`), whatever way it ended
    (finished, failed, cancelled, a limit), and a call that fails later (one the run stopped
    waiting for: Python cannot stop a thread) leaves nothing: no traceback outlives its run, or
    shows in another's outcome (a resumed run keeps its id)."""

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._tracebacks: Dict[Tuple[str, str], str] = {}
        self._ended = False

    def add(self, key: Tuple[str, str], tb: str) -> None:
        """Keeps a failed call's traceback, unless the run has ended."""
        with self._lock:
            if not self._ended:
                self._tracebacks[key] = tb

    def take(self) -> Dict[Tuple[str, str], str]:
        """Ends the run: the tracebacks kept, handed out once; none is kept after."""
        with self._lock:
            self._ended = True
            taken, self._tracebacks = self._tracebacks, {}
        return taken

    def kept(self) -> Dict[Tuple[str, str], str]:
        """The tracebacks kept so far."""
        with self._lock:
            return dict(self._tracebacks)


class Dispatcher:
    """Starts the calls of one agent's tools. Each failed call's traceback goes to its run's
    :class:`RunScope`, for the operator (:attr:`ToolCallRecord.traceback`)."""

    def __init__(self, tools: List[Tool]) -> None:
        self.tools = tools
        # Weak: a run nobody reads the end of (its waiter interrupted) takes its scope with it.
        self._runs: "weakref.WeakSet[RunScope]" = weakref.WeakSet()
        self._runs_lock = threading.Lock()

    def run_scope(self, loop: Optional[asyncio.AbstractEventLoop]) -> RunScope:
        """The scope of a run about to start on ``loop`` (see :class:`RunScope`)."""
        scope = RunScope(loop)
        with self._runs_lock:
            self._runs.add(scope)
        return scope

    @property
    def tracebacks(self) -> Dict[Tuple[str, str], str]:
        """The tracebacks the runs not ended yet keep, by run and call id."""
        with self._runs_lock:
            runs = list(self._runs)
        kept: Dict[Tuple[str, str], str] = {}
        for scope in runs:
            kept.update(scope.kept())
        return kept

    def __call__(
        self,
        index: int,
        arguments: Dict[str, Any],
        run_id: str,
        call_id: str,
        reply: Any,
        scope: Optional[RunScope] = None,
    ) -> "concurrent.futures.Future[None]":
        """Starts a call of a sync function on a thread of its own; the runtime cancels the future
        it gets back when it stops waiting."""
        t = self.tools[index]
        return _threads.submit(self._run_sync, t, arguments, (run_id, call_id), reply, scope)

    def start_async(
        self,
        index: int,
        arguments: Dict[str, Any],
        run_id: str,
        call_id: str,
        reply: Any,
        scope: Optional[RunScope] = None,
    ) -> "Optional[asyncio.Task[None]]":
        """Starts a call of a coroutine function, on the running loop's thread (the runtime
        hands it a batch's calls at once): as a task, begun at once where Python can (3.12's
        eager tasks: a coroutine that never waits finishes here and ``None`` is returned)."""
        t = self.tools[index]
        coro = self._run_async(t, arguments, (run_id, call_id), reply, scope)
        loop = asyncio.get_running_loop()
        if sys.version_info >= (3, 12):
            task = asyncio.Task(coro, loop=loop, eager_start=True)
            return None if task.done() else task
        # Before 3.12 the first step is left to the loop: run outside a task, a coroutine would
        # find no current task, and ``asyncio.timeout`` or a ``TaskGroup`` in the tool would fail.
        return loop.create_task(coro)

    def _run_sync(
        self,
        t: Tool,
        arguments: Dict[str, Any],
        key: Tuple[str, str],
        reply: Any,
        scope: Optional[RunScope],
    ) -> None:
        try:
            try:
                result = t.fn(**t.convert(arguments))
                if inspect.isawaitable(result):
                    # A sync callable that returns an awaitable (a wrapper of a coroutine
                    # function): its answer is what the awaitable gives, awaited on the run's loop.
                    run_loop = scope.loop if scope is not None else None
                    result = on_run_loop(_awaited(result), run_loop).result()
            except BaseException as e:  # noqa: BLE001 - every failure is the model's to read
                self._failed(t, e, key, reply, scope)
                return
            _answer(reply, result)
        except BaseException as e:  # noqa: BLE001 - see _unanswered
            _unanswered(t, key, reply, e)

    async def _run_async(
        self,
        t: Tool,
        arguments: Dict[str, Any],
        key: Tuple[str, str],
        reply: Any,
        scope: Optional[RunScope],
    ) -> None:
        try:
            result = await t.fn(**t.convert(arguments))
        except asyncio.CancelledError:
            # Answered before the task ends cancelled: the run may still wait for the call (a
            # tool that awaited a future someone else cancelled raises this too, unasked), and
            # an unanswered call would hold it until its deadline, or forever without one.
            reply.error("cancelled", "CancelledError: the tool's task was cancelled")
            raise
        except BaseException as e:  # noqa: BLE001
            try:
                self._failed(t, e, key, reply, scope)
            except BaseException as failed:  # noqa: BLE001 - see _unanswered
                _unanswered(t, key, reply, failed)
            return
        try:
            _answer(reply, result)
        except BaseException as e:  # noqa: BLE001 - see _unanswered
            _unanswered(t, key, reply, e)

    def _failed(
        self, t: Tool, e: BaseException, key: Tuple[str, str], reply: Any, scope: Optional[RunScope]
    ) -> None:
        if isinstance(e, ToolError):
            # Any code the tool gave (``ToolError(404, ...)``) is its text.
            reply.error(str(e.code), str(e.message))
        elif isinstance(e, FatalToolError):
            if scope is not None:
                scope.add(key, traceback.format_exc())
            reply.fatal(f"{type(e).__name__}: {e}")
        else:
            tb = traceback.format_exc()
            if scope is not None:
                scope.add(key, tb)
            log.warning("tool %s (call %s) raised:\n%s", t.name, key[1], tb)
            reply.error(EXCEPTION_CODE, f"{type(e).__name__}: {e}")


def _unanswered(t: Tool, key: Tuple[str, str], reply: Any, e: BaseException) -> None:
    """A call whose answer (its result, or its failure) could not be handed over: the model reads
    ``tool.output_invalid``, in text that cannot fail in turn (ASCII), and the operator the
    traceback. Unanswered, the call would hold its run until its deadline, or forever."""
    try:
        log.warning(
            "tool %s (call %s): its answer could not be handed over:\n%s",
            t.name,
            key[1],
            traceback.format_exc(),
        )
    except BaseException:  # noqa: BLE001 - the answer below matters more than the log
        pass
    try:
        what = f"{type(e).__name__}: {e}"
    except BaseException:  # noqa: BLE001 - an exception whose str() raises
        what = type(e).__name__
    text = f"the tool's answer could not be handed over: {what}"
    reply.error(OUTPUT_INVALID_CODE, text.encode("ascii", "backslashreplace").decode("ascii"))


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _answer(reply: Any, result: Any) -> None:
    if isinstance(result, str):
        reply.text(result)
        return
    dump = getattr(result, "model_dump_json", None)  # a pydantic model
    if callable(dump):
        reply.json(dump())
        return
    try:
        reply.json(json.dumps(result, default=_json_value, allow_nan=False))
    except (TypeError, ValueError) as e:
        reply.error("tool.output_not_json", f"the tool's result is not JSON: {e}")


def _json_value(value: Any) -> Any:
    """The JSON form of what ``json`` cannot write, wherever it is in a tool's result (a list of
    dataclasses, a dict of enums): pydantic models and dataclasses as objects, enums as their
    values, sets as arrays, dates and times in ISO 8601, bytes as UTF-8 text (else base64), and
    anything else as its ``str``."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return str(value)
