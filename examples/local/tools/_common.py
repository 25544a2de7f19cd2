"""Shared helpers for the example command tools: read the JSON arguments from stdin, answer on
stdout, and fail with a message on stderr and a non-zero exit (which agentloop reports to the
model as a tool error)."""

import json
import os
import sys


def read_args():
    """The tool's arguments: one JSON object on stdin."""
    try:
        args = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        fail(f"arguments are not valid JSON: {e}")
    if not isinstance(args, dict):
        fail("arguments must be a JSON object")
    return args


def fail(message):
    """A tool error: the model reads `message`."""
    print(message, file=sys.stderr)
    sys.exit(1)


def reply(value):
    """The result the model reads, as compact JSON."""
    print(json.dumps(value, separators=(",", ":")))


def number(args, key):
    """`args[key]` as a number (ints stay ints), or a tool error."""
    value = args.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(f"{key!r} must be a number, got {json.dumps(value)}")
    return value


def state_dir():
    """Where tools keep state: $AGENT_STATE_DIR, or the working directory."""
    path = os.environ.get("AGENT_STATE_DIR") or os.getcwd()
    os.makedirs(path, exist_ok=True)
    return path
