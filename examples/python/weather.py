"""A small agent with two Python tools, runnable with no key: a scripted model stands in for a
real one (swap in model="openai:gpt-4.1-mini" with $OPENAI_API_KEY set, or a local server with
agentloop.Provider("openai", "local", base_url="http://127.0.0.1:8080/v1")).

    pip install ./python        # from the repository's root; needs a Rust toolchain
    python examples/python/weather.py
"""

from __future__ import annotations

import asyncio

from agentloop import Agent, Limits, ScriptedModel, ToolCall, ToolError, tool

STATIONS = {"paris": (18, "light rain"), "lisbon": (23, "sunny")}


@tool(idempotent=True, timeout=10)
async def get_weather(city: str) -> dict:
    """The current weather of a city: temperature in Celsius and the sky.

    Args:
        city: The city's name, e.g. Paris.
    """
    try:
        celsius, sky = STATIONS[city.lower()]
    except KeyError:
        raise ToolError("unknown_city", f"no station in {city}") from None
    return {"city": city, "celsius": celsius, "sky": sky}


@tool(idempotent=True)
def convert_temperature(celsius: float, to: str) -> float:
    """Converts a temperature from Celsius.

    Args:
        celsius: The temperature in Celsius.
        to: "fahrenheit" or "kelvin".
    """
    if to == "fahrenheit":
        return round(celsius * 9 / 5 + 32, 1)
    if to == "kelvin":
        return round(celsius + 273.15, 2)
    raise ValueError(f"unknown unit {to!r}")


# What a model would answer, in order: both lookups at once, then both conversions (the first
# misspelt, to show a tool's error going back to the model), then the answer.
script = ScriptedModel(
    [
        [ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Lisbon"})],
        [
            ToolCall("convert_temperature", {"celsius": 18, "to": "farenheit"}),
            ToolCall("convert_temperature", {"celsius": 23, "to": "fahrenheit"}),
        ],
        [ToolCall("convert_temperature", {"celsius": 18, "to": "fahrenheit"})],
        "Lisbon is warmer: 73.4 °F and sunny, against 64.4 °F and light rain in Paris.",
    ]
)

agent = Agent(
    model=script,
    instructions="Answer weather questions with the tools; convert temperatures when asked.",
    tools=[get_weather, convert_temperature],
    limits=Limits(max_turns=6, max_tool_calls=8, timeout=60),
)


async def main() -> None:
    stream = agent.stream("Compare the weather in Paris and Lisbon, in Fahrenheit.")
    async for event in stream:
        if event.type == "tool_finished":
            print(f"  {event.data['tool']}: {event.data['outcome']['status']}")
    outcome = stream.outcome
    assert outcome is not None
    for call in outcome.tool_calls:
        if call.error:
            print(f"  (the model read: {call.error.code}: {call.error.message})")
    print(outcome.output)
    print(f"[{outcome.stop_reason}: {outcome.turns} turns, {len(outcome.tool_calls)} tool calls]")


if __name__ == "__main__":
    asyncio.run(main())
