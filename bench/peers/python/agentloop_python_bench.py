"""agentloop's Python package on the peers' workload: the Rust runtime runs the loop; the model
is a Python function (agentloop.FunctionModel, as pydantic-ai's FunctionModel) and the no-op tool
an async Python function, so every turn pays for its Python callbacks: one model call and K tool
calls on this asyncio loop. See common.py."""

from agentloop import Agent, FunctionModel, Limits, ToolCall, tool

from common import Counters, call_id, measure, parse_args, raw_arguments, turn_after

args = parse_args()
counters = Counters()


def respond(request):
    counters.model_calls += 1
    results = request.last_tool_results()
    turn = turn_after(results[-1]["call_id"] if results else None)
    if turn >= args.turns:
        return "done"
    return [ToolCall("noop", raw_arguments(turn, k), id=call_id(turn, k)) for k in range(args.calls)]


@tool
async def noop(turn: int, k: int, note: str) -> str:
    """Does nothing and says ok."""
    counters.tool_executions += 1
    return "ok"


agent = Agent(
    model=FunctionModel(respond),
    instructions="You are a benchmark.",
    tools=[noop],
    limits=Limits(
        max_turns=args.turns + 1,
        max_tool_calls=args.turns * args.calls,
        max_model_calls=args.turns + 1,
        max_concurrency=args.calls,
    ),
)


async def run_once():
    result = await agent.run_async("Call the no-op tool as told.")
    assert result.output == "done", result


measure("agentloop (Python package)", ["agentloop"], run_once, counters, args)
