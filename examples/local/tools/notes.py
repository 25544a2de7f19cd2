"""save_note / list_notes: a note store, one JSON line per note in notes.jsonl under
$AGENT_STATE_DIR (or the working directory).

Usage: notes.py save   with {"text": str} on stdin -> {"saved": n}
       notes.py list   with {} on stdin            -> {"notes": [str, ...]}
"""

import json
import os
import sys

from _common import fail, read_args, reply, state_dir


def main():
    action = sys.argv[1] if len(sys.argv) > 1 else ""
    args = read_args()
    path = os.path.join(state_dir(), "notes.jsonl")
    if action == "save":
        text = args.get("text")
        if not isinstance(text, str) or not text.strip():
            fail("'text' must be a non-empty string")
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"text": text.strip()}) + "\n")
        with open(path, encoding="utf-8") as f:
            reply({"saved": sum(1 for _ in f)})
    elif action == "list":
        notes = []
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                notes = [json.loads(line)["text"] for line in f if line.strip()]
        reply({"notes": notes})
    else:
        fail(f"usage: notes.py save|list (got {action!r})")


if __name__ == "__main__":
    main()
