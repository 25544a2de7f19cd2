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

With --workers W (more than 1), W `agentloop serve` workers share the runs behind HAProxy
(scripts/restate/haproxy.sh), which picks a worker for each HTTP/2 stream (Restate keeps one
connection to a deployment, so workers sharing a port would not share its invocations); the
balancer's endpoint is the one registered, and the line says how many invocations each worker
took. With --server-fsync off the Restate server skips the fsync of each log append
(AGENTLOOP_RESTATE_WAL_FSYNC=off for scripts/restate/start.sh): the difference is the disk's part
of a step.

Usage: bench/restate.py [--runs N] [--concurrent C] [--workers W] [--server-fsync on|off]
       [--skip-local]   (build first: cargo build -p agentloop-cli --release; AGENTLOOP_BIN=path
       runs another build)
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
max_turns = 100
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
    if os.environ.get("AGENTLOOP_BIN"):  # a given build, to compare two
        return os.environ["AGENTLOOP_BIN"], "given"
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


HAPROXY = """global
  maxconn 4096
  stats socket {sock} mode 600 level user
defaults
  mode http
  timeout connect 5s
  timeout client 1h
  timeout server 1h
frontend restate
  bind 127.0.0.1:{port} proto h2
  default_backend workers
backend workers
  balance roundrobin
{servers}
"""


def cpu_ms(pid):
    """CPU time (user + system) a process has used so far, in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def balancer_counts(sock):
    """Invocations (HTTP/2 streams) each worker took, from HAProxy's stats socket."""
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(b"show stat\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    lines = data.decode().splitlines()
    head = lines[0].lstrip("# ").split(",")
    counts = {}
    for line in lines[1:]:
        row = dict(zip(head, line.split(",")))
        if row.get("pxname") == "workers" and row.get("svname", "").startswith("w"):
            counts[row["svname"]] = int(row.get("stot") or 0)
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--server-fsync", choices=["on", "off"], default="on")
    ap.add_argument("--skip-local", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="the script's tool turns, this many times over")
    args = ap.parse_args()
    exe, profile = binary()
    script = [
        # Each repetition's calls differ (ids and arguments): the same call with the same
        # result again would be stopped as a stuck loop.
        {"tool_calls": [dict(c, id=f"{c['id']}r{r}", arguments={"key": f"{c['arguments']['key']}r{r}"}) for c in turn["tool_calls"]]}
        for r in range(args.repeat)
        for turn in SCRIPT[:-1]
    ] + SCRIPT[-1:]
    work = tempfile.mkdtemp(prefix="agentloop-restate-bench-")
    with open(os.path.join(work, "agent.toml"), "w") as f:
        f.write(AGENT)
    with open(os.path.join(work, "tool.sh"), "w") as f:
        f.write(TOOL)
    with open(os.path.join(work, "script.json"), "w") as f:
        json.dump(script, f)
    agent = os.path.join(work, "agent.toml")

    def cli(*a):
        out = subprocess.run([exe, *a], cwd=work, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            sys.exit(f"{a[0]} failed ({out.returncode}): {out.stderr}")
        return out.stdout

    # The local driver (its journal also says how many steps a run is).
    runs = 1 if args.skip_local else args.runs
    t0 = time.perf_counter()
    for i in range(runs):
        cli("run", agent, "--input", "go", "--json", "--journal", "runs.db")
    local_ms = (time.perf_counter() - t0) * 1000 / runs
    steps = json.loads(cli("journal", "list", "--journal", "runs.db", "--json"))[0]["steps"]

    # Restate.
    server_dir = os.path.join(work, "restate")
    env = dict(os.environ, AGENTLOOP_RESTATE_WAL_FSYNC=args.server_fsync)
    started = subprocess.run([os.path.join(ROOT, "scripts/restate/start.sh"), server_dir], capture_output=True, text=True, check=True, env=env)
    urls = dict(line.split("=", 1) for line in started.stdout.split())
    workers = []
    balancer = None
    sock = os.path.join(work, "haproxy.sock")
    try:
        for w in range(args.workers):
            addr = f"127.0.0.1:{free_port()}"
            register = ["--register", urls["admin"]] if args.workers == 1 else []
            worker = subprocess.Popen(
                [exe, "serve", agent, "--restate-endpoint", addr, *register, "--restate", urls["ingress"]],
                cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            workers.append((addr, worker))
            for line in worker.stderr:
                if line.startswith("registered " if register else "serving "):
                    break
        if args.workers > 1:
            run_haproxy = subprocess.run([os.path.join(ROOT, "scripts/restate/haproxy.sh")], capture_output=True, text=True, check=True).stdout.split()
            port = free_port()
            servers = "\n".join(f"  server w{i} {a} proto h2" for i, (a, _) in enumerate(workers))
            with open(os.path.join(work, "haproxy.cfg"), "w") as f:
                f.write(HAPROXY.format(port=port, sock=sock, servers=servers))
            balancer = subprocess.Popen([*run_haproxy, "-f", os.path.join(work, "haproxy.cfg"), "-db"], cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            import urllib.request

            for _ in range(100):
                try:
                    req = urllib.request.Request(urls["admin"].rstrip("/") + "/deployments", data=json.dumps({"uri": f"http://127.0.0.1:{port}", "force": True}).encode(), headers={"content-type": "application/json"})
                    urllib.request.urlopen(req, timeout=10).read()
                    break
                except Exception:
                    time.sleep(0.1)
            else:
                sys.exit("the balancer's endpoint could not be registered")

        def one(i):
            run_id = cli("submit", agent, "--input", "go", "--restate", urls["ingress"]).strip()
            outcome = json.loads(cli("attach", run_id, "--restate", urls["ingress"], "--json"))
            assert outcome["stop_reason"] == "finished", outcome

        one(-1)  # the first run after registration warms the deployment up
        with open(os.path.join(server_dir, "pid")) as f:
            server_pid = int(f.read())
        pids = [server_pid] + [w.pid for _, w in workers]
        cpu0 = [cpu_ms(p) for p in pids]
        t0 = time.perf_counter()
        for i in range(args.runs):
            one(i)
        restate_ms = (time.perf_counter() - t0) * 1000 / args.runs
        cpu = [(cpu_ms(p) - c) / args.runs for p, c in zip(pids, cpu0)]
        t0 = time.perf_counter()
        n = args.runs * 2
        with concurrent.futures.ThreadPoolExecutor(args.concurrent) as pool:
            list(pool.map(one, range(n)))
        concurrent_rps = n / (time.perf_counter() - t0)
        per_worker = balancer_counts(sock) if balancer else None
    finally:
        for _, worker in workers:
            worker.kill()
        if balancer:
            balancer.kill()
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
        "server_cpu_ms_per_run": round(cpu[0], 1),
        "worker_cpu_ms_per_run": round(sum(cpu[1:]), 1),
        "workers": args.workers,
        "server_fsync": args.server_fsync,
    }
    if per_worker is not None:
        result["invocations_per_worker"] = per_worker
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
