#!/usr/bin/env bash
# Installs what the tests on a real file system that ignores case need
# (crates/agentloop-cli/tests/protected.rs, through tests/support/fat.rs): Debian's fusefat, a FAT file system in FUSE
# mounted from an image file (no loop device, no kernel module but FUSE's; FAT ignores case as
# macOS's and Windows' file systems do), and dosfstools, whose mkfs.vfat makes the image. Done
# once: nothing happens when both are there. Needs apt-get, as root or through sudo; prints
# nothing on stdout. The tests skip, saying why, where FUSE or root is missing.
set -euo pipefail
PATH=$PATH:/usr/sbin:/sbin
if command -v fusefat >/dev/null && command -v mkfs.vfat >/dev/null; then
  exit 0
fi
command -v apt-get >/dev/null || { echo "fusefat and dosfstools: no apt-get to install them with" >&2; exit 1; }
as_root=""
[ "$(id -u)" -eq 0 ] || as_root="sudo"
$as_root apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends fusefat dosfstools >&2
