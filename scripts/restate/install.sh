#!/usr/bin/env bash
# Installs the Restate server (durable execution engine) the tests drive, at the pinned version,
# once, into $AGENTLOOP_CACHE/restate, from the npm registry: the npm package ships the static
# server binary in a per-platform package (@restatedev/restate-server-<os>-<arch>), so no other
# download is needed. Prints the absolute path of that binary on stdout, and nothing else there.
# Safe to run from tests in parallel: one installer at a time, and a stamp of what was installed.
set -euo pipefail
VERSION=1.7.12
CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
case $CACHE in /*) ;; *) CACHE=$PWD/$CACHE ;; esac # the printed path must be absolute
DEST=$CACHE/restate
STAMP=$DEST/.installed

# npm names platforms as node does (os.platform()-os.arch()); the wrapper in the main package
# resolves the binary the same way.
case "$(uname -s)" in
  Linux) os=linux ;;
  Darwin) os=darwin ;;
  *) echo "restate-server: unsupported OS $(uname -s)" >&2; exit 1 ;;
esac
case "$(uname -m)" in
  x86_64 | amd64) arch=x64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "restate-server: unsupported CPU $(uname -m)" >&2; exit 1 ;;
esac
BIN=$DEST/node_modules/@restatedev/restate-server-$os-$arch/bin/restate-server

installed() { [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION" ] && [ -x "$BIN" ]; }

if ! installed; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/restate.lock"
  flock 9
  if ! installed; then
    command -v npm >/dev/null || { echo "npm is required to install restate-server" >&2; exit 1; }
    rm -rf "$DEST"
    mkdir -p "$DEST"
    # --ignore-scripts: the only install script is the @scarf/scarf dependency's, which phones
    # home with install analytics; SCARF_ANALYTICS=false says no too, in case scripts run anyway.
    # The binary needs no install script: it is a plain file inside the platform package.
    SCARF_ANALYTICS=false npm install --prefix "$DEST" --no-audit --no-fund --ignore-scripts \
      --loglevel=error "@restatedev/restate-server@$VERSION" >&2
    [ -x "$BIN" ] || { echo "restate-server binary not found at $BIN after npm install" >&2; exit 1; }
    got=$("$BIN" --version)
    [ "$got" = "restate-server $VERSION" ] || { echo "unexpected version: $got" >&2; exit 1; }
    echo "$VERSION" >"$STAMP"
  fi
  flock -u 9
fi
echo "$BIN"
