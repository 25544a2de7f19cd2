"""A small MCP server over stdio, in plain Python (no SDK, no dependency): a notebook kept in
memory for as long as the agent runs. `add_note` and `list_notes` answer structured content that
matches their output schemas, as an MCP tool may."""
import json
import sys

NOTES = []
OBJECT = {"type": "object"}
TOOLS = [
    {
        "name": "add_note",
        "description": "Adds a note to the notebook. Example: {\"text\": \"ship on Friday\"}",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "The note."}},
            "required": ["text"],
        },
        "outputSchema": {
            "type": "object",
            "properties": {"count": {"type": "integer"}},
            "required": ["count"],
        },
    },
    {
        "name": "list_notes",
        "description": "Lists the notes, oldest first.",
        "inputSchema": {"type": "object", "properties": {}},
        "outputSchema": {
            "type": "object",
            "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
            "required": ["notes"],
        },
        "annotations": {"readOnlyHint": True},
    },
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def structured(request_id, value):
    send({"jsonrpc": "2.0", "id": request_id, "result": {
        "content": [{"type": "text", "text": json.dumps(value)}],
        "structuredContent": value,
    }})


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        continue  # a notification: nothing to answer
    params = message.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": request_id, "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "notes", "version": "1.0"},
        }})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": TOOLS}})
    elif method == "tools/call" and params.get("name") == "add_note":
        NOTES.append(params.get("arguments", {}).get("text", ""))
        structured(request_id, {"count": len(NOTES)})
    elif method == "tools/call" and params.get("name") == "list_notes":
        structured(request_id, {"notes": NOTES})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": request_id, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": request_id,
              "error": {"code": -32601, "message": f"no method {method}"}})
