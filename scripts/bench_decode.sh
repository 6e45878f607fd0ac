#!/usr/bin/env bash
# Two builds of kvfuse-rag-eval on the same decode-heavy run, alternated: wall time of each run (CSV) and whether the
# two produce the same figures (every field of results.json but the timings).
#   bash scripts/bench_decode.sh BEFORE_BIN AFTER_BIN OUT_DIR [RUNS]
# The run: one MuSiQue question (question 0, 2 passages cut to 40 tokens), full prefill, naive reuse and CacheBlend,
# 8 answer tokens each, teacher-forced: mostly one-token forward passes. SHAPE=prefill runs a prefill-heavy one
# instead: question 0 with its 10 passages whole (about 6200 tokens), the same methods and answer tokens. SHAPE=fusion
# runs the per-layer statistics: questions 0-1, 10 passages cut to 130 tokens, naive reuse, CacheBlend (K deviation),
# QueryAware (query mass) and Cache-Craft with prefix coverage (chunk mass; its variants recorded by a full prefill in
# another passage order). BEFORE_FLAGS / AFTER_FLAGS: more kvfuse-rag-eval flags for each build (e.g. the same binary
# twice with AFTER_FLAGS="--products bf16"; same_figures is then false, as it must be when the flags change the
# numerics). Writes OUT_DIR/decode.csv (run, build, seconds) and OUT_DIR/summary.json
# (medians, their ratio, same_figures, shape, the flags).
set -euo pipefail
before=$1 after=$2 out=$3 runs=${4:-5}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model=${KVFUSE_MODEL:-$(bash "$root/scripts/fetch_model.sh" smollm2)}
data=$root/../shared/data/musique_dev.json
shape=${SHAPE:-decode}
methods=naive,cacheblend
limit=1
case $shape in
  decode) passages=(--max-passages 2 --max-passage-tokens 40) ;;
  prefill) passages=(--max-passages 10) ;;
  fusion)
    passages=(--max-passages 10 --max-passage-tokens 130)
    methods=naive,cacheblend,queryaware,cachecraft@1.5-cover
    limit=2
    ;;
  *) echo "bench_decode.sh: SHAPE '$shape' is not decode, prefill or fusion" >&2; exit 2 ;;
esac
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "run,build,seconds" >"$out/decode.csv"
for ((i = 1; i <= runs; i++)); do
  for build in before after; do
    bin=$before flags=${BEFORE_FLAGS:-}
    [[ $build == after ]] && bin=$after flags=${AFTER_FLAGS:-}
    start=$(date +%s.%N)
    # shellcheck disable=SC2086 # the flags: words
    "$bin" --model "$model" --data "$data" --limit "$limit" "${passages[@]}" --max-new-tokens 8 \
      --methods "$methods" --threads 2 --no-plot --out "$tmp/$build" $flags >/dev/null 2>&1
    end=$(date +%s.%N)
    echo "$i,$build,$(python3 -c "print(round($end - $start, 3))")" >>"$out/decode.csv"
  done
done
python3 - "$out" "$tmp" "$shape" "${BEFORE_FLAGS:-}" "${AFTER_FLAGS:-}" <<'PY'
import csv, json, statistics, sys
out, tmp, shape, before_flags, after_flags = sys.argv[1:6]
rows = list(csv.DictReader(open(f"{out}/decode.csv")))
med = {b: statistics.median(float(r["seconds"]) for r in rows if r["build"] == b) for b in ("before", "after")}
def figures(x):  # every field but the timings
    if isinstance(x, dict):
        return {k: figures(v) for k, v in x.items() if not ("_ms" in k or k.startswith("ttft") or k == "layers")}
    if isinstance(x, list):
        return [figures(v) for v in x]
    return x
same = figures(json.load(open(f"{tmp}/before/results.json"))) == figures(json.load(open(f"{tmp}/after/results.json")))
summary = {"shape": shape, "median_s": med, "speedup": round(med["before"] / med["after"], 2), "runs": len(rows) // 2,
           "same_figures": same, **({"before_flags": before_flags} if before_flags else {}),
           **({"after_flags": after_flags} if after_flags else {})}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary))
PY
