# A stdio MCP server of agentloop's own tests and benchmarks, in plain Python (no SDK), with 200
# tools: an action on a subject of a small business's back office each (`list_invoices`,
# `archive_tickets`, ...), and `convert_currency`, which converts an amount at a fixed table of
# rates. Each tool answers with what it was called with; `convert_currency` with the amount
# converted. Used by agentloop-cli's tool-search tests (a tool set too large to send whole) and
# bench/tool_search.py. Argument: the number of tools (default 200, at least 1).
import json, sys

SUBJECTS = [
    ("invoices", "invoice", "the invoices billed to customers"),
    ("customers", "customer", "customer accounts and their contacts"),
    ("orders", "order", "sales orders and their lines"),
    ("shipments", "shipment", "parcels sent to customers and their tracking"),
    ("products", "product", "the product catalog with prices and stock"),
    ("warehouses", "warehouse", "warehouses and the stock each holds"),
    ("employees", "employee", "staff records and their roles"),
    ("payslips", "payslip", "the monthly payslips of the staff"),
    ("tickets", "ticket", "support tickets opened by customers"),
    ("meetings", "meeting", "calendar meetings and their attendees"),
    ("rooms", "room", "meeting rooms and their bookings"),
    ("suppliers", "supplier", "suppliers and their purchase terms"),
    ("contracts", "contract", "signed contracts and their renewal dates"),
    ("expenses", "expense", "expense claims and their receipts"),
    ("budgets", "budget", "department budgets and what is spent"),
    ("leads", "lead", "sales leads and their stage in the pipeline"),
    ("campaigns", "campaign", "marketing campaigns and their results"),
    ("vehicles", "vehicle", "company vehicles and their service history"),
    ("licenses", "license", "software licenses and their seats"),
    ("rates", "rate", "exchange rates between currencies"),
]
ACTIONS = [
    ("list", "Lists {plural}: {about}. Filters by a text and pages through the results."),
    ("get", "Reads one {singular} by its id, with every field: {about}."),
    ("create", "Creates a {singular} from the given fields: {about}."),
    ("update", "Changes fields of one {singular}, by its id: {about}."),
    ("delete", "Deletes one {singular} by its id, for good: {about}."),
    ("search", "Finds {plural} whose fields contain the given words: {about}."),
    ("export", "Exports {plural} as a CSV file for a date range: {about}."),
    ("archive", "Moves {plural} older than a date to the archive: {about}."),
    ("count", "Counts {plural} that match a filter: {about}."),
    ("summarize", "Writes a short report of {plural} over a period: {about}."),
]
RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85, "JPY": 162.0, "CHF": 0.95}

CONVERT = {
    "name": "convert_currency",
    "description": "Converts an amount of money from one currency to another at today's exchange rate.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "description": "The amount to convert."},
            "from": {"type": "string", "description": "The currency of the amount (ISO code, e.g. EUR)."},
            "to": {"type": "string", "description": "The currency to convert to (ISO code, e.g. USD)."},
        },
        "required": ["amount", "from", "to"],
    },
}


def generated():
    for plural, singular, about in SUBJECTS:
        for action, text in ACTIONS:
            yield {
                "name": f"{action}_{plural}",
                "description": text.format(plural=plural, singular=singular, about=about),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": f"The {singular}'s id, where one is meant."},
                        "filter": {"type": "string", "description": "Words the fields must contain."},
                        "since": {"type": "string", "description": "The earliest date, YYYY-MM-DD."},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                },
            }


count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
tools = [CONVERT] + [t for t in generated() if t["name"] != "summarize_rates"]
tools = tools[: max(1, count)]


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def result(id, text, error=False):
    send({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}], "isError": error}})


def convert(args):
    try:
        amount, src, dst = float(args["amount"]), args["from"].upper(), args["to"].upper()
        value = amount / RATES[src] * RATES[dst]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return f"{amount:.2f} {src} = {value:.2f} {dst}"


names = {t["name"] for t in tools}
for line in sys.stdin:
    msg = json.loads(line)
    method, id = msg.get("method"), msg.get("id")
    if id is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "many", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}})
    elif method == "tools/call":
        name, args = msg["params"]["name"], msg["params"].get("arguments") or {}
        if name not in names:
            result(id, "no such tool", error=True)
        elif name == "convert_currency":
            text = convert(args)
            result(id, text or f"cannot convert {json.dumps(args)}; currencies: {', '.join(RATES)}", error=text is None)
        else:
            result(id, f"{name} ran with {json.dumps(args, sort_keys=True)}")
    else:
        send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}})
