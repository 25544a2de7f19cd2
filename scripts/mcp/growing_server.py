# A stdio MCP server of agentloop's own tests, in plain Python (no SDK): `add_tool` adds
# `new_tool` and announces `notifications/tools/list_changed` before it answers; `new_tool`
# writes `new_tool.ran` in its working directory. Used by agentloop-mcp's and agentloop-cli's
# tests (a server whose tool list changes on cue, which server-everything's does not). It says
# `grow: started` on stderr outside any call.
import json, sys, time
sys.stderr.write("grow: started\n")
sys.stderr.flush()
tools = [{"name": "add_tool", "description": "Adds new_tool.", "inputSchema": {"type": "object", "properties": {}}}]
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()
def result(id, text, error=False):
    send({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}], "isError": error}})
for line in sys.stdin:
    msg = json.loads(line)
    method, id = msg.get("method"), msg.get("id")
    if id is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": "grow", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}})
    elif method == "tools/call" and msg["params"]["name"] == "add_tool":
        # What a server says on stderr goes to the call's details in the trace, not the terminal;
        # the pause lets its reader take the line before the answer comes.
        sys.stderr.write("grow: adding new_tool\n")
        sys.stderr.flush()
        time.sleep(0.3)
        if len(tools) == 1:
            tools.append({"name": "new_tool", "description": "Runs.", "inputSchema": {"type": "object", "properties": {}}})
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        result(id, "added new_tool")
    elif method == "tools/call" and msg["params"]["name"] == "new_tool":
        open("new_tool.ran", "w").write("yes")
        result(id, "new_tool ran")
    elif method == "tools/call":
        result(id, "no such tool", error=True)
    else:
        send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}})
