#!/usr/bin/env bash
# Installs HAProxy (the load balancer `bench/restate.py --workers N` puts in front of N
# `agentloop serve` workers: Restate speaks HTTP/2 to one endpoint and keeps one connection to
# it, so sharing its invocations between workers takes a balancer that picks a worker for each
# HTTP/2 stream), once, into $AGENTLOOP_CACHE/haproxy, from the Debian archive: the package and
# the libraries it needs that a base system lacks, unpacked (no root, nothing installed system
# wide). Prints a command prefix on stdout that runs that binary: `env LD_LIBRARY_PATH=... PATH`.
set -euo pipefail
CACHE=${AGENTLOOP_CACHE:-$HOME/.cache/agentloop}
case $CACHE in /*) ;; *) CACHE=$PWD/$CACHE ;; esac
DEST=$CACHE/haproxy
STAMP=$DEST/.installed
PACKAGES="haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1"

# The unpacked binary, wherever the package puts it under the cache's root.
unpacked() { find "$DEST/root" -type f -path '*/sbin/haproxy' -perm -u+x 2>/dev/null | head -n 1; }
installed() { [ "$(cat "$STAMP" 2>/dev/null)" = "$PACKAGES" ] && [ -n "$(unpacked)" ]; }

if ! installed; then
  command -v apt-get >/dev/null || { echo "apt-get is required to fetch haproxy" >&2; exit 1; }
  mkdir -p "$CACHE"
  exec 9>"$CACHE/haproxy.lock"
  flock 9
  if ! installed; then
    rm -rf "$DEST"
    mkdir -p "$DEST/debs"
    (cd "$DEST/debs" && apt-get download $PACKAGES >&2)
    for deb in "$DEST"/debs/*.deb; do dpkg -x "$deb" "$DEST/root"; done
    echo "$PACKAGES" >"$STAMP"
  fi
  flock -u 9
fi
libs=$(find "$DEST/root" -name '*.so*' -printf '%h\n' | sort -u | paste -sd: -)
echo "env LD_LIBRARY_PATH=$libs $(unpacked)"
