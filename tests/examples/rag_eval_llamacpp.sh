#!/usr/bin/env bash
# example.rag_eval_llamacpp: kvfuse-rag-eval --engine llamacpp end to end on the real model (one MuSiQue question,
# three short passages): full prefill, naive reuse, AttnLink and Cache-Craft without focus termination run inside
# llama.cpp; checks results.json's shape and its exact invariants, and that a per-layer method is refused.
# Skips (exit 77) without the model file or the dataset.
set -euo pipefail
bin=$1 data=$2
model=${KVFUSE_MODEL:-${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}/SmolLM2-135M-Instruct.Q4_1.gguf}
[[ -f $model ]] || { echo "skipped: no model file $model (scripts/fetch_model.sh)"; exit 77; }
[[ -f $data ]] || { echo "skipped: no dataset $data"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" --engine llamacpp --model "$model" --data "$data" --limit 1 --max-passages 3 --max-passage-tokens 60 \
  --max-new-tokens 8 --methods full,prefix,naive,attnlink@16,cachecraft-nofocus --out "$out" --no-plot
python3 - "$out/results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["engine"] == "llamacpp" and r["questions"] == 1, (r["engine"], r["questions"])
assert r["chunk_caches_computed"] == 4, r["chunk_caches_computed"]  # system prompt + 3 passages
names = ["full", "prefix", "naive", "attnlink@16", "cachecraft-nofocus"]
full = r["methods"]["full"]
assert full["recompute_fraction"] == 1.0 and full["kl_first_token"] == 0.0, full
assert full["kl_answer_mean"] == 0.0 and full["top1_answer_agreement"] == 1.0, full
for n in names[1:]:
    m = r["methods"][n]
    assert 0.0 < m["recompute_fraction"] < 1.0, (n, m["recompute_fraction"])
    assert m["kl_answer_mean"] >= 0.0 and 0.0 <= m["top1_answer_agreement"] <= 1.0, (n, m)
assert r["methods"]["naive"]["gap_closed"] == 0.0, r["methods"]["naive"]
# AttnLink recomputes more than naive reuse (the boundaries), Cache-Craft its fixed tokens on top.
assert r["methods"]["attnlink@16"]["recompute_fraction"] > r["methods"]["naive"]["recompute_fraction"]
print("results.json ok:", {n: round(r["methods"][n]["recompute_fraction"], 3) for n in names})
PY
if "$bin" --engine llamacpp --model "$model" --data "$data" --methods naive,cacheblend --out "$out/refused" \
  2>"$out/err"; then
  echo "cacheblend on llama.cpp was not refused" >&2
  exit 1
fi
grep -q "'cacheblend' changes the recomputed set per layer, which llama.cpp cannot" "$out/err"
