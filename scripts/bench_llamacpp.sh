#!/usr/bin/env bash
# kvfuse's reference CPU backend against llama.cpp, side by side: builds kvfuse-bench-prefill in build/bench (the
# bench preset, configured here with llama.cpp's source from scripts/fetch_llamacpp.sh), then times a full prefill of the same N MuSiQue tokens of the same GGUF
# on the same threads with each engine (CpuLlama::full_prefill; llama_decode in 512-token batches), for N = 512,
# 2048 and 6144. Each engine runs in its own process, so that peak RSS (VmHWM) is its own; the order of the two
# alternates from one N to the next. About 6 minutes on 2 threads with SmolLM2 (kvfuse's 6144-token prefill is
# most of it). Writes one JSON line per run to build/bench-llamacpp/results.jsonl and prints a markdown table.
#   KVFUSE_BENCH_MODEL (default: scripts/fetch_model.sh smollm2), KVFUSE_BENCH_THREADS (2), KVFUSE_BENCH_REPS (3),
#   KVFUSE_BENCH_TOKENS ("512 2048 6144")
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake --preset bench -DKVFUSE_LLAMACPP=ON -DKVFUSE_LLAMACPP_SOURCE="$(bash scripts/fetch_llamacpp.sh)" >/dev/null
cmake --build build/bench --target kvfuse-bench-prefill
bin=build/bench/integrations/llamacpp/kvfuse-bench-prefill
model=${KVFUSE_BENCH_MODEL:-$(bash scripts/fetch_model.sh smollm2)}
threads=${KVFUSE_BENCH_THREADS:-2}
reps=${KVFUSE_BENCH_REPS:-3}
out=build/bench-llamacpp
mkdir -p "$out"
: >"$out/results.jsonl"

engines=(kvfuse llamacpp)
for n in ${KVFUSE_BENCH_TOKENS:-512 2048 6144}; do
  for engine in "${engines[@]}"; do
    echo "bench_llamacpp.sh: $engine, $n tokens, $threads threads, $reps reps" >&2
    "$bin" --engine "$engine" --model "$model" --tokens "$n" --threads "$threads" --reps "$reps" \
      | tee -a "$out/results.jsonl"
  done
  engines=("${engines[1]}" "${engines[0]}")
done

python3 - "$out/results.jsonl" "$model" <<'EOF'
import json
import os
import sys

runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault(r["tokens"], {})[r["engine"]] = r
first = next(iter(runs.values()))["kvfuse"]
print(f"\nFull prefill, {os.path.basename(sys.argv[2])}, {first['threads']} threads, "
      f"median of {len(first['ms'])} reps\n")
print("| tokens | kvfuse tok/s | llama.cpp tok/s | ratio kvfuse/llama.cpp | kvfuse peak RSS MiB "
      "| llama.cpp peak RSS MiB | RSS ratio |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for n in sorted(runs):
    k, l = runs[n]["kvfuse"], runs[n]["llamacpp"]
    print(f"| {n} | {k['tokens_per_s']:.0f} | {l['tokens_per_s']:.0f} | {k['tokens_per_s'] / l['tokens_per_s']:.2f} "
          f"| {k['peak_rss_mib']:.0f} | {l['peak_rss_mib']:.0f} | {k['peak_rss_mib'] / l['peak_rss_mib']:.2f} |")
EOF
