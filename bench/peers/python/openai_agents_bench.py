"""The OpenAI Agents SDK's side of the loop benchmark: a custom Model answers T turns of K calls
of an async no-op function tool (raw JSON argument strings), then a final text; see common.py."""

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from common import Counters, call_id, measure, parse_args, raw_arguments, turn_after

args = parse_args()
counters = Counters()
set_tracing_disabled(True)


class ScriptedModel(Model):
    """Reads the turn from the last function call output in its input."""

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **kwargs):
        counters.model_calls += 1
        last_id = None
        if isinstance(input, list):
            for item in reversed(input):
                kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
                if kind == "function_call_output":
                    last_id = item["call_id"] if isinstance(item, dict) else item.call_id
                    break
        turn = turn_after(last_id)
        if turn >= args.turns:
            output = [ResponseOutputMessage(
                id="msg", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text="done", annotations=[])])]
        else:
            output = [ResponseFunctionToolCall(
                type="function_call", id=f"fc_{call_id(turn, k)}", call_id=call_id(turn, k), name="noop",
                arguments=raw_arguments(turn, k), status="completed") for k in range(args.calls)]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *a, **kw):
        raise NotImplementedError("the benchmark does not stream")


@function_tool
async def noop(turn: int, k: int, note: str) -> str:
    """Does nothing and says ok."""
    counters.tool_executions += 1
    return "ok"


agent = Agent(name="bench", instructions="You are a benchmark.", model=ScriptedModel(), tools=[noop],
              model_settings=ModelSettings(parallel_tool_calls=True))


async def run_once():
    result = await Runner.run(agent, "Call the no-op tool as told.", max_turns=args.turns + 5)
    assert result.final_output == "done", result.final_output


measure("OpenAI Agents SDK (custom Model)", ["openai-agents"], run_once, counters, args)
