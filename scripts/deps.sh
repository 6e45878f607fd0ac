#!/usr/bin/env bash
# Installs what building and testing kvfuse needs, and only what is missing, so a second run does
# nothing (and needs no root). Debian/Ubuntu: apt packages, then Conan 2 from PyPI.
# The CUDA toolkit (nvcc) is not installed here: the `ci` preset expects it on the machine already.
set -euo pipefail

APT_PACKAGES=(
  cmake make g++           # build
  libfmt-dev libxxhash-dev # kvfuse's public dependencies (fmt; XXH3 checksums and keys)
  libhiredis-dev           # kvfuse::redis (RedisKVStore)
  redis-server redis-tools # the redis tests start real servers (single node and Cluster)
  liblz4-dev libzstd-dev   # kvfuse::codecs (compressed stored KV)
  clang                    # the libFuzzer targets (GGUF, store entries) and the sanitize preset's compiler
  libeigen3-dev            # reference CPU backend (kvfuse::cpu)
  libpcre2-dev pkg-config  # tokenizer pre-tokenizer regexes (kvfuse::cpu)
  nlohmann-json3-dev       # examples reading MuSiQue JSON
  libcpp-httplib-dev       # kvfuse-server (apps/server): HTTP server
  python3-venv             # the server test installs the openai client into a venv
  doctest-dev              # unit tests
  libbenchmark-dev         # benchmarks
  gnuplot-nox              # benchmark plots
  python3-pip              # Conan
)

if command -v dpkg-query >/dev/null; then
  missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]]; then
      sudo=()
    elif command -v sudo >/dev/null; then
      sudo=(sudo)
    else
      echo "deps.sh: missing ${missing[*]}, and neither root nor sudo to install them" >&2
      exit 1
    fi
    echo "deps.sh: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "deps.sh: apt packages present (${APT_PACKAGES[*]})"
  fi
else
  echo "deps.sh: no dpkg-query (not Debian/Ubuntu); install by hand: ${APT_PACKAGES[*]}" >&2
fi

# Conan 2. Debian's own python3 is "externally managed" (PEP 668): fall back to a --user install there.
export PATH="$HOME/.local/bin:$PATH"
conan_major() { conan --version 2>/dev/null | sed -n 's/^Conan version \([0-9]*\)\..*/\1/p'; }
if [[ $(conan_major) != 2 ]]; then
  echo "deps.sh: installing Conan 2 with pip"
  python3 -m pip install --quiet "conan>=2.0,<3" ||
    python3 -m pip install --quiet --user --break-system-packages "conan>=2.0,<3"
  hash -r
  if [[ $(conan_major) != 2 ]]; then
    echo "deps.sh: Conan 2 still not on PATH after pip install" >&2
    exit 1
  fi
fi
echo "deps.sh: $(conan --version) at $(command -v conan)"
