"""convert_temperature: reads {"celsius": number, "to": "fahrenheit" | "kelvin"} as JSON on stdin
and prints the converted value. An unknown unit is an error (stderr, exit status 2)."""
import json
import sys

args = json.load(sys.stdin)
celsius = float(args["celsius"])
unit = str(args["to"]).strip().lower()
if unit == "fahrenheit":
    print(f"{celsius * 9 / 5 + 32:.1f}")
elif unit == "kelvin":
    print(f"{celsius + 273.15:.2f}")
else:
    print(f"unknown unit {unit!r}: use 'fahrenheit' or 'kelvin'", file=sys.stderr)
    sys.exit(2)
