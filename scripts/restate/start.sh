#!/usr/bin/env bash
# Starts a throwaway single-node Restate server for tests, in the background, on loopback only.
# Usage: start.sh DATA_DIR
# DATA_DIR gets config.toml, the server's state (restate-data/, wiped first: every start is a fresh
# cluster), server.log and pid. Ports come from RESTATE_INGRESS_PORT, RESTATE_ADMIN_PORT and
# RESTATE_NODE_PORT, or free ones. The binary is RESTATE_SERVER_BIN, or install.sh's.
# Waits until the admin API (/health) and the ingress (/restate/health) answer, then prints on
# stdout: ingress=http://127.0.0.1:PORT, admin=http://127.0.0.1:PORT, pid=PID.
# Stop it with stop.sh DATA_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 1 ] || { echo "usage: $0 DATA_DIR" >&2; exit 2; }
mkdir -p "$1"
DATA=$(cd "$1" && pwd)

if [ -f "$DATA/pid" ] && kill -0 "$(cat "$DATA/pid")" 2>/dev/null; then
  echo "a restate-server (pid $(cat "$DATA/pid")) is already running for $DATA; stop.sh it first" >&2
  exit 1
fi

BIN=${RESTATE_SERVER_BIN:-$("$here/install.sh")}

# Free ports, picked by the kernel. All three sockets are held open together so they differ;
# another process could take one before the server binds it, which start fails on loudly.
read -r free1 free2 free3 < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
INGRESS_PORT=${RESTATE_INGRESS_PORT:-$free1}
ADMIN_PORT=${RESTATE_ADMIN_PORT:-$free2}
NODE_PORT=${RESTATE_NODE_PORT:-$free3}

# AGENTLOOP_RESTATE_INACTIVITY (a duration such as "1s") sets both timeouts short, for a test of
# what keeps a long step's attempt alive.
# AGENTLOOP_RESTATE_WAL_FSYNC=off: the server's logs skip the fsync of each append (what
# `bench/restate.py --server-fsync off` measures: a step's wait without the disk's).
LOG_FSYNC=""
if [ "${AGENTLOOP_RESTATE_WAL_FSYNC:-on}" = off ]; then
  LOG_FSYNC="
[bifrost.local]
rocksdb-disable-wal-fsync = true

[log-server]
rocksdb-disable-wal-fsync = true"
fi

INVOKER_TIMEOUTS=""
if [ -n "${AGENTLOOP_RESTATE_INACTIVITY:-}" ]; then
  INVOKER_TIMEOUTS="inactivity-timeout = \"$AGENTLOOP_RESTATE_INACTIVITY\"
abort-timeout = \"$AGENTLOOP_RESTATE_INACTIVITY\""
fi

rm -rf "$DATA/restate-data" "$DATA/pid"
: >"$DATA/server.log"

# Every listener is bound to 127.0.0.1 and advertised there: the defaults bind 0.0.0.0, and the
# advertised node address would otherwise be guessed from a non-loopback interface.
# Unknown keys are silently ignored by the server, so each key here was checked against
# `restate-server --config-file config.toml --dump-config` of 1.7.12.
cat >"$DATA/config.toml" <<TOML
base-dir = "$DATA/restate-data"
cluster-name = "agentloop-test"
node-name = "agentloop-test"
auto-provision = true
# TCP only: the default also listens on unix sockets under base-dir, whose paths may be too long.
listen-mode = "tcp"
bind-address = "127.0.0.1:$NODE_PORT"
advertised-address = "http://127.0.0.1:$NODE_PORT/"
# No anonymous usage reports (Scarf) from tests; DO_NOT_TRACK=1 is set as well.
disable-telemetry = true
# A test server does little: fewer partitions start faster, and small memory caps keep it light
# beside the build on a small machine (256 MiB is the least RocksDB accepts).
default-num-partitions = 4
rocksdb-total-memory-size = "256 MiB"
# A SIGTERM'd test server need not drain for long.
shutdown-timeout = "5s"
log-filter = "warn,restate=info"
# One line per event, for tailing from a failed test.
log-format = "compact"
log-disable-ansi-codes = true

# Retries of failed invocation attempts (an endpoint that died, refused the connection, or
# answered with an error): fast and flat so that a test that kills a service endpoint sees the
# retry within about a second, and never giving up (the default is 70 attempts, then pause).
# A service can set its own policy through its SDK, which wins over this default.
[default-retry-policy]
initial-interval = "100ms"
exponentiation-factor = 2.0
max-interval = "500ms"
max-attempts = "unlimited"

[worker.invoker]
# inactivity-timeout and abort-timeout stay at their defaults (1m, 10m) unless
# AGENTLOOP_RESTATE_INACTIVITY sets both: together they bound how
# long one attempt may go without journal progress, e.g. a long ctx.run (an LLM call), before it
# is cut and retried; at 10s/10s a 25 s ctx.run was cut every time and never finished. They do not
# slow down retries after an endpoint is killed: the broken connection is seen at once.
memory-limit = "256 MiB"
$INVOKER_TIMEOUTS

[bifrost]
record-cache-memory-size = "32 MiB"

[admin]
bind-address = "127.0.0.1:$ADMIN_PORT"
advertised-address = "http://127.0.0.1:$ADMIN_PORT/"
disable-web-ui = true

[admin.query-engine]
memory-size = "128 MiB"

[ingress]
bind-address = "127.0.0.1:$INGRESS_PORT"
advertised-address = "http://127.0.0.1:$INGRESS_PORT/"
$LOG_FSYNC
TOML

# The server also reads RESTATE_* variables as config (RESTATE_SECTION__KEY), so the caller's are
# dropped, and RUST_LOG (it overrides log-filter): the config file alone decides.
env_clean=()
for name in $(compgen -e); do
  case $name in RESTATE_*) env_clean+=(-u "$name") ;; esac
done
env "${env_clean[@]}" -u RUST_LOG DO_NOT_TRACK=1 \
  "$BIN" --config-file "$DATA/config.toml" --no-logo </dev/null >>"$DATA/server.log" 2>&1 &
PID=$!
echo "$PID" >"$DATA/pid"

INGRESS=http://127.0.0.1:$INGRESS_PORT
ADMIN=http://127.0.0.1:$ADMIN_PORT
fail() {
  echo "restate-server did not become ready: $1; last lines of $DATA/server.log:" >&2
  tail -n 30 "$DATA/server.log" >&2
  "$here/stop.sh" "$DATA" >&2 || true
  exit 1
}
ok() { curl -fsS -m 2 -o /dev/null "$@" 2>/dev/null; }
# The partitions may still be electing leaders then (a few hundred ms); requests sent meanwhile
# wait for them rather than fail, so tests can register and invoke at once.
deadline=$((SECONDS + 60))
until ok "$ADMIN/health" && ok "$INGRESS/restate/health"; do
  kill -0 "$PID" 2>/dev/null || fail "it exited"
  [ $SECONDS -lt $deadline ] || fail "not healthy within 60 s"
  sleep 0.2
done
echo "ingress=$INGRESS"
echo "admin=$ADMIN"
echo "pid=$PID"
