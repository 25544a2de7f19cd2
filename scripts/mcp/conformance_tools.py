# A stdio MCP server of agentloop's conformance test, in plain Python (no SDK): two tools the MCP
# conformance suite's server scenarios call, which an agent file declares as `[[mcp]]` and
# `agentloop mcp serve --tools` serves again (crates/agentloop-cli/tests/mcp_conformance.rs): an
# image and progress reach the suite through agentloop's MCP client and server both.
# `test_image_content` answers a 1x1 PNG; `test_tool_with_progress` reports 0, 50 and 100 of
# 100 under the request's progress token, 50 ms apart, then answers.
import json, sys, time

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
EMPTY = {"type": "object", "properties": {}}
TOOLS = [
    {"name": "test_image_content", "description": "Answers a 1x1 PNG.", "inputSchema": EMPTY},
    {"name": "test_tool_with_progress", "description": "Reports progress three times, then answers.", "inputSchema": EMPTY},
]


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    method, id = msg.get("method"), msg.get("id")
    if id is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "conformance-tools", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": id, "result": {"tools": TOOLS}})
    elif method == "tools/call" and msg["params"]["name"] == "test_image_content":
        send({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}})
    elif method == "tools/call" and msg["params"]["name"] == "test_tool_with_progress":
        token = (msg["params"].get("_meta") or {}).get("progressToken")
        for progress in (0, 50, 100):
            if token is not None:
                send({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": token, "progress": progress, "total": 100}})
            time.sleep(0.05)
        send({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "Progress reported: 0, 50 and 100 of 100."}]}})
    else:
        send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}})
