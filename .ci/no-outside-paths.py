#!/usr/bin/env python3
"""Fails when code, tests, scripts or docs name a path outside the clone.

A clone must carry everything it needs: a test, bench, script or doc that reads `../something`
beside the repository, or an absolute path of one machine, works only on that machine. Checked:
every file git tracks or would track (not ignored), except lock files and this script. Flagged:

- absolute paths under a home or work folder (home, root, Users or work at the top of the file
  system; see ABSOLUTE below) that are not part of a URL;
- `$HOME/`, `${HOME}/` and `~/` paths, except the project's own cache (`.cache/agentloop`, the
  default of `$AGENTLOOP_CACHE`);
- relative paths whose `../` steps climb above the repository root, counted from the file's own
  folder, and for Rust files beside `CARGO_MANIFEST_DIR` from the crate's folder;
- `../NAME` paths that name nothing in the repository, from the file's folder, its crate's
  folder or the root (commands in docs run from the root): a README's `../NAME/x` that names no
  folder of the repository points beside the clone.

A file may hold hostile paths on purpose (tests that a path rule is not talked around): a line
with `outside-paths: off` stops the check until a line with `outside-paths: on` or the end of the
file.

Usage: .ci/no-outside-paths.py [ROOT]   Prints each hit as FILE:LINE: TEXT; exit status 1 if any.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
SELF = os.path.relpath(os.path.abspath(__file__), ROOT)

# Not preceded by a URL's or a path's own characters: `https://host/home/x` is not a local path.
ABSOLUTE = re.compile(r"(?<![\w.:/-])/(?:home|root|Users|work)/")
HOME = re.compile(r"(?:\$HOME|\$\{HOME\}|(?<![\w/.])~)/(?!\.cache/agentloop\b)")
UP = re.compile(r"(?<![\w.])((?:\.\./)+|(?:\.\.(?=[\"'`\s)]|$)))([\w.*-]+(?:/[\w.*-]+)*)?")


def files():
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file
        names = [os.path.relpath(os.path.join(d, f), ROOT)
                 for d, subdirs, fs in os.walk(ROOT) for f in fs
                 if not any(p in (".git", "target") for p in os.path.relpath(d, ROOT).split(os.sep))]
    for name in sorted(names):
        if name == SELF or os.path.basename(name) == "Cargo.lock" or not os.path.isfile(os.path.join(ROOT, name)):
            continue
        yield name


def depth(folder):
    return 0 if folder in ("", ".") else len(folder.split("/"))


def crate_depth(name):
    """The depth of the nearest folder above `name` that holds a Cargo.toml."""
    folder = os.path.dirname(name)
    while True:
        if os.path.isfile(os.path.join(ROOT, folder, "Cargo.toml")):
            return depth(folder)
        if folder in ("", "."):
            return 0
        folder = os.path.dirname(folder)


def names_something(name, match):
    """Whether `../NAME` resolves to something in the repository from one of its likely bases."""
    target = match.group(1) + match.group(2)
    # Up to the first glob or `$VAR`: `../fixtures/openai_c*/*.sse` needs `../fixtures/` to exist.
    target = re.split(r"[*$]", target)[0].rsplit("/", 1)[0] if re.search(r"[*$]", target) else target
    folder = os.path.dirname(name)
    while True:
        path = os.path.normpath(os.path.join(ROOT, folder, target))
        if path.startswith(ROOT + os.sep) and os.path.exists(path):
            return True
        if folder in ("", "."):
            return False
        folder = os.path.dirname(folder)


def climbs(match):
    text = match.group(1)
    return text.count("../") + (1 if text == ".." else 0)


def main():
    hits = []
    for name in files():
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (UnicodeDecodeError, OSError):
            continue  # binary
        room = depth(os.path.dirname(name))
        crate_room = crate_depth(name) if name.endswith(".rs") else None
        checking = True
        for i, line in enumerate(lines):
            if "outside-paths: off" in line:
                checking = False
            elif "outside-paths: on" in line:
                checking = True
            if not checking:
                continue
            bad = ABSOLUTE.search(line) or HOME.search(line)
            if not bad:
                near_manifest = crate_room is not None and any(
                    "CARGO_MANIFEST_DIR" in l for l in lines[max(0, i - 3): i + 1])
                limit = min(room, crate_room) if near_manifest else room
                bad = next((m for m in UP.finditer(line)
                            if climbs(m) > limit or (m.group(2) and not names_something(name, m))),
                           None)
            if bad:
                hits.append(f"{name}:{i + 1}: {line.strip()}")
    for hit in hits:
        print(hit)
    if hits:
        print(f"\n{len(hits)} path(s) outside the clone: the repository must carry what it uses.",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
