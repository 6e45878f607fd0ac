#!/usr/bin/env bash
# Continuous batching on the real model (docs/serving.md): kvfuse-serve-bench RUNS times on the same arrivals
# (--seed) — batched with kvfuse's request-keyed hooks, one request at a time, batched full prefill — each run's
# JSON line and per-request detail into OUT/run-N.json, then the medians over the runs.
#   KVFUSE_MODEL (default: scripts/fetch_model.sh), KVFUSE_DATA, RUNS (3), REQUESTS (16), RATE (1.0), METHOD
#   (cacheblend), PASSAGES (3), POOL (10), MAX_TOKENS (16), OUT (build/bench-serving)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bench=${KVFUSE_SERVE_BENCH:-build/bench/bench/kvfuse-serve-bench}
[ -x "$bench" ] || { echo "build kvfuse-serve-bench first (cmake --preset bench && cmake --build --preset bench)" >&2; exit 2; }
model=${KVFUSE_MODEL:-$(bash scripts/fetch_model.sh)}
data=${KVFUSE_DATA:-$root/../shared/data/musique_dev.json}
out=${OUT:-build/bench-serving}
mkdir -p "$out"
for run in $(seq 1 "${RUNS:-3}"); do
  "$bench" --model "$model" --data "$data" --requests "${REQUESTS:-16}" --rate "${RATE:-1.0}" \
    --method "${METHOD:-cacheblend}" --passages "${PASSAGES:-3}" --pool "${POOL:-10}" \
    --max-tokens "${MAX_TOKENS:-16}" --out "$out/tmp" | tee "$out/line-$run.json"
  mv "$out/tmp/serve_bench.json" "$out/run-$run.json"
done
rmdir "$out/tmp"
python3 - "$out" "${RUNS:-3}" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
rs = [json.load(open(f"{out}/run-{i}.json")) for i in range(1, runs + 1)]
med = lambda f: statistics.median(f(r) for r in rs)
summary = {
    "runs": runs,
    "throughput_tok_s": {a: med(lambda r: r["throughput_tok_s"][a]) for a in ("batched", "one_at_a_time", "full")},
    "batched_over_one_at_a_time": med(lambda r: r["throughput_tok_s"]["batched"] / r["throughput_tok_s"]["one_at_a_time"]),
    "batched_over_full": med(lambda r: r["throughput_tok_s"]["batched"] / r["throughput_tok_s"]["full"]),
    "ttft_p99_ms": {"batched": med(lambda r: r["ttft_ms"]["p99"]),
                    "one_at_a_time": med(lambda r: r["ttft_ms_one_at_a_time"]["p99"]),
                    "full": med(lambda r: r["ttft_ms_full"]["p99"])},
    "ttft_p50_ms": {"batched": med(lambda r: r["ttft_ms"]["p50"]),
                    "one_at_a_time": med(lambda r: r["ttft_ms_one_at_a_time"]["p50"]),
                    "full": med(lambda r: r["ttft_ms_full"]["p50"])},
    "hook_overhead": med(lambda r: r["hook_overhead"]),
    "load_wait_share": med(lambda r: r["load_wait_share"]),
    "install_share": med(lambda r: r["install_share"]),
    "equal_alone_all_runs": all(r["equal_alone"] for r in rs),
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary))
PY
