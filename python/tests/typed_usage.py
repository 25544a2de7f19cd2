"""Not a test: code a user would write, which mypy (strict) checks against the package's types
and stubs in CI, so that the types say what the package does."""

from __future__ import annotations

import asyncio
from typing import List, Optional

from agentloop import (
    Agent,
    AgentloopError,
    ApprovalRequest,
    Event,
    FunctionModel,
    Limits,
    ModelRequest,
    Provider,
    Reply,
    RunOutcome,
    RunStopped,
    ScriptedModel,
    SessionNotSaved,
    ToolCall,
    protect_process,
    tool,
)


@tool(idempotent=True, timeout=5.0)
async def get_weather(city: str) -> str:
    """The weather of a city."""
    return "18"


def answer(request: ModelRequest) -> Reply:
    return Reply(text="done", input_tokens=len(request.messages))


def allow_reads(requests: List[ApprovalRequest]) -> List[bool]:
    return [r.tool == "read" for r in requests]


async def ask_a_person(requests: List[ApprovalRequest]) -> List[str]:
    await asyncio.sleep(0)
    return ["allow_always" if r.tool == "read" else "deny" for r in requests]


def use() -> Optional[str]:
    protect_process()
    agent = Agent(
        model=ScriptedModel([[ToolCall("get_weather", {"city": "Paris"})], "18 °C"]),
        instructions="Answer.",
        tools=[get_weather],
        limits=Limits(max_turns=4),
    )
    out: RunOutcome = agent.run("Weather?")
    codes: List[str] = [c.error.code for c in out.tool_calls if c.error is not None]
    try:
        out.raise_for_stop()
    except RunStopped as e:
        stopped: RunOutcome = e.outcome
        codes.append(stopped.stop_reason)
    try:
        agent.run("Again?", session="alice", sessions="sessions.db")
    except SessionNotSaved as e:
        unsaved: RunOutcome = e.outcome
        codes.append(e.code)
    try:
        Agent(model=Provider("openai", "gpt-4.1-mini", api_key_env="OPENAI_API_KEY"))
    except AgentloopError as e:
        codes.append(e.code)
    Agent(model=FunctionModel(answer))
    Agent(model=FunctionModel(answer), approve=allow_reads)
    Agent(model=FunctionModel(answer), approve=ask_a_person)
    exported: bool = Agent(model=FunctionModel(answer), otel=True, otel_payloads=False).otel

    async def events() -> List[Event]:
        return [e async for e in agent.stream("Again?")]

    asyncio.run(events())
    return out.output if not codes else None
