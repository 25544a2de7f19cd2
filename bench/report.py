#!/usr/bin/env python3
"""Checks and tabulates the JSON lines that bench/run.sh's harnesses print.

Every loop line must show that its runs really did their work: runs × turns × calls tool
executions and runs × (turns + 1) model calls. A line that does not fails the whole report.
Repeated lines of one system and shape are reduced to their median. Writes results.json and
prints a markdown table. Standard library only."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timezone


PYTHON_PACKAGE = "agentloop (Python package)"
PYTHON_PEERS = ("pydantic-ai (FunctionModel)", "OpenAI Agents SDK (custom Model)",
                "LangGraph (create_react_agent + fake chat model)")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def check(line):
    runs, turns, calls = line["runs"], line["turns"], line["calls"]
    want_tools = runs * turns * calls
    want_models = runs * (turns + 1)
    if line["tool_executions"] != want_tools or line["model_calls"] != want_models:
        raise SystemExit(
            f"{line['system']} N={runs} T={turns} K={calls}: executed {line['tool_executions']} tool calls "
            f"and {line['model_calls']} model calls; expected {want_tools} and {want_models}")


def fmt_us(x):
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("raw")
    p.add_argument("--out", required=True)
    p.add_argument("--agentloop-version", default="agentloop")
    p.add_argument("--command", default="bench/run.sh")
    a = p.parse_args()

    lines = []
    with open(a.raw) as f:
        for text in f:
            text = text.strip()
            if text:
                lines.append(json.loads(text))

    loops = defaultdict(list)
    scale, streams, allocs = [], [], []
    for line in lines:
        if line["bench"] == "loop":
            check(line)
            if line["system"] == "agentloop":
                line["version"] = a.agentloop_version
            loops[(line["system"], line["runs"], line["turns"], line["calls"])].append(line)
        elif line["bench"] == "scale":
            if line["tool_executions"] != line["runs"] * line["turns"] * line["calls"]:
                raise SystemExit(f"scale: executed {line['tool_executions']} tool calls")
            scale.append(line)
        elif line["bench"] == "streams":
            streams.append(line)
        elif line["bench"] == "allocs":
            allocs.append(line)

    rows = []
    for (system, runs, turns, calls), reps in loops.items():
        model_calls = runs * (turns + 1)
        wall = statistics.median(r["wall_s"] for r in reps)
        cpu = statistics.median(r["cpu_s"] for r in reps)
        rows.append({
            "system": system,
            "version": reps[0].get("version", ""),
            "shape": {"runs": runs, "turns": turns, "calls": calls},
            "repetitions": len(reps),
            "tool_executions": reps[0]["tool_executions"],
            "wall_us_per_turn": wall / model_calls * 1e6,
            "cpu_us_per_turn": cpu / model_calls * 1e6,
            "ms_per_run": wall / runs * 1e3,
            "peak_rss_kb": int(statistics.median(r["peak_rss_kb"] for r in reps)),
        })
    shape_key = lambda r: (r["shape"]["turns"], -r["shape"]["calls"], r["shape"]["runs"])
    rows.sort(key=lambda r: (shape_key(r), r["system"] != "agentloop", r["wall_us_per_turn"]))
    base = {shape_key(r): r for r in rows if r["system"] == "agentloop"}
    for r in rows:
        b = base.get(shape_key(r))
        if b and r is not b:
            r["agentloop_speedup_wall"] = r["wall_us_per_turn"] / b["wall_us_per_turn"]
            r["agentloop_speedup_cpu"] = r["cpu_us_per_turn"] / b["cpu_us_per_turn"]
            r["agentloop_rss_ratio"] = r["peak_rss_kb"] / b["peak_rss_kb"]

    # agentloop's Python package against the fastest Python peer of each shape: the goal of the
    # package is at least 30x less CPU per turn, its Python callbacks included.
    python_package = []
    for key in sorted({shape_key(r) for r in rows}):
        ours = [r for r in rows if shape_key(r) == key and r["system"] == PYTHON_PACKAGE]
        peers = [r for r in rows if shape_key(r) == key and r["system"] in PYTHON_PEERS]
        if ours and peers:
            fastest = min(peers, key=lambda r: r["cpu_us_per_turn"])
            python_package.append({
                "shape": ours[0]["shape"],
                "cpu_us_per_turn": ours[0]["cpu_us_per_turn"],
                "fastest_peer": fastest["system"],
                "fastest_peer_cpu_us_per_turn": fastest["cpu_us_per_turn"],
                "less_cpu": fastest["cpu_us_per_turn"] / ours[0]["cpu_us_per_turn"],
                "goal": 30.0,
            })

    # Repeated scale lines of one build, runtime and system are reduced to their medians; each
    # loop's group is then set against its floor (the same timers with no loop around them).
    grouped = defaultdict(list)
    for line in scale:
        grouped[(line.get("allocator", "system"), line.get("runtime", "multi"), line["system"])].append(line)
    scale_groups = []
    for (allocator, runtime, system), reps in grouped.items():
        g = {k: reps[0][k] for k in ("system", "runs", "turns", "calls", "model_ms", "tool_ms", "ideal_s")}
        g.update({"allocator": allocator, "runtime": runtime, "repetitions": len(reps)})
        for k in ("wall_s", "cpu_s", "rss_per_run_kb", "peak_rss_kb"):
            g[k] = statistics.median(r[k] for r in reps)
        g["run_future_bytes"] = reps[0].get("run_future_bytes", 0)
        scale_groups.append(g)
    scale_floors = []
    for g in scale_groups:
        if g["system"] != "agentloop":
            continue
        floor = next((f for f in scale_groups if f["system"] != "agentloop"
                      and (f["allocator"], f["runtime"]) == (g["allocator"], g["runtime"])), None)
        if floor:
            ratio = g["wall_s"] / floor["wall_s"]
            scale_floors.append({
                "allocator": g["allocator"], "runtime": g["runtime"],
                "wall_s": g["wall_s"], "floor_wall_s": floor["wall_s"], "against_floor": ratio,
                "rss_per_run_kb": g["rss_per_run_kb"],
                "goal_against_floor": 2.0, "goal_kib_per_run": 16,
                "met": ratio <= 2.0 and g["rss_per_run_kb"] <= 16,
            })

    machine = {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "load_average_at_report": os.getloadavg(),
    }
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ""
    result = {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": a.command,
        "commit": commit,
        "machine": machine,
        "loop": rows,
        "scale": scale,
        "scale_medians": scale_groups,
        "scale_against_floor": scale_floors,
        "streams": streams,
        "allocs": allocs,
        "python_package": python_package,
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    out = []
    out.append(f"machine: {machine['nproc']} cores, {machine['cpu_model']}; load average "
               f"{', '.join(f'{x:.1f}' for x in machine['load_average_at_report'])}")
    out.append("")
    out.append("| system | version | N×T×K | wall µs/turn | CPU µs/turn | ms/run | peak RSS | agentloop faster (wall / CPU) | RSS ratio |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["shape"]
        speed = (f"{r['agentloop_speedup_wall']:,.1f}× / {r['agentloop_speedup_cpu']:,.1f}×"
                 if "agentloop_speedup_wall" in r else "—")
        rss = f"{r['agentloop_rss_ratio']:,.1f}×" if "agentloop_rss_ratio" in r else "—"
        out.append(f"| {r['system']} | {r['version']} | {s['runs']}×{s['turns']}×{s['calls']} | "
                   f"{fmt_us(r['wall_us_per_turn'])} | {fmt_us(r['cpu_us_per_turn'])} | {r['ms_per_run']:,.2f} | "
                   f"{r['peak_rss_kb'] / 1024:,.1f} MiB | {speed} | {rss} |")
    for p in python_package:
        s = p["shape"]
        out.append("")
        out.append(f"{PYTHON_PACKAGE}, {s['runs']}×{s['turns']}×{s['calls']}: {fmt_us(p['cpu_us_per_turn'])} CPU µs/turn, "
                   f"{p['less_cpu']:,.1f}× less than the fastest Python peer ({p['fastest_peer']}, "
                   f"{fmt_us(p['fastest_peer_cpu_us_per_turn'])}); goal {p['goal']:.0f}×: "
                   f"{'met' if p['less_cpu'] >= p['goal'] else 'not met'}")
    runtimes = {"multi": "a multi-thread runtime", "per-core": "a current-thread runtime a core",
                "current": "one current-thread runtime", "pinned": "tokio_util's LocalPoolHandle"}
    for g in scale_groups:
        out.append("")
        out.append(f"scale, {g['system']}, {runtimes.get(g['runtime'], g['runtime'])}, {g['allocator']} allocator "
                   f"(median of {g['repetitions']}): {g['runs']:,} concurrent runs × {g['turns']} tool turns and a final answer (model {g['model_ms']} ms, "
                   f"{g['calls']} tools × {g['tool_ms']} ms): wall {g['wall_s'] * 1e3:,.0f} ms against an ideal of "
                   f"{g['ideal_s'] * 1e3:,.0f} ms ({g['wall_s'] / g['ideal_s']:.2f}×), CPU {g['cpu_s'] * 1e3:,.0f} ms, "
                   f"peak RSS {g['peak_rss_kb'] / 1024:,.1f} MiB, {g['rss_per_run_kb']:,.1f} KiB per run"
                   + (f"; a run's future {g['run_future_bytes']:,} bytes" if g.get('run_future_bytes') else ""))
    for f in scale_floors:
        out.append("")
        out.append(f"scale against the floor, {runtimes.get(f['runtime'], f['runtime'])}, {f['allocator']} allocator: "
                   f"the loop takes {f['against_floor']:.2f}× the floor's wall time "
                   f"({f['wall_s'] * 1e3:,.0f} against {f['floor_wall_s'] * 1e3:,.0f} ms), "
                   f"{f['rss_per_run_kb']:,.1f} KiB a run; goal within {f['goal_against_floor']:.0f}× and at most "
                   f"{f['goal_kib_per_run']} KiB a run: {'met' if f['met'] else 'not met'}")
    for s in allocs:
        out.append("")
        out.append(f"allocations, agentloop, N={s['runs']} T={s['turns']} K={s['calls']}: "
                   f"{s['allocs_per_turn']:.1f} per turn ({s['bytes_per_turn']:,.0f} bytes), "
                   f"{s['allocs_per_call']:.1f} per tool call, {s['allocs_per_event']:.1f} per event, "
                   f"{s['allocs_per_journaled_step']:.1f} per journaled step")
    if streams:
        out.append("")
        out.append("| stream fixtures | parser | files | bytes | accumulator MB/s | serde_json MB/s | ratio |")
        out.append("|---|---|---|---|---|---|---|")
        for s in streams:
            out.append(f"| {s['fixtures']} | `{s['parser']}` | {s['files']} ({s['parsed_ok']} ok) | {s['bytes']:,} | "
                       f"{s['accumulator_mb_s']:,.0f} | {s['serde_json_mb_s']:,.0f} | {s['ratio']:.2f} |")
    out.append("")
    out.append(f"written: {a.out}")
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
