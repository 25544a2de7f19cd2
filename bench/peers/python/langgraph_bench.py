"""LangGraph's side of the loop benchmark: create_react_agent over a fake chat model that answers
T turns of K calls of an async no-op tool, then a final text; see common.py. The calls arrive as
provider-style `tool_calls` with raw JSON argument strings, which langchain-core parses."""

import warnings
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent

from common import Counters, call_id, measure, parse_args, raw_arguments, turn_after

args = parse_args()
counters = Counters()


class FakeToolCallingChatModel(BaseChatModel):
    """A fake chat model: reads the turn from the last ToolMessage; `bind_tools` is a no-op and
    the async path calls the sync one (no thread-pool hop)."""

    @property
    def _llm_type(self) -> str:
        return "fake-tool-calling"

    def bind_tools(self, tools: Any, **kwargs: Any):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        counters.model_calls += 1
        last = messages[-1] if messages else None
        turn = turn_after(last.tool_call_id if isinstance(last, ToolMessage) else None)
        if turn >= args.turns:
            message = AIMessage(content="done")
        else:
            message = AIMessage(content="", additional_kwargs={"tool_calls": [
                {"id": call_id(turn, k), "type": "function",
                 "function": {"name": "noop", "arguments": raw_arguments(turn, k)}}
                for k in range(args.calls)]})
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return self._generate(messages, stop=stop, **kwargs)


@tool
async def noop(turn: int, k: int, note: str) -> str:
    """Does nothing and says ok."""
    counters.tool_executions += 1
    return "ok"


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    graph = create_react_agent(FakeToolCallingChatModel(), [noop], prompt="You are a benchmark.")


async def run_once():
    state = await graph.ainvoke({"messages": [("user", "Call the no-op tool as told.")]},
                                config={"recursion_limit": 2 * args.turns + 10})
    assert state["messages"][-1].content == "done", state["messages"][-1]


measure("LangGraph (create_react_agent + fake chat model)", ["langgraph", "langchain-core"], run_once, counters, args)
