#!/usr/bin/env bash
# Starts llama-server with the local model on 127.0.0.1:PORT and waits until it answers /health.
# Builds the server and fetches the model first if they are not cached (slow the first time).
# Usage: serve.sh PORT [extra llama-server args]
#   Prints the server's PID; stop it with `kill PID`. Logs to $AGENTLOOP_CACHE/llama-server-PORT.log
#   (the newest five such logs are kept). AGENTLOOP_MODEL=1.5b serves the 1.5B model (fetch-model.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

PORT=${1:?usage: serve.sh PORT [extra llama-server args]}; shift
BIN=$("$here/build-llama-server.sh")
MODEL=$("$here/fetch-model.sh")
LOG=$CACHE/llama-server-$PORT.log
# Each test server takes a port of its own, so a log per start would pile up in the cache (a test
# run starts a dozen): keep the newest few, for reading after a failure.
KEEP_LOGS=5
# (`|| true`: on a fresh machine there is no log yet, and `ls` of the empty glob fails the pipe.)
{ ls -1t -- "$CACHE"/llama-server-*.log 2>/dev/null || true; } | tail -n +$((KEEP_LOGS + 1)) |
  while IFS= read -r old; do rm -f -- "$old"; done
# --jinja turns on tool calling; the template is ours (see README.md): with the model's own, the
# server hands its tool calls back as plain text. Later arguments (say `-t 1`) override these.
"$BIN" -m "$MODEL" --host 127.0.0.1 --port "$PORT" -c 4096 -np 1 -t "$(nproc)" --jinja --alias local \
  --chat-template-file "$here/qwen25-agent.jinja" "$@" </dev/null >"$LOG" 2>&1 &
pid=$!
# python3 rather than curl: one tool fewer to need on a fresh machine.
healthy() {
  python3 - "$PORT" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read()
except Exception:
    sys.exit(1)
PY
}
for _ in $(seq 1 120); do
  if healthy; then echo "$pid"; exit 0; fi
  kill -0 "$pid" 2>/dev/null || { echo "llama-server exited; see $LOG" >&2; exit 1; }
  sleep 1
done
kill "$pid"; echo "llama-server did not become healthy in 120 s; see $LOG" >&2; exit 1
