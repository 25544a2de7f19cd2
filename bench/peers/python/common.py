"""What every Python harness shares: the command line, the turn read from a call id, the timing
and the one JSON line the runner checks (see bench/run.sh)."""

import argparse
import asyncio
import json
import resource
import time
from importlib.metadata import version


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20)
    return p.parse_args()


def call_id(turn, k):
    """The id of call `k` of tool turn `turn`: the models read the turn back from it."""
    return f"t{turn}_{k}"


def turn_after(last_call_id):
    """The turn that follows the tool result whose call id is given (0 when there is none)."""
    if not last_call_id or not last_call_id.startswith("t"):
        return 0
    return int(last_call_id[1:].split("_")[0]) + 1


def raw_arguments(turn, k):
    """The raw JSON argument string a provider would send for call `k` of `turn`."""
    return '{"turn":%d,"k":%d,"note":"no-op call"}' % (turn, k)


class Counters:
    """Model calls answered and tool calls executed, over the timed runs."""

    def __init__(self):
        self.model_calls = 0
        self.tool_executions = 0


def measure(system, packages, run_once, counters, args):
    """Warms up, then times `args.runs` runs of `run_once` (an async function) one after another
    and prints one JSON line."""

    async def main():
        for _ in range(args.warmup):
            await run_once()
        counters.model_calls = 0
        counters.tool_executions = 0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for _ in range(args.runs):
            await run_once()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        return wall, cpu

    wall, cpu = asyncio.run(main())
    print(json.dumps({
        "system": system,
        "version": ", ".join(f"{p} {version(p)}" for p in packages),
        "bench": "loop",
        "runs": args.runs, "turns": args.turns, "calls": args.calls,
        "model_calls": counters.model_calls,
        "tool_executions": counters.tool_executions,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }))
