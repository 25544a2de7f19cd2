# What the scripts that install pinned packages into the cache share (python/test.sh,
# scripts/a2a/install.sh, scripts/mcp/install.sh). Source it, then:
#
#   once STAMP LOCK INSTALL FILE...
#       runs the function INSTALL, under the lock file LOCK, unless STAMP holds the FILEs'
#       contents as they are now (what is pinned), and then writes them there. Safe from tests
#       that start in parallel: one installer at a time, and the others find its stamp.
#   pinned_venv VENV REQUIREMENTS CONSTRAINTS
#       makes the virtual environment VENV afresh with what REQUIREMENTS pins, their dependencies
#       held to CONSTRAINTS (PyPI only).

once() {
  local stamp=$1 lock=$2 install=$3
  shift 3
  if ! cat "$@" | cmp -s - "$stamp" 2>/dev/null; then
    mkdir -p "$(dirname "$lock")"
    exec 9>"$lock"
    flock 9
    if ! cat "$@" | cmp -s - "$stamp" 2>/dev/null; then
      "$install"
      cat "$@" >"$stamp"
    fi
    flock -u 9
  fi
}

pinned_venv() {
  rm -rf "$1"
  python3 -m venv "$1" >&2
  "$1/bin/pip" install --quiet --disable-pip-version-check -r "$2" -c "$3" >&2
}
