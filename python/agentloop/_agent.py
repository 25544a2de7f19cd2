"""The agent: a model, instructions, tools and limits, run by the Rust runtime."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import json
import os
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import _agentloop
from ._models import Model, native_model
from ._outcome import Event, RunOutcome
from ._tools import Dispatcher, RunScope, Tool, as_tool, loop_for_blocking_run
from .errors import AgentloopError, SessionNotSaved

PathLike = Union[str, "os.PathLike[str]"]
#: A run's end as the runtime gives it: ``(outcome, None, None)``, the outcome as objects (asked
#: for with ``objects=True``); ``(None, code, message)`` when nothing ran; or ``(outcome, code,
#: message)`` when the run ran but its session could not be saved after it.
_End = Tuple[Optional[Any], Optional[str], Optional[str]]
_OnDone = Callable[[Optional[Any], Optional[str], Optional[str]], None]


@dataclasses.dataclass(frozen=True)
class Limits:
    """Hard bounds of a run. A field left ``None`` keeps the runtime's default (25 turns, 100
    tool calls, 50 model calls, no token, cost or time bound); ``0`` lifts the bound. A run that
    reaches one stops with its stop reason (``max_turns``, ...), keeping what it did."""

    max_turns: Optional[int] = None
    max_tool_calls: Optional[int] = None
    max_model_calls: Optional[int] = None
    max_tokens: Optional[int] = None
    max_cost_usd: Optional[float] = None
    #: Seconds the whole run may take (stop reason ``deadline``).
    timeout: Optional[float] = None
    max_concurrency: Optional[int] = None
    stuck_loop_threshold: Optional[int] = None
    #: ``"stop"`` (the default) or ``"answer"``: one last model call, without tools, for an answer.
    on_limit: Optional[str] = None

    def to_json(self) -> str:
        """The fields set, in the runtime's names."""
        set_fields: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            # 0 lifts a bound, as in an agent file (the deadline's too, as this class says:
            # not a deadline already passed).
            lifts = f.name == "timeout" or (f.name.startswith("max_") and f.name != "max_concurrency")
            if value == 0 and lifts:
                value = None
            set_fields[f.name] = value
        return json.dumps(set_fields)


@dataclasses.dataclass(frozen=True)
class ApprovalRequest:
    """A tool call that needs a person's approval (an agent file's permission rules ask)."""

    call_id: str
    tool: str
    arguments: Any
    agent: str = ""


#: The answers to approval requests: one per request, ``True``/``"allow"`` runs the call,
#: ``False``/``"deny"`` refuses it, ``"allow_always"``/``"deny_always"`` answers for the tool.
Answers = Sequence[Union[bool, str]]

#: An approval callback: given the requests, their :data:`Answers`. It may be an ``async def``:
#: it is then awaited on the run's event loop (yours for ``run_async`` and ``stream``, the
#: package's own for ``run``), the run waiting for it without blocking that loop. A callback that
#: raises denies the calls it was asked about, its exception their reason.
Approve = Callable[[List[ApprovalRequest]], Union[Answers, Awaitable[Answers]]]


class Agent:
    """An agent: the Rust runtime's loop over a model, instructions, tools (plain Python
    functions) and limits. One agent serves any number of runs, at once or in turn. Calls of a
    tool made with ``ask=True`` go to ``approve`` (see :data:`Approve`); without it they are
    denied, and a journaled run suspends for the answer.

    ``otel=True`` exports every run as OpenTelemetry GenAI spans over OTLP, as ``agentloop run
    --otel`` does: the exporter is set up by the standard ``OTEL_EXPORTER_OTLP_*`` variables
    (endpoint, protocol ``http/protobuf``, ``http/json`` or ``grpc``, headers) and
    ``OTEL_SERVICE_NAME``; a run's spans are sent when it ends, before its outcome is returned.
    ``otel_payloads=True`` records prompts, arguments and answers too (redacted), as
    ``--otel-payloads``."""

    def __init__(
        self,
        model: Model,
        instructions: Optional[str] = None,
        tools: Sequence[Union[Tool, Callable[..., Any]]] = (),
        limits: Optional[Limits] = None,
        name: str = "agent",
        approve: Optional[Approve] = None,
        otel: bool = False,
        otel_payloads: bool = False,
    ) -> None:
        self.tools: List[Tool] = [as_tool(t) for t in tools]
        self._dispatcher = Dispatcher(self.tools)
        kind, spec, base, call = native_model(model)
        self._native = _agentloop.NativeAgent(
            name=name,
            instructions=instructions,
            model_kind=kind,
            model_spec=spec,
            model_base=base,
            model_callable=call,
            tools=[t.definition() for t in self.tools],
            dispatcher=self._dispatcher,
            limits=(limits if limits is not None else Limits()).to_json(),
            approve=_approval_callback(approve) if approve is not None else None,
            otel=otel,
            otel_payloads=otel_payloads,
        )

    @classmethod
    def from_file(
        cls,
        path: PathLike,
        approve: Optional[Approve] = None,
        tools: Sequence[Union[Tool, Callable[..., Any]]] = (),
        otel: Optional[bool] = None,
        otel_payloads: bool = False,
        *,
        journal: Optional[PathLike] = None,
        sessions: Optional[PathLike] = None,
        trace: Optional[PathLike] = None,
    ) -> "Agent":
        """The agent of an agent file (``agent.toml``), exactly as ``agentloop run`` builds it:
        its model, command, built-in, MCP and subagent tools, limits and permissions, with
        ``tools`` (Python functions) beside the file's, under the same permissions (name one in
        the file's ``[permissions]`` to have it asked about; ``ask=True`` is refused here). A
        call its permissions ask about goes to ``approve``; with none it is denied, and a
        journaled run suspends instead (resume it once the answer is recorded). Its runs are
        exported as OpenTelemetry spans when the file says ``otel = true`` (``otel`` given
        overrides the file; see :class:`Agent`). When the file's tools (or its subagents' and
        hand-offs') can start processes (command tools, ``shell``, stdio MCP servers), this
        process is first made non-dumpable, as ``agentloop`` makes itself: see
        :func:`agentloop.protect_process`.

        ``journal``, ``sessions`` and ``trace`` name the stores its runs write, as ``agentloop
        run``'s ``--journal``, ``--sessions`` and ``--trace`` do: its runs write them when they
        name none, and they are kept from the agent's own tools (its file tools refuse them, the
        processes its tools start see them read-only), opened before its MCP servers start and
        held open until :meth:`close` has stopped them. A run given a store the agent's tools
        may write (in the agent file's folder or a tool's root) that was not named here warns
        (``UserWarning``): name it here."""
        agent = cls.__new__(cls)
        agent.tools = [as_tool(t) for t in tools]
        agent._dispatcher = Dispatcher(agent.tools)
        agent._native = _agentloop.NativeAgent.from_file(
            os.fspath(path),
            _approval_callback(approve) if approve is not None else None,
            tools=[t.definition() for t in agent.tools],
            dispatcher=agent._dispatcher,
            otel=otel,
            otel_payloads=otel_payloads,
            journal=os.fspath(journal) if journal is not None else None,
            sessions=os.fspath(sessions) if sessions is not None else None,
            trace=os.fspath(trace) if trace is not None else None,
        )
        return agent

    @property
    def name(self) -> str:
        """The agent's name."""
        return str(self._native.name)

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the agent's definition: a journaled run resumes only with the same."""
        return str(self._native.fingerprint)

    @property
    def otel(self) -> bool:
        """True when its runs are exported as OpenTelemetry spans."""
        return bool(self._native.otel)

    def close(self) -> None:
        """Stops the MCP servers an agent file started and the OpenTelemetry exporter (sending
        the spans that wait), then closes the stores named at :meth:`from_file` (a later run
        opens them for itself); nothing otherwise."""
        self._native.close()

    # --- runs ----------------------------------------------------------------------------------

    def run(
        self,
        input: str,
        *,
        journal: Optional[PathLike] = None,
        session: Optional[str] = None,
        sessions: Optional[PathLike] = None,
        trace: Optional[PathLike] = None,
    ) -> RunOutcome:
        """Runs the agent on ``input`` and waits for the outcome (the GIL is released while it
        waits). ``journal``: a SQLite journal that makes the run durable (resume it with
        :meth:`resume` after a crash). ``session``: go on with the stored conversation of that
        name in ``sessions`` (created on first use; by default the store named at
        :meth:`from_file`, else ``sessions.db``); a turn that ran but could not be saved raises
        :class:`SessionNotSaved`, its ``outcome`` the run's. ``trace``: a trace file of the run,
        as ``agentloop run --trace`` writes (``.ndjson`` or ``.db``; ``agentloop trace`` reads
        it). A journal or trace not given is the one named at :meth:`from_file`, if any. Ctrl-C
        cancels the run."""
        loop = loop_for_blocking_run()
        scope = self._dispatcher.run_scope(loop)
        handle = self._start(input, None, journal, session, sessions, trace, loop, scope=scope)
        return self._wait(handle, scope)

    async def run_async(
        self,
        input: str,
        *,
        journal: Optional[PathLike] = None,
        session: Optional[str] = None,
        sessions: Optional[PathLike] = None,
        trace: Optional[PathLike] = None,
    ) -> RunOutcome:
        """:meth:`run` for asyncio: your coroutines of the run (an async model, coroutine tools
        and a sync tool's awaitable, an async approval callback) run on this event loop, so they
        may await its objects (futures, queues, client sessions made on it). Cancelling the task
        cancels the run (its running tools are cancelled) and raises ``CancelledError`` once it
        has stopped."""
        return await self._on_this_loop(
            lambda on_done, loop, scope: self._start(
                input, on_done, journal, session, sessions, trace, loop, scope=scope
            )
        )

    def stream(
        self,
        input: str,
        *,
        journal: Optional[PathLike] = None,
        session: Optional[str] = None,
        sessions: Optional[PathLike] = None,
        trace: Optional[PathLike] = None,
    ) -> "RunStream":
        """The run's events as they happen: ``async for event in agent.stream(input)``; the
        outcome is ``stream.outcome`` afterwards. Leaving the loop early cancels the run; once
        the iterator is closed (``aclose()``, or when it is collected), ``stream.outcome`` is the
        cancelled run's. A session turn that ran but could not be saved raises
        :class:`SessionNotSaved` from the loop, ``stream.outcome`` set all the same."""
        return RunStream(self, input, journal, session, sessions, trace)

    def resume(self, run_id: str, *, journal: Optional[PathLike] = None, force: bool = False) -> RunOutcome:
        """Goes on with journaled run ``run_id`` (an id or a unique prefix) in this process,
        after its process died or while it was suspended for approval: a finished call never
        runs again; one in flight re-runs only if its tool is idempotent, otherwise the model
        reads that it was interrupted. Refused when the agent's definition changed, unless
        ``force``. ``journal`` defaults to the one named at :meth:`from_file`."""
        loop = loop_for_blocking_run()
        scope = self._dispatcher.run_scope(loop)
        handle = self._native.resume(
            run_id,
            os.fspath(journal) if journal is not None else None,
            event_loop=loop,
            force=force,
            objects=True,
            scope=scope,
        )
        return self._wait(handle, scope)

    async def resume_async(
        self, run_id: str, *, journal: Optional[PathLike] = None, force: bool = False
    ) -> RunOutcome:
        """:meth:`resume` for asyncio."""
        return await self._on_this_loop(
            lambda on_done, loop, scope: self._native.resume(
                run_id,
                os.fspath(journal) if journal is not None else None,
                on_done=on_done,
                event_loop=loop,
                force=force,
                objects=True,
                scope=scope,
            )
        )

    @staticmethod
    def answer(run_id: str, call_id: str, answer: Union[bool, str], *, journal: PathLike) -> None:
        """Records a person's answer to a call a suspended run waits on (``outcome.
        pending_approvals``): ``True``/``"allow"``, ``False``/``"deny"``, ``"allow_always"``,
        ``"deny_always"``. Then :meth:`resume` goes on with the run. A question of the model's
        (an entry with a ``question``) takes :meth:`reply` instead: answering it is refused
        (``approval.invalid``)."""
        word = ("allow" if answer else "deny") if isinstance(answer, bool) else answer
        _agentloop.answer(os.fspath(journal), run_id, call_id, word)

    @staticmethod
    def reply(run_id: str, call_id: str, value: Any, *, journal: PathLike) -> None:
        """Records the user's reply to a question of the model's (the ``ask_user`` built-in) a
        suspended run waits on (an entry of ``outcome.pending_approvals`` with a ``question``):
        ``value`` is any JSON value (text, a number, a dict for a form), checked against the
        question's schema (``answer.invalid`` when it does not match), as ``agentloop answer``
        does. Then :meth:`resume` hands it to the model."""
        _agentloop.reply(os.fspath(journal), run_id, call_id, json.dumps(value))

    # --- plumbing ------------------------------------------------------------------------------

    def _start(
        self,
        input: str,
        on_done: Optional[_OnDone],
        journal: Optional[PathLike],
        session: Optional[str],
        sessions: Optional[PathLike],
        trace: Optional[PathLike] = None,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        on_event: Optional[Callable[[str], None]] = None,
        scope: Optional[RunScope] = None,
        stream_backlog: bool = False,
    ) -> Any:
        return self._native.start(
            input,
            on_done=on_done,
            on_event=on_event,
            stream_backlog=stream_backlog,
            event_loop=loop,
            journal=os.fspath(journal) if journal is not None else None,
            sessions=os.fspath(sessions) if session is not None and sessions is not None else None,
            session=session,
            trace=os.fspath(trace) if trace is not None else None,
            objects=True,
            scope=scope,
        )

    async def _on_this_loop(
        self, start: Callable[[_OnDone, asyncio.AbstractEventLoop, RunScope], Any]
    ) -> RunOutcome:
        """Starts a run with ``start(on_done, loop, scope)`` on the running event loop and awaits
        its outcome; cancelling the awaiting task cancels the run, once it has stopped."""
        loop = asyncio.get_running_loop()
        done: "asyncio.Future[_End]" = loop.create_future()
        scope = self._dispatcher.run_scope(loop)
        handle = start(_settle_on(loop, done), loop, scope)
        try:
            return self._outcome(await _until_done(handle, done), scope)
        except asyncio.CancelledError:
            if done.done() and not done.cancelled():
                self._discard(done.result(), scope)
            raise

    def _wait(self, handle: Any, scope: RunScope) -> RunOutcome:
        try:
            while True:
                end = handle.wait(0.1)
                if end is not None:
                    return self._outcome(end, scope)
        except KeyboardInterrupt:
            handle.cancel()
            while True:
                end = handle.wait(0.1)
                if end is not None:
                    self._discard(end, scope)
                    raise

    def _discard(self, end: _End, scope: RunScope) -> Optional[RunOutcome]:
        """The outcome of a run nobody waits for any more (cancelled by its caller), read all
        the same: the tracebacks its calls left end with it."""
        try:
            return self._outcome(end, scope)
        except SessionNotSaved as e:
            return e.outcome
        except AgentloopError:
            return None

    def _outcome(self, end: _End, scope: RunScope) -> RunOutcome:
        """The run's outcome, with the tracebacks of its failed calls; a run that ended in an
        error drops them (and those of calls that fail later), as a finished one does. A run
        whose session could not be saved after it raises :class:`SessionNotSaved` with its
        outcome: it ran, but the stored conversation lacks it."""
        tracebacks = scope.take()
        raw, code, message = end
        if raw is None:
            raise AgentloopError(code or "run.failed", message or "")
        outcome = RunOutcome.from_raw(raw, tracebacks)
        if code is not None:
            raise SessionNotSaved(code, message or "", outcome)
        return outcome


class RunStream:
    """A run's events, as an async iterator; ``outcome`` once it has ended."""

    def __init__(
        self,
        agent: Agent,
        input: str,
        journal: Optional[PathLike],
        session: Optional[str],
        sessions: Optional[PathLike],
        trace: Optional[PathLike],
    ) -> None:
        self._agent = agent
        self._args = (input, journal, session, sessions, trace)
        self.outcome: Optional[RunOutcome] = None

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        queue: "asyncio.Queue[Tuple[bool, Any]]" = asyncio.Queue()

        def on_event(text: str) -> None:
            _call_soon(loop, queue.put_nowait, (False, text))

        def on_done(raw: Optional[Any], code: Optional[str], message: Optional[str]) -> None:
            _call_soon(loop, queue.put_nowait, (True, (raw, code, message)))

        input, journal, session, sessions, trace = self._args
        scope = self._agent._dispatcher.run_scope(loop)
        # The run waits while 1024 events wait here untaken: a slow reader slows it, and
        # nothing piles up or is lost.
        handle = self._agent._start(
            input, on_done, journal, session, sessions, trace, loop, on_event, scope,
            stream_backlog=True,
        )
        ended = False
        try:
            while True:
                is_end, payload = await queue.get()
                if is_end:
                    ended = True
                    try:
                        self.outcome = self._agent._outcome(payload, scope)
                    except SessionNotSaved as e:
                        # The run happened: its outcome is the stream's all the same.
                        self.outcome = e.outcome
                        raise
                    return
                handle.taken()
                yield Event.from_json(payload)
        finally:
            if not ended:
                # The consumer left early (break, an exception, a cancelled task): the run stops,
                # and its tools with it, before the stream is gone.
                handle.cancel()
                while True:
                    is_end, payload = await queue.get()
                    if is_end:
                        # The cancelled run's outcome (``stop_reason`` ``cancelled``, what it did).
                        self.outcome = self._agent._discard(payload, scope)
                        break


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    if asyncio._get_running_loop() is loop:
        # On the loop's own thread (a run driven there, in one of the loop's callbacks): at once.
        fn(*args)
        return
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def _settle_on(loop: asyncio.AbstractEventLoop, done: "asyncio.Future[_End]") -> _OnDone:
    def settle(raw: Optional[Any], code: Optional[str], message: Optional[str]) -> None:
        def set_result() -> None:
            if not done.done():
                done.set_result((raw, code, message))

        _call_soon(loop, set_result)

    return settle


async def _until_done(handle: Any, done: "asyncio.Future[_End]") -> _End:
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        # The task was cancelled: cancel the run, let it stop (its tools cancelled, every call
        # answered), then let the cancellation go on.
        handle.cancel()
        await done
        raise


def _approval_callback(
    approve: Approve,
) -> Callable[[str, asyncio.AbstractEventLoop], "Union[List[str], concurrent.futures.Future[List[str]]]"]:
    """The callback as the runtime calls it: given the requests' JSON and the run's loop, the
    answers' words, or (an async callback) the future of them, awaited on that loop."""

    def words(answers: Answers) -> List[str]:
        return [("allow" if a else "deny") if isinstance(a, bool) else str(a) for a in answers]

    def ask(
        requests_json: str, loop: asyncio.AbstractEventLoop
    ) -> "Union[List[str], concurrent.futures.Future[List[str]]]":
        requests = [
            ApprovalRequest(r["call_id"], r["tool"], r.get("arguments"), r.get("agent", ""))
            for r in json.loads(requests_json)
        ]
        answers = approve(requests)
        if inspect.isawaitable(answers):
            awaited = answers

            async def later() -> List[str]:
                return words(await awaited)

            return asyncio.run_coroutine_threadsafe(later(), loop)
        return words(answers)

    return ask
