#!/usr/bin/env bash
# The CUDA kernels on a GPU in one call: builds every GPU test (tests/gpu/*.cu) and kernel benchmark
# (bench/cuda/*.cu) with nvcc alone (no CMake dependencies: the lent GPU machines have only the CUDA
# toolkit and PyTorch), runs the tests, then the benchmarks and PyTorch's SDPA baseline, and prints
# the tables last. docs/kernels.md records its output.
#
#   bash scripts/bench_kernels.sh [--tests-only | --bench-only] [--sanitize]
#
#   --sanitize   also runs each GPU test under compute-sanitizer (memcheck, then racecheck)
#
# Logs go to $OUT (the device tool's output folder) when it is set, else to build/kernels/logs:
#   build.log, gpu_tests.log, sanitizer.log, bench.md (every table), sdpa.md.
# Exit status: non-zero if a build or a GPU test failed (the benchmarks still run after a test failure).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mode=all
sanitize=0
for arg in "$@"; do
  case $arg in
    --tests-only) mode=tests ;;
    --bench-only) mode=bench ;;
    --sanitize) sanitize=1 ;;
    *) echo "bench_kernels.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

bin=build/kernels/bin
logs=${OUT:-build/kernels/logs}
mkdir -p "$bin" "$logs"
export PATH="/usr/local/cuda/bin:$PATH"
nvcc=$(command -v nvcc) || { echo "bench_kernels.sh: nvcc not found" >&2; exit 1; }
arch=${KVFUSE_CUDA_ARCH:-90}
flags=(-std=c++20 -O3 -lineinfo -gencode "arch=compute_$arch,code=sm_$arch" -Xcompiler=-Wall,-Wextra
       -Iinclude -Iharness/include -Ikernels/include -Itests/gpu -Ibench/cuda)

{
  date -u '+# %Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
  "$nvcc" --version | tail -1
  git log -1 --format='commit %h %s' 2>/dev/null || true
} | tee "$logs/build.log"

# Build every source in parallel; each compile's output goes to build.log.
sources=()
[[ $mode != bench ]] && sources+=(tests/gpu/*.cu)
[[ $mode != tests ]] && sources+=(bench/cuda/*.cu)
build_one() {
  local src=$1 name
  name=$(basename "$src" .cu)
  [[ $src == bench/* ]] && name="bench-$name" || name="gpu-$name"
  if out=$("$nvcc" "${flags[@]}" "$src" -o "$bin/$name" 2>&1); then
    printf '[built] %s\n%s\n' "$src" "$out"
  else
    printf '[BUILD FAILED] %s\n%s\n' "$src" "$out"
    return 1
  fi
}
build_failed=0
start=$SECONDS
pids=()
for src in "${sources[@]}"; do
  ( build_one "$src" >"$bin/$(basename "$src").buildlog" 2>&1 ) &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || build_failed=1
  cat "$bin/$(basename "${sources[$i]}").buildlog" >>"$logs/build.log"
done
echo "built ${#sources[@]} sources in $((SECONDS - start)) s (failures: $build_failed)" | tee -a "$logs/build.log"
grep -h '^\[BUILD FAILED\]' "$logs/build.log" || true

tests_failed=0
summary=()
if [[ $mode != bench ]]; then
  : >"$logs/gpu_tests.log"
  for exe in "$bin"/gpu-*; do
    [[ -x $exe ]] || continue
    t0=$SECONDS
    "$exe" >>"$logs/gpu_tests.log" 2>&1
    rc=$?
    summary+=("$(printf '| %-28s | %-7s | %4d s |' "$(basename "$exe")" "$([[ $rc == 0 ]] && echo pass || echo "FAIL $rc")" $((SECONDS - t0)))")
    ((rc != 0)) && tests_failed=1
    if ((sanitize)) && command -v compute-sanitizer >/dev/null; then
      for tool in memcheck racecheck; do
        compute-sanitizer --tool "$tool" --error-exitcode 3 "$exe" >>"$logs/sanitizer.log" 2>&1
        rc=$?
        summary+=("$(printf '| %-28s | %-7s | %s |' "$(basename "$exe")" "$([[ $rc == 0 ]] && echo pass || echo "FAIL $rc")" "$tool")")
        ((rc != 0)) && tests_failed=1
      done
    fi
  done
  grep -E '^\[FAILED\]|FAILED ' "$logs/gpu_tests.log" | head -40
fi

if [[ $mode != tests ]]; then
  : >"$logs/bench.md"
  for exe in "$bin"/bench-*; do
    [[ -x $exe ]] || continue
    echo "## $(basename "$exe")" >>"$logs/bench.md"
    "$exe" >>"$logs/bench.md" 2>&1 || echo "(exit $?)" >>"$logs/bench.md"
    echo >>"$logs/bench.md"
  done
  if [[ -f scripts/bench_sdpa.py ]]; then
    PYTHONUNBUFFERED=1 python3 scripts/bench_sdpa.py >"$logs/sdpa.md" 2>&1 || echo "(exit $?)" >>"$logs/sdpa.md"
  fi
fi

echo
echo "==================== kvfuse kernels on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) ===================="
if ((${#summary[@]})); then
  echo "| GPU test | result | time |"
  echo "|---|---|---|"
  printf '%s\n' "${summary[@]}"
fi
[[ -f $logs/bench.md && $mode != tests ]] && cat "$logs/bench.md"
[[ -f $logs/sdpa.md && $mode != tests ]] && cat "$logs/sdpa.md"
exit $((build_failed || tests_failed))
