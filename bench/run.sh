#!/usr/bin/env bash
# The side-by-side benchmark: agentloop against rig, AutoAgents, pydantic-ai, the OpenAI Agents SDK
# and LangGraph on the same workload, on this machine, in one run. See BENCHMARKS.md.
#
#   bench/run.sh            install the peers (a venv under bench/.venv, cargo projects under
#                           bench/peers/rig and bench/peers/autoagents), run everything, print the
#                           table, write results.json
#   bench/run.sh --quick    agentloop only, small N: a smoke test (under a minute once built)
#   options: --reps N (default 3; the median is reported), --no-peers, --no-scale, --no-streams
#   Each cargo project builds into its own target dir under bench/ unless BENCH_TARGET_DIR,
#   RIG_TARGET_DIR or AUTOAGENTS_TARGET_DIR name another.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
ORIG_ARGS="$*"
QUICK=0 REPS=3 PEERS=1 SCALE=1 STREAMS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; PEERS=0; REPS=1 ;;
    --reps) REPS="$2"; shift ;;
    --no-peers) PEERS=0 ;;
    --no-scale) SCALE=0 ;;
    --no-streams) STREAMS=0 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '>> %s\n' "$*" >&2; }

# --- build and install -------------------------------------------------------------------------
log "building agentloop-bench (release)"
AL_TARGET="${BENCH_TARGET_DIR:-$HERE/agentloop-bench/target}"
CARGO_TARGET_DIR="$AL_TARGET" nice -n 5 \
  cargo build --quiet --release --manifest-path "$HERE/agentloop-bench/Cargo.toml"
AL="$AL_TARGET/release/agentloop-bench"
if [ "$SCALE" = 1 ]; then
  # The scale test also runs on the allocator the `agentloop` binary uses (the library picks none).
  log "building agentloop-bench with mimalloc (release)"
  CARGO_TARGET_DIR="$AL_TARGET/mimalloc" nice -n 5 \
    cargo build --quiet --release --features mimalloc --manifest-path "$HERE/agentloop-bench/Cargo.toml"
  AL_MI="$AL_TARGET/mimalloc/release/agentloop-bench"
fi

if [ "$PEERS" = 1 ]; then
  if [ ! -x "$HERE/.venv/bin/python" ]; then
    log "creating bench/.venv"
    python3 -m venv "$HERE/.venv"
  fi
  log "installing the Python peers (bench/requirements.txt)"
  nice -n 5 "$HERE/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$HERE/requirements.txt"
  # agentloop's own Python package, built from this clone (release) by the pinned maturin.
  log "building the agentloop Python package (python/, release)"
  WHEELS="$(mktemp -d "${TMPDIR:-/tmp}/agentloop-wheel.XXXXXX")"
  (cd "$ROOT/python" && nice -n 5 "$HERE/.venv/bin/maturin" build --release --quiet --out "$WHEELS" >&2)
  "$HERE/.venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$WHEELS"/agentloop-*.whl
  rm -rf "$WHEELS"
  log "building the rig harness (release; about 7.5 minutes the first time)"
  RIG_TARGET="${RIG_TARGET_DIR:-$HERE/peers/rig/target}"
  CARGO_TARGET_DIR="$RIG_TARGET" nice -n 5 \
    cargo build --quiet --release --manifest-path "$HERE/peers/rig/Cargo.toml"
  log "building the AutoAgents harness (release; longer than rig's the first time)"
  AA_TARGET="${AUTOAGENTS_TARGET_DIR:-$HERE/peers/autoagents/target}"
  AA="$AA_TARGET/release/autoagents-peer-bench"
  # A peer that does not build is left out of the table (and said so), not the whole run.
  if ! CARGO_TARGET_DIR="$AA_TARGET" nice -n 5 \
    cargo build --quiet --release --manifest-path "$HERE/peers/autoagents/Cargo.toml"; then
    log "AutoAgents did not build: left out"
    AA=""
  fi
  PY="$HERE/.venv/bin/python"
  RIG="$RIG_TARGET/release/rig-peer-bench"
fi

# --- run ---------------------------------------------------------------------------------------
RAW="$(mktemp "${TMPDIR:-/tmp}/agentloop-bench.XXXXXX.jsonl")"
trap 'rm -f "$RAW"' EXIT

if [ "$QUICK" = 1 ]; then
  SHAPES=("20 10 3" "20 10 1" "8 50 3"); PEER_SHAPES=(); WARMUP=2
  SCALE_ARGS=(--runs 1000); STREAM_ARGS=(--ms 200)
else
  SHAPES=("200 10 3" "200 10 1" "40 50 3"); PEER_SHAPES=("200 10 3" "200 10 1"); WARMUP=20
  SCALE_ARGS=(--runs 10000); STREAM_ARGS=(--ms 1000)
fi

is_peer_shape() {
  local s
  for s in "${PEER_SHAPES[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

for rep in $(seq 1 "$REPS"); do
  for shape in "${SHAPES[@]}"; do
    read -r n t k <<<"$shape"
    args=(--runs "$n" --turns "$t" --calls "$k" --warmup "$WARMUP")
    log "rep $rep/$REPS, shape N=$n T=$t K=$k: agentloop"
    "$AL" loop "${args[@]}" >>"$RAW"
    if [ "$PEERS" = 1 ] && is_peer_shape "$shape"; then
      log "rep $rep/$REPS, shape N=$n T=$t K=$k: rig"
      "$RIG" "${args[@]}" >>"$RAW"
      if [ -n "$AA" ]; then
        log "rep $rep/$REPS, shape N=$n T=$t K=$k: AutoAgents"
        "$AA" "${args[@]}" >>"$RAW"
      fi
      for peer in agentloop_python pydantic_ai openai_agents langgraph; do
        log "rep $rep/$REPS, shape N=$n T=$t K=$k: $peer"
        (cd "$HERE/peers/python" && "$PY" "${peer}_bench.py" "${args[@]}") >>"$RAW"
      done
    fi
  done
done

log "heap allocations per turn, call, event and journaled step"
if [ "$QUICK" = 1 ]; then
  "$AL" allocs --runs 20 --warmup 2 >>"$RAW"
else
  "$AL" allocs >>"$RAW"
fi

if [ "$SCALE" = 1 ]; then
  SCALE_SHAPE=(--turns 5 --calls 3 --model-ms 20 --tool-ms 5)
  for bin in "$AL" "$AL_MI"; do
    # A build's first run touches memory this VM gave back to its host, and pays the host's page
    # faults for it (BENCHMARKS.md, "This machine's memory"): it is run once untimed.
    "$bin" scale "${SCALE_ARGS[@]}" "${SCALE_SHAPE[@]}" --runtime per-core >/dev/null
    for rep in $(seq 1 "$REPS"); do
      # Each run kept on one core (a current-thread runtime a core), and on tokio's multi-thread
      # runtime; beside each, its floor: the same timers with no agent loop around them.
      for runtime in per-core multi; do
        log "rep $rep/$REPS, scale: ${SCALE_ARGS[*]} concurrent runs, $runtime, $bin"
        "$bin" scale "${SCALE_ARGS[@]}" "${SCALE_SHAPE[@]}" --runtime "$runtime" >>"$RAW"
        "$bin" scale "${SCALE_ARGS[@]}" "${SCALE_SHAPE[@]}" --runtime "$runtime" --bare true >>"$RAW"
      done
    done
  done
fi
if [ "$STREAMS" = 1 ]; then
  log "stream parsing over the provider fixtures"
  "$AL" streams "${STREAM_ARGS[@]}" >>"$RAW"
fi

# --- report ------------------------------------------------------------------------------------
OUT="$HERE/results.json"
[ "$QUICK" = 1 ] && OUT="$HERE/results.quick.json"
AGENTLOOP_VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
python3 "$HERE/report.py" "$RAW" --out "$OUT" \
  --agentloop-version "agentloop $AGENTLOOP_VERSION ($COMMIT)" --command "bench/run.sh $ORIG_ARGS"
