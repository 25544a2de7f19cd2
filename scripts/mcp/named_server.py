# A stdio MCP server of agentloop's own tests, in plain Python (no SDK), whose tools are named on
# its command line: `named_server.py TAG NAME... [--later NAME...]` lists the tools NAME...; a
# call of one answers "TAG ran NAME" and appends that line to `ran.txt` in its working
# directory. With `--later`, it lists `add_tool` too, which adds the later NAMEs and announces
# `notifications/tools/list_changed` before it answers. Used by the tests of tools whose names
# collide (two tools a client would give one name, within one server or across two).
import json, sys
args = sys.argv[1:]
tag = args[0]
names = args[1:]
later = []
if "--later" in names:
    at = names.index("--later")
    names, later = names[:at], names[at + 1:]
    names.append("add_tool")
def spec(name):
    return {"name": name, "description": f"{tag}'s {name}.", "inputSchema": {"type": "object", "properties": {}}}
tools = [spec(n) for n in names]
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
              "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": tag, "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}})
    elif method == "tools/call" and msg["params"]["name"] == "add_tool" and later:
        tools.extend(spec(n) for n in later)
        later = []
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        result(id, "added")
    elif method == "tools/call" and any(t["name"] == msg["params"]["name"] for t in tools):
        said = f"{tag} ran {msg['params']['name']}"
        with open("ran.txt", "a") as f:
            f.write(said + "\n")
        result(id, said)
    elif method == "tools/call":
        result(id, "no such tool", error=True)
    else:
        send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}})
