#!/usr/bin/env python3
"""Interleaved sittings of several agentloop-bench builds: the medians BENCHMARKS.md quotes under #30.

Each repetition runs every build once, in turn, so that a noisy minute of this shared machine
falls on all of them alike.

  bench/interleave.py loop  N name=path ...   CPU µs a turn, T=10 (2,000 runs) and T=50 (400), K=3
  bench/interleave.py scale N name=path ...   `scale --runs 10000`: wall, CPU, RSS a run; a name
                                              ending in +bare also runs the no-loop floor
  extra arguments for every `scale` run: SCALE_ARGS="--rounds 2"

Build each binary first (bench/run.sh builds bench/agentloop-bench; `--features mimalloc` for the
allocator of the `agentloop` binary) and copy it aside under a name of its own.
"""

import json
import os
import statistics
import subprocess
import sys


def last_json(path, args):
    out = subprocess.run([path, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def loop(n, builds):
    shapes = [("T=10", ["--runs", "2000", "--turns", "10", "--calls", "3"], 11),
              ("T=50", ["--runs", "400", "--turns", "50", "--calls", "3"], 51)]
    got = {}
    for _ in range(n):
        for name, path in builds:
            for shape, args, turns in shapes:
                j = last_json(path, ["loop", *args])
                got.setdefault((name, shape), []).append(j["cpu_s"] * 1e6 / (j["runs"] * turns))
    for (name, shape), v in got.items():
        print(f"{name:14} {shape}: median {statistics.median(v):.2f}, min {min(v):.2f} CPU µs a turn (n={len(v)})")


def scale(n, builds):
    extra = os.environ.get("SCALE_ARGS", "").split()
    got = {}
    for _ in range(n):
        for name, path in builds:
            base = name.removesuffix("+bare")
            variants = [(base, [])] + ([(base + " floor", ["--bare", "true"])] if name.endswith("+bare") else [])
            for label, args in variants:
                got.setdefault(label, []).append(last_json(path, ["scale", "--runs", "10000", *args, *extra]))
    for label, js in got.items():
        wall = [j["wall_s"] * 1e3 for j in js]
        cpu = [j["cpu_s"] * 1e3 for j in js]
        kib = [j["rss_per_run_kb"] for j in js]
        print(f"{label:20} wall {statistics.median(wall):,.0f} ms ({min(wall):,.0f}-{max(wall):,.0f}), "
              f"CPU {statistics.median(cpu):,.0f} ms, {statistics.median(kib):.1f} KiB a run (n={len(js)})")


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("loop", "scale"):
        sys.exit(__doc__)
    n = int(sys.argv[2])
    builds = []
    for a in sys.argv[3:]:
        name, sep, path = a.partition("=")
        if not sep:
            sys.exit(f"{a}: expected name=path")
        builds.append((name, path))
    (loop if sys.argv[1] == "loop" else scale)(n, builds)


if __name__ == "__main__":
    main()
