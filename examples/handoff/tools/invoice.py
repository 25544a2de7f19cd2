"""An invoice by its number, from a small table: reads {"number": N} on stdin, prints JSON."""
import json
import sys

INVOICES = {
    7: {"number": 7, "charges": [{"amount": 49.0, "currency": "EUR", "on": "2026-11-28"}] * 2},
    8: {"number": 8, "charges": [{"amount": 12.5, "currency": "EUR", "on": "2026-11-30"}]},
}

number = json.load(sys.stdin)["number"]
if number not in INVOICES:
    print(f"no invoice {number}", file=sys.stderr)
    sys.exit(2)
print(json.dumps(INVOICES[number]))
