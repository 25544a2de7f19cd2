# Sourced by the local-model scripts: the cache folder, and the few system tools the scripts need,
# installed with apt-get when missing (a fresh machine has a Rust toolchain and python3, maybe not
# a C++ compiler or python3-venv).

CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
mkdir -p "$CACHE"

# Installs Debian packages when we can (root, or sudo without a password); otherwise says what to
# install and fails, rather than failing later with a less clear message.
apt_install() {
  local sudo=
  if [ "$(id -u)" != 0 ]; then sudo="sudo -n"; fi
  if command -v apt-get >/dev/null 2>&1 && { [ -z "$sudo" ] || sudo -n true 2>/dev/null; }; then
    echo "installing $* with apt-get" >&2
    $sudo apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >&2
  else
    echo "please install: $* (needed to build and serve the local model)" >&2
    return 1
  fi
}

# A virtualenv of our own in the cache: pip (to download from PyPI), cmake and ninja (to build
# llama.cpp). The system python's pip may be missing or managed by the distribution.
TOOLS=$CACHE/build-tools
ensure_tools() {
  if [ ! -x "$TOOLS/bin/cmake" ] || [ ! -x "$TOOLS/bin/ninja" ]; then
    rm -rf "$TOOLS"
    if ! python3 -m venv "$TOOLS" >/dev/null 2>&1; then
      # Debian's python3 makes venvs only with python3-venv installed.
      rm -rf "$TOOLS"
      apt_install python3-venv && python3 -m venv "$TOOLS" >&2
    fi
    "$TOOLS/bin/pip" install -q --disable-pip-version-check cmake ninja >&2
  fi
}

# Downloads exact PyPI files into a folder (no dependencies).
pip_download() {
  local dir=$1; shift
  ensure_tools
  "$TOOLS/bin/pip" download --disable-pip-version-check --no-deps -q -d "$dir" "$@" >&2
}

# Fails unless FILE has the sha256 SHA.
check_sha256() {
  echo "$2  $1" | sha256sum -c --quiet - >/dev/null 2>&1
}

# Runs the rest of the calling script under an exclusive lock on a cache file, so two callers
# (two test processes, a test and a user) never build or download into the same place at once.
lock() {
  exec 9>"$CACHE/$1.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
}
