#!/usr/bin/env python3
"""Measure real latency of `agentloop run` against the local llama-server (examples/local).

For each question: start a fresh server with serve.sh (cold: the first request after the start,
empty prompt cache), run the question once cold and then REPEAT times warm on the same server.
Per run it reports the run's duration (from --json), the model's time as the server measured it
(the sum of its `total time` lines for the run's requests), the tools' time (from --json), and the
loop's own overhead: duration - model - tools (HTTP, SSE parsing, the run machine, spawning tools
is counted in tool time). Prints a markdown table.

Usage: scripts/local-model-latency.py [--threads N] [--repeat N] [--agentloop PATH]
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE = os.path.join(os.environ.get("AGENTLOOP_LOCAL_MODEL_DIR", os.path.join(ROOT, "scripts", "local-model")), "serve.sh")
CACHE = os.environ.get("AGENTLOOP_CACHE", os.path.expanduser("~/.cache/agentloop"))
QUESTIONS = ["What is the weather in Paris?", "What is 1234 plus 4321?"]
TOTAL = re.compile(r"total time =\s+([0-9.]+) ms")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_file(directory, port):
    example = os.path.join(ROOT, "examples", "local")
    with open(os.path.join(example, "agent.toml")) as f:
        text = f.read()
    text = text.replace('base_url = "http://127.0.0.1:8080/v1"', f'base_url = "http://127.0.0.1:{port}/v1"')
    text = text.replace('"tools/', f'"{example}/tools/')
    path = os.path.join(directory, "agent.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def server_ms(log, start):
    with open(log) as f:
        f.seek(start)
        return sum(float(m.group(1)) for m in TOTAL.finditer(f.read()))


def run_once(agentloop, agent, log, question):
    start = os.path.getsize(log)
    began = time.monotonic()
    out = subprocess.run([agentloop, "run", agent, "--input", question, "--json"], capture_output=True, text=True, timeout=900)
    wall = (time.monotonic() - began) * 1000
    time.sleep(0.2)  # let the server flush its timing lines
    d = json.loads(out.stdout)
    model = server_ms(log, start)
    tools = sum(c.get("duration_ms", 0) for c in d["tool_calls"])
    return {
        "stop": d["stop_reason"],
        "calls": len(d["tool_calls"]),
        "requests": d["model_calls"],
        "wall": wall,
        "run": d["duration_ms"],
        "model": model,
        "tools": tools,
        "overhead": d["duration_ms"] - model - tools,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--agentloop", default=os.path.join(ROOT, "target", "debug", "agentloop"))
    a = p.parse_args()
    rows = []
    for q in QUESTIONS:
        port = free_port()
        began = time.monotonic()
        pid = subprocess.run([SERVE, str(port), "-t", str(a.threads)], capture_output=True, text=True, check=True).stdout.split()[-1]
        started = (time.monotonic() - began) * 1000
        try:
            with tempfile.TemporaryDirectory() as d:
                agent = agent_file(d, port)
                log = os.path.join(CACHE, f"llama-server-{port}.log")
                runs = [run_once(a.agentloop, agent, log, q) for _ in range(1 + a.repeat)]
        finally:
            subprocess.run(["kill", pid])
        rows.append((q, started, runs[0], runs[1:]))
    load = os.getloadavg()[0]
    print(f"threads={a.threads}, load average at the end {load:.1f}, {a.repeat} warm runs each; times in ms\n")
    print("| question | server start | | stop | model requests | run | model (server) | tools | loop overhead | process wall |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for q, started, cold, warm in rows:
        def med(k):
            return statistics.median(r[k] for r in warm)
        print(f"| {q} | {started:.0f} | cold | {cold['stop']} | {cold['requests']} | {cold['run']:.0f} | {cold['model']:.0f} | {cold['tools']:.0f} | {cold['overhead']:.0f} | {cold['wall']:.0f} |")
        print(f"| | | warm (median) | {warm[0]['stop']} | {warm[0]['requests']} | {med('run'):.0f} | {med('model'):.0f} | {med('tools'):.0f} | {med('overhead'):.0f} | {med('wall'):.0f} |")


if __name__ == "__main__":
    main()
