#!/usr/bin/env bash
# Starts the tests' OTLP receiver (receiver.py) in a virtual environment of its own, made once in
# $AGENTLOOP_CACHE/otel-venv from requirements.txt (PyPI only). Usage: receiver.sh OUT
# Prints "ready HTTP_PORT GRPC_PORT" once it listens; it stops when its stdin closes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
VENV=$CACHE/otel-venv
STAMP=$VENV/.requirements
if ! cmp -s "$here/requirements.txt" "$STAMP" 2>/dev/null; then
  mkdir -p "$CACHE"
  # One installer at a time: tests start receivers in parallel.
  exec 9>"$CACHE/otel-venv.lock"
  flock 9
  if ! cmp -s "$here/requirements.txt" "$STAMP" 2>/dev/null; then
    rm -rf "$VENV"
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt" >&2
    cp "$here/requirements.txt" "$STAMP"
  fi
  flock -u 9
fi
exec "$VENV/bin/python" "$here/receiver.py" "$@"
