#!/usr/bin/env bash
# Installs the official A2A SDK (a2a-sdk from PyPI, with its HTTP server and uvicorn) that tests
# `agentloop a2a serve` and the `a2a` tool entry, at the version pinned beside this script
# (requirements.txt, and constraints.txt for its dependencies), once, into a virtual environment
# in $AGENTLOOP_CACHE/a2a. Registries only.
# Prints that folder on stdout: venv/bin/python has the SDK.
# Safe to run from tests in parallel: one installer at a time, and a stamp of what was installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/pinned.sh"
CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
DEST=$CACHE/a2a
install_pinned() {
  rm -rf "$DEST"
  mkdir -p "$DEST"
  pinned_venv "$DEST/venv" "$here/requirements.txt" "$here/constraints.txt"
}
once "$DEST/.installed" "$CACHE/a2a.lock" install_pinned "$here/requirements.txt" "$here/constraints.txt"
echo "$DEST"
