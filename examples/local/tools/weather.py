"""get_weather: the current weather for a city, from a small fixed table (no network).

Arguments: {"city": str, "unit": "celsius" | "fahrenheit" (default celsius)}.
Set WEATHER_FAIL_ONCE to a comma-separated list of cities whose first lookup fails with a
"station temporarily unavailable" error (a marker file in $AGENT_STATE_DIR records that it
failed): a way to watch the agent recover from a tool error. The example agent file runs a failed
lookup once more (`retries = 1`) before the model sees the failure.
"""

import os

from _common import fail, read_args, reply, state_dir

# City -> (temperature in Celsius, conditions).
TABLE = {
    "paris": ("Paris", 18, "partly cloudy"),
    "london": ("London", 12, "light rain"),
    "tokyo": ("Tokyo", 24, "sunny"),
    "new york": ("New York", 21, "clear"),
    "berlin": ("Berlin", 15, "overcast"),
    "madrid": ("Madrid", 29, "sunny"),
    "oslo": ("Oslo", 7, "snow showers"),
    "sydney": ("Sydney", 26, "windy"),
}


def main():
    args = read_args()
    city = args.get("city")
    if not isinstance(city, str) or not city.strip():
        fail("'city' must be a non-empty string")
    unit = args.get("unit", "celsius")
    if unit not in ("celsius", "fahrenheit"):
        fail(f"'unit' must be \"celsius\" or \"fahrenheit\", got {unit!r}")
    key = city.strip().lower()
    row = TABLE.get(key)
    if row is None:
        known = ", ".join(name for name, _, _ in TABLE.values())
        fail(f"no weather data for {city!r}; known cities: {known}")

    flaky = {c.strip().lower() for c in os.environ.get("WEATHER_FAIL_ONCE", "").split(",") if c.strip()}
    if key in flaky:
        marker = os.path.join(state_dir(), f"weather-failed-{key.replace(' ', '_')}")
        if not os.path.exists(marker):
            open(marker, "w").close()
            fail(f"weather station for {row[0]} is temporarily unavailable; try again")

    name, celsius, conditions = row
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
    reply({"city": name, "temperature": temperature, "unit": unit, "conditions": conditions})


if __name__ == "__main__":
    main()
