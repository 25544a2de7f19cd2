# An MCP server of agentloop's own tests, in plain Python (no SDK), that misbehaves on cue: the
# broken and hostile servers the client must hold up against. Over stdio by default; with
# `--http` over streamable HTTP on 127.0.0.1 (a free port, said on stderr as
# `agentloop-listening 127.0.0.1 PORT`), answering JSON, no session. It speaks the `initialize`
# handshake (2025-06-18), and with `--modern` 2026-07-28 too (`server/discover`,
# `subscriptions/listen`). Tools: `echo` (answers its `message`), `slow` (sleeps `secs`, then
# answers), `change` (adds `added` and announces that the list changed), `stray` (sends progress
# under the tokens 0..N-1 that no call of its holds, then answers), `whoami` (answers this
# process's pid), and `crash` with `--crash-call`. Options say how it misbehaves; see `--help`.
# Used by agentloop-mcp's and agentloop-cli's tests.
import argparse, json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
p.add_argument("--modern", action="store_true", help="answer server/discover (2026-07-28)")
p.add_argument("--slow-start", nargs=2, metavar=("SECS", "FILE"),
               help="read nothing for SECS seconds unless FILE exists (then it is created)")
p.add_argument("--crash-first", metavar="FILE",
               help="exit at once, before reading anything, unless FILE exists (then it is created)")
p.add_argument("--log-starts", action="store_true",
               help="append this process's pid to the file `starts` of the working folder")
p.add_argument("--fail-call", type=int, default=0, metavar="N",
               help="over HTTP, answer the Nth tools/call with 502 Bad Gateway")
p.add_argument("--pages", type=int, default=0, metavar="N",
               help="list the tools one per page, N pages (each page's tool is tool_K)")
p.add_argument("--cycle", action="store_true", help="every page's nextCursor is the same")
p.add_argument("--huge", type=int, default=0, metavar="BYTES",
               help="one more tool, `huge`, whose description is BYTES long")
p.add_argument("--huge-schema", type=int, default=0, metavar="BYTES",
               help="one more tool, `huge`, whose input schema is about BYTES long")
p.add_argument("--list-fails", type=int, default=0, metavar="N",
               help="answer the Nth tools/list with an error")
p.add_argument("--stray", type=int, default=100, metavar="N", help="tokens `stray` sends under")
p.add_argument("--listen-ends", action="store_true",
               help="acknowledge subscriptions/listen and end it at once; each is counted in "
                    "the file `listens` of the working folder")
p.add_argument("--description", default="Echoes its message.", help="echo's description")
p.add_argument("--stderr-env", metavar="VAR",
               help="write VAR's value on stderr and exit 1 at start")
p.add_argument("--echo-env", metavar="VAR",
               help="echo writes VAR's value on stderr before it answers")
p.add_argument("--refuse-env", metavar="VAR",
               help="three more tools whose calls name VAR's value: `refuse` (a JSON-RPC error) "
                    "and `fail` (an isError result), as a gateway that echoes a token does, "
                    "and `reveal`, whose result names it (its text; with `structured` in its "
                    "arguments, its structured content too)")
p.add_argument("--flood", type=int, default=0, metavar="BYTES",
               help="one more tool, `flood`: its answer is one message of about BYTES bytes; "
                    "0 with `--flood-endless`")
p.add_argument("--flood-endless", action="store_true",
               help="`flood` answers bytes that never end a message (no newline over stdio, a "
                    "body without end over HTTP)")
p.add_argument("--flood-sse", action="store_true",
               help="over HTTP, `flood` answers as an event stream: one event of BYTES bytes, "
                    "or one without end with `--flood-endless`")
p.add_argument("--crash-call", metavar="TEXT",
               help="one more tool, `crash`: its call writes TEXT on stderr (`\\n` read as a "
                    "line break) and exits 1, as a server that dies saying why")
args = p.parse_args()

if args.stderr_env:
    sys.stderr.write(f"hostile: cannot start with token {os.environ.get(args.stderr_env)}\n")
    sys.stderr.flush()
    sys.exit(1)

if args.log_starts:
    with open("starts", "a") as f:
        f.write(f"{os.getpid()}\n")

if args.crash_first and not os.path.exists(args.crash_first):
    open(args.crash_first, "w").write("crashed")
    sys.stderr.write("hostile: crashing at the first start\n")
    sys.exit(3)

if args.slow_start:
    secs, marker = args.slow_start
    if not os.path.exists(marker):
        open(marker, "w").write("started")
        time.sleep(float(secs))

obj = {"type": "object", "properties": {}}
tools = [
    {"name": "echo", "description": args.description,
     "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}},
    {"name": "slow", "description": "Sleeps secs seconds.",
     "inputSchema": {"type": "object", "properties": {"secs": {"type": "number"}}}},
    {"name": "change", "description": "Adds `added`.", "inputSchema": obj},
    {"name": "stray", "description": "Sends stray progress.", "inputSchema": obj},
    {"name": "whoami", "description": "Says its pid.", "inputSchema": obj},
]
if args.huge:
    tools.append({"name": "huge", "description": "x" * args.huge, "inputSchema": obj})
if args.huge_schema:
    props = {f"p{i}": {"type": "string"} for i in range(args.huge_schema // 24)}
    tools.append({"name": "huge", "description": "Wide.",
                  "inputSchema": {"type": "object", "properties": props}})
if args.refuse_env:
    tools.append({"name": "refuse", "description": "Refused.", "inputSchema": obj})
    tools.append({"name": "fail", "description": "Fails.", "inputSchema": obj})
    tools.append({"name": "reveal", "description": "Reveals.", "inputSchema": obj})
if args.crash_call:
    tools.append({"name": "crash", "description": "Exits.", "inputSchema": obj})
if args.flood or args.flood_endless:
    tools.append({"name": "flood", "description": "Floods.", "inputSchema": obj})
lock = threading.Lock()
counts = {"tools/call": 0, "tools/list": 0}
out_lock = threading.Lock()


def send(msg):
    with out_lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def text(id, t, error=False):
    return {"jsonrpc": "2.0", "id": id,
            "result": {"content": [{"type": "text", "text": t}], "isError": error}}


def tools_list(id, params):
    if not args.pages:
        return {"jsonrpc": "2.0", "id": id, "result": {"tools": tools}}
    page = 0 if args.cycle else int((params or {}).get("cursor") or 0)
    result = {"tools": [dict(tools[0], name=f"tool_{page}")]}
    if args.cycle:
        result["nextCursor"] = "again"
    elif page + 1 < args.pages:
        result["nextCursor"] = str(page + 1)
    return {"jsonrpc": "2.0", "id": id, "result": result}


def handle(msg, notify):
    """The answer to one message (None for none); `notify` sends a notification first."""
    method, id, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
    if id is None or method is None:
        return None
    if method == "server/discover" and args.modern:
        return {"jsonrpc": "2.0", "id": id, "result": {
            "resultType": "complete", "supportedVersions": ["2026-07-28"], "ttlMs": 0,
            "cacheScope": "private", "capabilities": {"tools": {"listChanged": True}},
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "hostile", "version": "1"}}}}
    if method == "initialize":
        return {"jsonrpc": "2.0", "id": id, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "hostile", "version": "1"}}}
    if method == "subscriptions/listen" and args.listen_ends:
        with open("listens", "a") as f:
            f.write("listen\n")
        notify({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                "params": {"notifications": {"toolsListChanged": True},
                           "_meta": {"io.modelcontextprotocol/subscriptionId": id}}})
        return {"jsonrpc": "2.0", "id": id, "result": {}}
    if method == "tools/list":
        with lock:
            counts["tools/list"] += 1
            n = counts["tools/list"]
        if n == args.list_fails:
            return {"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "list failed"}}
        return tools_list(id, params)
    if method == "tools/call":
        name, a = params.get("name"), params.get("arguments") or {}
        if name == "echo":
            if args.echo_env:
                sys.stderr.write(f"hostile: echo with token {os.environ.get(args.echo_env)}\n")
                sys.stderr.flush()
                # The pause lets the client's reader take the line before the answer.
                time.sleep(0.3)
            return text(id, str(a.get("message")))
        if name == "slow":
            time.sleep(float(a.get("secs", 1)))
            return text(id, "slept")
        if name == "change":
            if not any(t["name"] == "added" for t in tools):
                tools.append({"name": "added", "description": "Added.", "inputSchema": obj})
            notify({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            return text(id, "changed")
        if name == "stray":
            for token in range(args.stray):
                notify({"jsonrpc": "2.0", "method": "notifications/progress",
                        "params": {"progressToken": token, "progress": 1, "message": "stale"}})
            return text(id, "strayed")
        if name == "whoami":
            return text(id, str(os.getpid()))
        if name == "refuse" and args.refuse_env:
            return {"jsonrpc": "2.0", "id": id, "error": {
                "code": -32001, "message": f"invalid token: {os.environ.get(args.refuse_env)}"}}
        if name == "fail" and args.refuse_env:
            return text(id, f"refused token {os.environ.get(args.refuse_env)}", error=True)
        if name == "reveal" and args.refuse_env:
            token = os.environ.get(args.refuse_env)
            if not a.get("structured"):
                return text(id, f"your token is {token}")
            return {"jsonrpc": "2.0", "id": id, "result": {
                "content": [{"type": "text", "text": f"your token is {token}"}],
                "structuredContent": {"token": token, token: "as a key"}}}
        if name == "crash" and args.crash_call:
            sys.stderr.write(args.crash_call.replace("\\n", "\n") + "\n")
            sys.stderr.flush()
            os._exit(1)
        if name == "flood" and args.flood:
            return text(id, "x" * args.flood)
        return text(id, "no such tool", error=True)
    return {"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}}


def is_flood(msg):
    """True for a call of `flood`."""
    return msg.get("method") == "tools/call" and (msg.get("params") or {}).get("name") == "flood"


def endless_flood(msg):
    """True for a call of `flood` that answers without end (`--flood-endless`)."""
    return args.flood_endless and is_flood(msg)


def flood_stdout():
    """Bytes without a newline, until the reader goes away."""
    with out_lock:
        try:
            while True:
                sys.stdout.write("x" * 65536)
                sys.stdout.flush()
        except OSError:
            os._exit(0)


class Http(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(405)

    def do_DELETE(self):
        self.reply(200)

    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if msg.get("method") == "tools/call":
            with lock:
                counts["tools/call"] += 1
                n = counts["tools/call"]
            if n == args.fail_call:
                return self.reply(502, {"error": "bad gateway"})
        if args.flood_sse and is_flood(msg):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                self.wfile.write(b"data: ")
                sent = 0
                while args.flood_endless or sent < args.flood:
                    self.wfile.write(b"x" * 65536)
                    sent += 65536
                self.wfile.write(b"\n\n")
            except OSError:
                pass
            return
        if endless_flood(msg):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"x" * 65536)
            except OSError:
                return
        answer = handle(msg, lambda m: None)
        if answer is None:
            self.reply(202)
        else:
            self.reply(200, answer)


if args.http:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Http)
    sys.stderr.write(f"agentloop-listening 127.0.0.1 {server.server_address[1]}\n")
    sys.stderr.flush()
    server.serve_forever()
else:
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        # Each request on a thread of its own: a slow call leaves the others answered.
        def run(msg=msg):
            if endless_flood(msg):
                flood_stdout()
            answer = handle(msg, send)
            if answer is not None:
                send(answer)
        threading.Thread(target=run, daemon=True).start()
