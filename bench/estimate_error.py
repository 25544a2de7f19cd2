#!/usr/bin/env python3
"""How far the compaction estimate (UTF-8 bytes / 3, see crates/agentloop/src/compaction.rs) is
from a real tokenizer's count: the local model's (Qwen2.5, a byte-level BPE of the same family as
OpenAI's), through llama-server's /tokenize. Starts the server with scripts/local-model/serve.sh
(built and fetched on first use), tokenizes samples of prose, JSON, Rust and Chinese taken from
the repository (the Chinese from a file of this script's own), and prints estimate / real for each.

Usage: python3 bench/estimate_error.py
"""
import json
import math
import os
import socket
import subprocess
import sys
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHINESE = (
    "代理循环把模型的决定交给工具执行，再把结果交还给模型。每一次调用都先经过校验："
    "工具必须存在，参数必须符合模式，调用编号不能重复。超出预算时，运行会停下来，"
    "并说明停止的原因，已经完成的工作都会保留。长对话会在超出上下文窗口之前被压缩，"
    "较早的轮次由模型写成摘要，最近的轮次保持完整。"
) * 6


def samples():
    def read(path, limit=6000):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            return f.read()[:limit]

    return [
        ("prose (docs/architecture.md)", read("docs/architecture.md")),
        ("JSON (a recorded Anthropic response)",
         read("crates/agentloop-providers/tests/fixtures/anthropic/anth_ns_parallel4.json")),
        ("Rust (compaction.rs)", read("crates/agentloop/src/compaction.rs")),
        ("Chinese", CHINESE),
    ]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    port = free_port()
    pid = subprocess.run(
        [os.path.join(ROOT, "scripts/local-model/serve.sh"), str(port), "-t", "1"],
        check=True, capture_output=True, text=True,
    ).stdout.strip().splitlines()[-1]
    try:
        print(f"{'sample':40} {'bytes':>7} {'tokens':>7} {'estimate':>8} {'est/real':>8}")
        for name, text in samples():
            body = json.dumps({"content": text}).encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/tokenize", body, {"Content-Type": "application/json"}
            )
            tokens = len(json.load(urllib.request.urlopen(req, timeout=60))["tokens"])
            size = len(text.encode())
            estimate = math.ceil(size / 3)
            print(f"{name:40} {size:7} {tokens:7} {estimate:8} {estimate / tokens:8.2f}")
    finally:
        subprocess.run(["kill", pid], check=False)


if __name__ == "__main__":
    sys.exit(main())
