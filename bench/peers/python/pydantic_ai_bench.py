"""pydantic-ai's side of the loop benchmark: its FunctionModel answers T turns of K calls of an
async no-op tool (raw JSON argument strings), then a final text; see common.py."""

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from common import Counters, call_id, measure, parse_args, raw_arguments, turn_after

args = parse_args()
counters = Counters()


async def respond(messages, info: AgentInfo) -> ModelResponse:
    counters.model_calls += 1
    last_id = None
    for part in reversed(messages[-1].parts):
        if isinstance(part, ToolReturnPart):
            last_id = part.tool_call_id
            break
    turn = turn_after(last_id)
    if turn >= args.turns:
        return ModelResponse(parts=[TextPart("done")])
    return ModelResponse(parts=[
        ToolCallPart(tool_name="noop", args=raw_arguments(turn, k), tool_call_id=call_id(turn, k))
        for k in range(args.calls)
    ])


agent = Agent(FunctionModel(respond), instructions="You are a benchmark.")


@agent.tool_plain
async def noop(turn: int, k: int, note: str) -> str:
    """Does nothing and says ok."""
    counters.tool_executions += 1
    return "ok"


async def run_once():
    result = await agent.run("Call the no-op tool as told.")
    assert result.output == "done", result.output


measure("pydantic-ai (FunctionModel)", ["pydantic-ai-slim"], run_once, counters, args)
