"""agentloop: bounded, tool-using LLM agents. The loop, the providers, limits, permissions,
journal, sessions and traces are the agentloop Rust runtime's; the tools are your Python
functions.

    from agentloop import Agent, ScriptedModel, ToolCall, tool

    @tool
    def get_weather(city: str) -> str:
        \"\"\"The current temperature of a city, in Celsius.\"\"\"
        return {"Paris": "18"}.get(city, "unknown")

    agent = Agent(
        model=ScriptedModel([[ToolCall("get_weather", {"city": "Paris"})], "18 °C in Paris."]),
        instructions="Answer weather questions with the tools.",
        tools=[get_weather],
    )
    print(agent.run("Weather in Paris?").output)
"""

import atexit as _atexit

from ._agent import Agent, ApprovalRequest, Limits, RunStream
from ._agentloop import __version__, _before_exit, protect_process
from ._models import FunctionModel, ModelRequest, Provider, Reply, ScriptedModel, ToolCall
from ._outcome import (
    STOP_REASONS,
    CallError,
    Event,
    LimitHit,
    RunErrorInfo,
    RunOutcome,
    ToolCallRecord,
    Usage,
)
from ._tools import EXCEPTION_CODE, OUTPUT_INVALID_CODE, Tool, tool
from .errors import AgentloopError, FatalToolError, RunStopped, SessionNotSaved, ToolError

# Before the interpreter finalizes: from then on no thread of the runtime (nor a tool's thread
# waking a run) calls into Python, and those doing so are let finish first; a thread made to
# exit inside such a call as the interpreter finalizes would abort the process.
_atexit.register(_before_exit)

__all__ = [
    "Agent",
    "AgentloopError",
    "ApprovalRequest",
    "CallError",
    "EXCEPTION_CODE",
    "Event",
    "FatalToolError",
    "FunctionModel",
    "LimitHit",
    "Limits",
    "ModelRequest",
    "OUTPUT_INVALID_CODE",
    "Provider",
    "Reply",
    "RunErrorInfo",
    "RunOutcome",
    "RunStopped",
    "RunStream",
    "STOP_REASONS",
    "ScriptedModel",
    "SessionNotSaved",
    "Tool",
    "ToolCall",
    "ToolCallRecord",
    "ToolError",
    "Usage",
    "__version__",
    "protect_process",
    "tool",
]
