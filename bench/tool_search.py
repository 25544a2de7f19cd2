#!/usr/bin/env python3
"""What deferred tools save (#34): the bytes and tokens of each request an agent sends with the
200 tools of scripts/mcp/many_tools_server.py all in the request, against the same server with
`defer = true`, where the model finds 10 of them with `search_tools` and calls one; then the
native variant (`tool_search = "auto"` on Anthropic): the server's own search finds the same 10
(its answer scripted here), every tool goes in every request marked `defer_loading`, and what
the model's context holds is estimated as the request without the deferred definitions, plus
the definitions of the tools found so far (Anthropic expands each `tool_reference` into its
tool's definition: only a real API's usage could count it exactly).

Runs the `agentloop` binary (argument, or $CARGO_TARGET_DIR/debug/agentloop, or
target/debug/agentloop) against a fake OpenAI Chat Completions server on loopback that records
each request body and answers from a script. Tokens are counted by the tokenizer
of a running llama-server (--tokenize=http://127.0.0.1:PORT, say one started with
scripts/local-model/serve.sh) over the request's JSON body, or else by the compaction estimate
(UTF-8 bytes / 3, within about 5 % of the local model's count on whole requests), and said so.

Usage: python3 bench/tool_search.py [AGENTLOOP] [--tokenize=URL]
"""
import http.server
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(ROOT, "scripts/mcp/many_tools_server.py")


def completion(message):
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def calling(name, arguments):
    return completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{name}", "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]})


CONVERT = calling("biz__convert_currency", {"amount": 100, "from": "EUR", "to": "USD"})
ANSWER = completion({"role": "assistant", "content": "100 EUR is 108 USD."})
CASES = [
    ("200 tools in every request", False, [CONVERT, ANSWER]),
    ("deferred, 10 found on demand", True, [
        calling("search_tools", {"query": "convert currency exchange rates money", "limit": 10}),
        CONVERT, ANSWER]),
]

# The 10 tools the native search "finds": the converter and the nine actions on rates.
FOUND = ["biz__convert_currency"] + [
    f"biz__{a}_rates" for a in
    ["list", "get", "create", "update", "delete", "search", "export", "archive", "count"]]


def anthropic(content, stop):
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": content, "stop_reason": stop,
            "usage": {"input_tokens": 1, "output_tokens": 1}}


NATIVE = [
    anthropic([
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_bm25",
         "input": {"query": "convert currency exchange rates money"}},
        {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1",
         "content": {"type": "tool_search_tool_search_result", "tool_references": [
             {"type": "tool_reference", "tool_name": n} for n in FOUND]}},
        {"type": "tool_use", "id": "toolu_1", "name": "biz__convert_currency",
         "input": {"amount": 100, "from": "EUR", "to": "USD"}},
    ], "tool_use"),
    anthropic([{"type": "text", "text": "100 EUR is 108 USD."}], "end_turn"),
]


def serve(replies, bodies):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            bodies.append(body)
            reply = replies[len(bodies) - 1] if len(bodies) <= len(replies) else None
            out = json.dumps(reply).encode() if reply else b'{"error":{"message":"no more"}}'
            self.send_response(200 if reply else 500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def run_case(agentloop, deferred, replies, native=False):
    bodies = []
    httpd = serve(replies, bodies)
    try:
        with tempfile.TemporaryDirectory() as d:
            agent = os.path.join(d, "agent.toml")
            with open(agent, "w") as f:
                f.write(f"""name = "backoffice"
[model]
{MODEL_NATIVE if native else MODEL_CHAT}
base_url = "http://127.0.0.1:{httpd.server_port}{"" if native else "/v1"}"
api_key_env = "BENCH_KEY"
stream = false
[[mcp]]
name = "biz"
command = ["python3", "{SERVER}"]
defer = {"true" if deferred else "false"}
""")
            out = subprocess.run(
                [agentloop, "run", agent, "--input", "How much is 100 EUR in USD?", "--json"],
                capture_output=True, text=True, env={**os.environ, "BENCH_KEY": "sk-bench"},
                timeout=300,
            )
            if out.returncode != 0:
                sys.exit(f"the run failed ({out.returncode}): {out.stderr}")
    finally:
        httpd.shutdown()
    return bodies


MODEL_CHAT = 'provider = "openai"\nname = "gpt-4o"'
MODEL_NATIVE = 'provider = "anthropic"\nname = "claude-sonnet-4-5"'


def compact(value):
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def in_context(body, found):
    """The request's bytes without its deferred definitions but those of the tools found."""
    tools = body.get("tools", [])
    hidden = sum(compact(t) for t in tools if t.get("defer_loading") and t["name"] not in found)
    return compact(body) - hidden


def tokenizer(url):
    """A function counting a text's tokens, and its name."""
    if url:
        def count(text):
            req = urllib.request.Request(
                f"{url.rstrip('/')}/tokenize",
                json.dumps({"content": text}).encode(), {"Content-Type": "application/json"})
            return len(json.load(urllib.request.urlopen(req, timeout=120))["tokens"])

        return count, f"the tokenizer at {url}"
    return (lambda text: math.ceil(len(text.encode()) / 3)), "estimate (UTF-8 bytes / 3)"


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    url = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--tokenize=")), None)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    agentloop = args[0] if args else os.path.join(target, "debug", "agentloop")
    count, how = tokenizer(url)
    rows = []
    for name, deferred, replies in CASES:
        for turn, body in enumerate(run_case(agentloop, deferred, replies), start=1):
            tools = len(json.loads(body).get("tools", []))
            rows.append((name, turn, tools, len(body), count(body.decode())))
    print(f"tokens: {how}")
    print(f"| case | turn | tools sent | request bytes | request tokens |")
    print(f"|---|---:|---:|---:|---:|")
    for name, turn, tools, size, tokens in rows:
        print(f"| {name} | {turn} | {tools} | {size} | {tokens} |")
    full = [r for r in rows if r[0] == CASES[0][0]]
    lazy = [r for r in rows if r[0] == CASES[1][0]]
    print(f"per turn, the whole set against 10 found: {full[0][3] / lazy[-1][3]:.1f}x the bytes, "
          f"{full[0][4] / lazy[-1][4]:.1f}x the tokens; over the run: "
          f"{sum(r[3] for r in full) / sum(r[3] for r in lazy):.1f}x the bytes")
    native = []
    for turn, raw in enumerate(run_case(agentloop, True, NATIVE, native=True), start=1):
        body = json.loads(raw)
        tools = body.get("tools", [])
        found = set(FOUND) if turn > 1 else set()
        context = in_context(body, found)
        native.append((turn, len(tools), sum(1 for t in tools if t.get("defer_loading")),
                       len(raw), context, count(raw.decode()), math.ceil(context / 3)))
    print()
    print("native (Anthropic): | turn | tools sent | deferred | request bytes | in context, bytes "
          "(est.) | request tokens | in context, tokens (est.) |")
    for row in native:
        print("| " + " | ".join(str(v) for v in row) + " |")
    # The same request with nothing deferred is what the model's context would hold: the bytes
    # sent, less the `"defer_loading":true` of each deferred tool.
    whole = [r[3] - r[2] * len(',"defer_loading":true') for r in native]
    print(f"native, per turn: every tool sent ({native[0][3]} bytes; {whole[0]} with nothing "
          f"deferred); in context {whole[-1] / native[-1][4]:.1f}x fewer bytes than "
          f"undeferred after the find, {whole[0] / native[0][4]:.0f}x fewer before it")


if __name__ == "__main__":
    sys.exit(main())
