#!/usr/bin/env bash
# Starts llama-server with the local model on 127.0.0.1:PORT and waits until it answers /health.
# Builds the server and fetches the model first if they are not cached (slow the first time).
# Usage: serve.sh PORT [extra llama-server args]
#   Prints the server's PID; stop it with `kill PID`. Refuses a PORT something already listens on.
#   Logs to $AGENTLOOP_CACHE/llama-server-PORT.log (the newest five such logs are kept).
#   AGENTLOOP_MODEL=1.5b serves the 1.5B model (fetch-model.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

PORT=${1:?usage: serve.sh PORT [extra llama-server args]}; shift
# python3 rather than curl: one tool fewer to need on a fresh machine.
# Something already listens on PORT: a server left by a killed test, or a user's. Ours would fail
# to bind, and its health check would reach the other one and report it as ours.
port_taken() {
  python3 - "$PORT" <<'PY'
import socket, sys
with socket.socket() as s:
    s.settimeout(2)
    sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
PY
}
if port_taken; then
  echo "port $PORT is taken: something already listens on 127.0.0.1:$PORT (another llama-server?)" >&2
  exit 1
fi
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
healthy() {
  python3 - "$PORT" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read()
except Exception:
    sys.exit(1)
PY
}
exited() { echo "llama-server exited; see $LOG" >&2; exit 1; }
for _ in $(seq 1 120); do
  kill -0 "$pid" 2>/dev/null || exited
  # Healthy counts only while ours still runs, and still does a moment later: one that failed to
  # bind (a server started on the port since the check above) exits at once.
  if healthy; then
    sleep 0.2
    kill -0 "$pid" 2>/dev/null || exited
    echo "$pid"; exit 0
  fi
  sleep 1
done
kill "$pid"; echo "llama-server did not become healthy in 120 s; see $LOG" >&2; exit 1
