#!/usr/bin/env bash
# kvfuse's reference CPU backend against llama.cpp, side by side: builds kvfuse-bench-prefill in build/bench (the
# bench preset, configured here with llama.cpp's source from scripts/fetch_llamacpp.sh), then times a full prefill of
# the same N MuSiQue tokens of the same GGUF on the same threads with each engine (CpuLlama::full_prefill, in one pass
# and in KVFUSE_BENCH_BLOCK_ROWS-row blocks; llama_decode in 512-token batches), for N = 512, 2048 and 6144. Each
# engine runs in its own process, so that peak RSS (VmHWM) is its own; the order of the three rotates from one N to
# the next. About 9 minutes on 2 threads with SmolLM2 (kvfuse's 6144-token prefill is most of it). Writes one JSON
# line per run to build/bench-llamacpp/results.jsonl and prints a markdown table.
#   KVFUSE_BENCH_MODEL (default: scripts/fetch_model.sh smollm2), KVFUSE_BENCH_THREADS (2), KVFUSE_BENCH_REPS (3),
#   KVFUSE_BENCH_TOKENS ("512 2048 6144"), KVFUSE_BENCH_BLOCK_ROWS (512),
#   KVFUSE_BENCH_LLAMACPP_ISA: native (default: llama.cpp's default build, -march=native) or avx2 (GGML_NATIVE=OFF:
#   AVX, AVX2, FMA, F16C and BMI2, no AVX-512, as llama.cpp builds on the AVX2-only machines CI runs on; in
#   build/bench-avx2, results in build/bench-llamacpp-avx2). kvfuse's own build is the same either way: no -march
#   flags, its AVX2 + FMA kernels chosen at run time. Each llama.cpp line of results.jsonl carries its system_info.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
isa=${KVFUSE_BENCH_LLAMACPP_ISA:-native}
case "$isa" in
  native) build=build/bench out=build/bench-llamacpp isa_args=() ;;
  avx2) build=build/bench-avx2 out=build/bench-llamacpp-avx2 isa_args=(-B build/bench-avx2 -DGGML_NATIVE=OFF) ;;
  *) echo "bench_llamacpp.sh: KVFUSE_BENCH_LLAMACPP_ISA=$isa: expected native or avx2" >&2; exit 2 ;;
esac
cmake --preset bench "${isa_args[@]}" -DKVFUSE_LLAMACPP=ON -DKVFUSE_LLAMACPP_SOURCE="$(bash scripts/fetch_llamacpp.sh)" \
  >/dev/null
cmake --build "$build" --target kvfuse-bench-prefill
bin=$build/integrations/llamacpp/kvfuse-bench-prefill
model=${KVFUSE_BENCH_MODEL:-$(bash scripts/fetch_model.sh smollm2)}
threads=${KVFUSE_BENCH_THREADS:-2}
reps=${KVFUSE_BENCH_REPS:-3}
mkdir -p "$out"
: >"$out/results.jsonl"

# kvfuse twice: all rows in one pass, and in BLOCK-row blocks (CpuLlamaOptions::prefill_block_rows, llama.cpp's
# batch size by default); llama.cpp in its 512-row batches.
block=${KVFUSE_BENCH_BLOCK_ROWS:-512}
engines=(kvfuse:0 "kvfuse:$block" llamacpp:0)
for n in ${KVFUSE_BENCH_TOKENS:-512 2048 6144}; do
  for e in "${engines[@]}"; do
    engine=${e%%:*} rows=${e#*:}
    echo "bench_llamacpp.sh: $engine, block rows $rows, $n tokens, $threads threads, $reps reps" >&2
    "$bin" --engine "$engine" --model "$model" --tokens "$n" --threads "$threads" --reps "$reps" --block-rows "$rows" \
      | tee -a "$out/results.jsonl"
  done
  engines=("${engines[2]}" "${engines[0]}" "${engines[1]}")  # the order rotates from one N to the next
done

python3 - "$out/results.jsonl" "$model" <<'EOF'
import json
import os
import sys

runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    name = "llamacpp" if r["engine"] == "llamacpp" else ("kvfuse" if r["block_rows"] == 0 else "blocks")
    runs.setdefault(r["tokens"], {})[name] = r
first = next(iter(runs.values()))
print(f"\nFull prefill, {os.path.basename(sys.argv[2])}, {first['kvfuse']['threads']} threads, median of "
      f"{len(first['kvfuse']['ms'])} reps, kvfuse in one pass and in {first['blocks']['block_rows']}-row blocks\n")
print("| tokens | kvfuse tok/s | blocks tok/s | llama.cpp tok/s | kvfuse / llama.cpp | blocks / llama.cpp "
      "| kvfuse peak RSS MiB | blocks peak RSS MiB | llama.cpp peak RSS MiB | RSS ratio | blocks RSS ratio |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in sorted(runs):
    k, b, l = runs[n]["kvfuse"], runs[n]["blocks"], runs[n]["llamacpp"]
    t, r = lambda x: x["tokens_per_s"], lambda x: x["peak_rss_mib"]
    print(f"| {n} | {t(k):.0f} | {t(b):.0f} | {t(l):.0f} | {t(k) / t(l):.2f}× | {t(b) / t(l):.2f}× "
          f"| {r(k):.0f} | {r(b):.0f} | {r(l):.0f} | {r(k) / r(l):.2f} | {r(b) / r(l):.2f} |")
EOF
