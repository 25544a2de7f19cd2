#!/usr/bin/env bash
# The Python package's checks, as .ci/run runs them: a virtual environment in
# $AGENTLOOP_CACHE/python-venv with the pinned tools (requirements.txt, and constraints.txt for
# what they depend on: PyPI only), made once; the wheel built from this clone by maturin and
# installed into it; mypy over the package and its stubs; then pytest (arguments go to pytest).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../scripts/lib/pinned.sh"
CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
VENV=$CACHE/python-venv
install_pinned() { pinned_venv "$VENV" "$here/requirements.txt" "$here/constraints.txt"; }
once "$VENV/.installed" "$CACHE/python-venv.lock" install_pinned "$here/requirements.txt" "$here/constraints.txt"
wheels=$(mktemp -d)
# A debug wheel: the tests check behaviour, not speed (bench/run.sh builds its own in release), and
# after a change to the workspace's crates their release build was most of this step's time.
trap 'rm -rf "$wheels"' EXIT
(cd "$here" && "$VENV/bin/maturin" build --quiet --out "$wheels" >&2)
"$VENV/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheels"/agentloop-*.whl
(cd "$here" && "$VENV/bin/mypy")
(cd "$here" && "$VENV/bin/pytest" -q "$@")
