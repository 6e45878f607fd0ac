#!/usr/bin/env bash
# Prints the path of the llama.cpp source tree kvfuse's llama.cpp integration builds against
# (integrations/llamacpp, -DKVFUSE_LLAMACPP=ON): the copy vendored in the llama-cpp-python 0.3.36 source
# distribution on PyPI, downloaded once, checked against its sha256, unpacked to
# ${KVFUSE_CACHE_DIR:-~/.cache/kvfuse}/llama.cpp-0.3.36. KVFUSE_LLAMACPP_SOURCE=/path/to/llama.cpp uses that
# tree instead. Only the path goes to stdout; progress and errors go to stderr. Nothing is fetched at build or
# test time: CMake is given the path this prints.
set -euo pipefail

version=0.3.36
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
cache=${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}
dest=$cache/llama.cpp-$version

if [[ -n ${KVFUSE_LLAMACPP_SOURCE:-} ]]; then
  if [[ ! -f $KVFUSE_LLAMACPP_SOURCE/include/llama.h ]]; then
    echo "fetch_llamacpp.sh: KVFUSE_LLAMACPP_SOURCE=$KVFUSE_LLAMACPP_SOURCE has no include/llama.h" >&2
    exit 1
  fi
  echo "$KVFUSE_LLAMACPP_SOURCE"
  exit 0
fi
if [[ -f $dest/.kvfuse-sha256 && $(cat "$dest/.kvfuse-sha256") == "$sha" ]]; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.fetch-llamacpp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch_llamacpp.sh: downloading llama-cpp-python==$version (source distribution) from PyPI" >&2
python3 -m pip download --quiet --no-deps --no-binary :all: --no-cache-dir "llama-cpp-python==$version" -d "$tmp" >&2
sdist=$tmp/llama_cpp_python-$version.tar.gz
if [[ ! -f $sdist ]]; then
  echo "fetch_llamacpp.sh: pip did not leave $sdist" >&2
  exit 1
fi
if ! echo "$sha  $sdist" | sha256sum --check --status; then
  echo "fetch_llamacpp.sh: sha256 of $sdist is $(sha256sum "$sdist" | cut -d' ' -f1), expected $sha" >&2
  exit 1
fi
tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-$version/vendor/llama.cpp"
src=$tmp/llama_cpp_python-$version/vendor/llama.cpp
if [[ ! -f $src/include/llama.h ]]; then
  echo "fetch_llamacpp.sh: $sdist has no vendor/llama.cpp/include/llama.h" >&2
  exit 1
fi
echo "$sha" >"$src/.kvfuse-sha256"
rm -rf "$dest"
mv "$src" "$dest"
echo "$dest"
