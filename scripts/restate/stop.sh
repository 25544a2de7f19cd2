#!/usr/bin/env bash
# Stops the Restate server that start.sh started for DATA_DIR, by the PID it wrote there:
# SIGTERM, up to 5 s to shut down, then SIGKILL. Does nothing when it is not running.
# Usage: stop.sh DATA_DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DATA_DIR" >&2; exit 2; }
PIDFILE=$1/pid
[ -f "$PIDFILE" ] || exit 0
PID=$(cat "$PIDFILE")
# Only that one process, never by name: other tests may run servers of their own. A stale pid
# file may name a reused PID, so the process must still be a restate-server (checked where /proc
# tells), and not a zombie, which signals cannot end.
alive() {
  kill -0 "$PID" 2>/dev/null || return 1
  [ -r "/proc/$PID/stat" ] || return 0
  grep -q restate-server "/proc/$PID/cmdline" 2>/dev/null || return 1
  [ "$(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null)" != Z ]
}
if alive; then
  kill -TERM "$PID" 2>/dev/null || true
  for _ in $(seq 50); do alive || break; sleep 0.1; done
  if alive; then
    echo "restate-server $PID still running 5 s after SIGTERM; sending SIGKILL" >&2
    kill -KILL "$PID" 2>/dev/null || true
    for _ in $(seq 50); do alive || break; sleep 0.1; done
  fi
fi
rm -f "$PIDFILE"
