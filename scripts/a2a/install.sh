#!/usr/bin/env bash
# Installs the official A2A SDK (a2a-sdk from PyPI, with its HTTP server and uvicorn) that tests
# `agentloop a2a serve` and the `a2a` tool entry, at the version pinned beside this script
# (requirements.txt, and constraints.txt for its dependencies), once, into a virtual environment
# in $AGENTLOOP_CACHE/a2a. Registries only.
# Prints that folder on stdout: venv/bin/python has the SDK.
# Safe to run from tests in parallel: one installer at a time, and a stamp of what was installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
DEST=$CACHE/a2a
STAMP=$DEST/.installed
want() { cat "$here/requirements.txt" "$here/constraints.txt"; }
if ! want | cmp -s - "$STAMP" 2>/dev/null; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/a2a.lock"
  flock 9
  if ! want | cmp -s - "$STAMP" 2>/dev/null; then
    rm -rf "$DEST"
    mkdir -p "$DEST"
    python3 -m venv "$DEST/venv" >&2
    "$DEST/venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt" -c "$here/constraints.txt" >&2
    want >"$STAMP"
  fi
  flock -u 9
fi
echo "$DEST"
