#!/usr/bin/env python3
"""Runs on Restate against the local driver, on this machine: runs per second and the latency a
journaled step gains.

The same scripted agent (4 turns, 8 tool calls, about 30 journaled steps; command tools that do
almost nothing) runs N times, one after the other:
  local     `agentloop run --journal runs.db --json` (SQLite journal, one process per run)
  restate   `agentloop submit` then `agentloop attach --json`, against one `agentloop serve`
            worker and a Restate server on loopback (scripts/restate/start.sh)
and then C at once on Restate (runs/s with concurrency). The added latency per step is
(restate ms per run - local ms per run) / steps. Each run of either kind pays a process start of
the CLI (two for Restate: submit and attach); the figure says what a user of the command sees.

Usage: bench/restate.py [--runs N] [--concurrent C]   (build first: cargo build -p agentloop-cli --release)
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


TOOL = """name="$1"
args="$(cat)"
printf '%s done: %s\\n' "$name" "$args"
"""

AGENT = """name = "bench"
[model]
provider = "scripted"
script = "script.json"
[limits]
max_concurrency = 2
[[tools]]
name = "read"
command = ["sh", "tool.sh", "read"]
input_schema = { type = "object", properties = { key = { type = "string" } }, required = ["key"] }
idempotent = true
[[tools]]
name = "write"
command = ["sh", "tool.sh", "write"]
input_schema = { type = "object", properties = { key = { type = "string" } }, required = ["key"] }
"""


def call(i, tool):
    return {"id": f"c{i}", "name": tool, "arguments": {"key": str(i)}}


SCRIPT = [
    {"tool_calls": [call(1, "read"), call(2, "read"), call(3, "write")]},
    {"tool_calls": [call(4, "write"), call(5, "read")]},
    {"tool_calls": [call(6, "read"), call(7, "write"), call(8, "read")]},
    {"text": "done"},
]


def binary():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    for profile in ("release", "debug"):
        path = os.path.join(target, profile, "agentloop")
        if os.path.exists(path):
            return path, profile
    sys.exit("build agentloop first: cargo build -p agentloop-cli --release")


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--concurrent", type=int, default=8)
    args = ap.parse_args()
    exe, profile = binary()
    work = tempfile.mkdtemp(prefix="agentloop-restate-bench-")
    with open(os.path.join(work, "agent.toml"), "w") as f:
        f.write(AGENT)
    with open(os.path.join(work, "tool.sh"), "w") as f:
        f.write(TOOL)
    with open(os.path.join(work, "script.json"), "w") as f:
        json.dump(SCRIPT, f)
    agent = os.path.join(work, "agent.toml")

    def cli(*a):
        out = subprocess.run([exe, *a], cwd=work, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            sys.exit(f"{a[0]} failed ({out.returncode}): {out.stderr}")
        return out.stdout

    # The local driver.
    t0 = time.perf_counter()
    for i in range(args.runs):
        cli("run", agent, "--input", "go", "--json", "--journal", "runs.db")
    local_ms = (time.perf_counter() - t0) * 1000 / args.runs
    steps = json.loads(cli("journal", "list", "--journal", "runs.db", "--json"))[0]["steps"]

    # Restate.
    server_dir = os.path.join(work, "restate")
    started = subprocess.run([os.path.join(ROOT, "scripts/restate/start.sh"), server_dir], capture_output=True, text=True, check=True)
    urls = dict(line.split("=", 1) for line in started.stdout.split())
    worker = None
    try:
        addr = f"127.0.0.1:{free_port()}"
        worker = subprocess.Popen(
            [exe, "serve", agent, "--restate-endpoint", addr, "--register", urls["admin"], "--restate", urls["ingress"]],
            cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for line in worker.stderr:
            if line.startswith("registered "):
                break

        def one(i):
            run_id = cli("submit", agent, "--input", "go", "--restate", urls["ingress"]).strip()
            outcome = json.loads(cli("attach", run_id, "--restate", urls["ingress"], "--json"))
            assert outcome["stop_reason"] == "finished", outcome

        one(-1)  # the first run after registration warms the deployment up
        t0 = time.perf_counter()
        for i in range(args.runs):
            one(i)
        restate_ms = (time.perf_counter() - t0) * 1000 / args.runs
        t0 = time.perf_counter()
        n = args.runs * 2
        with concurrent.futures.ThreadPoolExecutor(args.concurrent) as pool:
            list(pool.map(one, range(n)))
        concurrent_rps = n / (time.perf_counter() - t0)
    finally:
        if worker:
            worker.kill()
        subprocess.run([os.path.join(ROOT, "scripts/restate/stop.sh"), server_dir], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "binary": profile,
        "runs": args.runs,
        "steps_per_run": steps,
        "local_ms_per_run": round(local_ms, 1),
        "restate_ms_per_run": round(restate_ms, 1),
        "local_runs_per_s": round(1000 / local_ms, 2),
        "restate_runs_per_s": round(1000 / restate_ms, 2),
        "restate_runs_per_s_concurrent": round(concurrent_rps, 2),
        "concurrency": args.concurrent,
        "added_ms_per_step": round((restate_ms - local_ms) / steps, 2),
        "restate_over_local": round(restate_ms / local_ms, 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
