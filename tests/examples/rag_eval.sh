#!/usr/bin/env bash
# example.rag_eval: kvfuse-rag-eval end to end on the real model, one MuSiQue question with two short passages,
# every default method; checks the shape and the exact invariants of results.json and that the plot is written.
# Skips (exit 77) without the model file or the dataset.
set -euo pipefail
bin=$1 data=$2
model=${KVFUSE_MODEL:-${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}/SmolLM2-135M-Instruct.Q4_1.gguf}
[[ -f $model ]] || { echo "skipped: no model file $model (scripts/fetch_model.sh)"; exit 77; }
[[ -f $data ]] || { echo "skipped: no dataset $data"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" --model "$model" --data "$data" --limit 1 --max-passages 2 --max-passage-tokens 40 --max-new-tokens 8 \
  --out "$out" --cache-dir "$out/cache"
test -s "$out/fidelity_ttft.png"
grep -q "| cacheblend |" "$out/results.md"
python3 - "$out/results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["questions"] == 1, r["questions"]
assert r["chunk_caches_computed"] == 3, r["chunk_caches_computed"]  # system prompt + 2 passages
names = ["full", "prefix", "naive", "cacheblend", "queryaware", "attnlink", "cachecraft", "cacheblend@0.05",
         "queryaware@0.15:0.5", "attnlink@4"]
keys = ["ttft_ms", "ttft_ratio_vs_full", "recompute_fraction", "kl_first_token", "exact_match_vs_full",
        "rouge_l_vs_full", "f1_vs_gold"]
for n in names:
    for k in keys:
        assert k in r["methods"][n], (n, k)
full = r["methods"]["full"]
assert full["ttft_ratio_vs_full"] == 1.0 and full["recompute_fraction"] == 1.0, full
assert full["kl_first_token"] == 0.0 and full["exact_match_vs_full"] == 1.0 and full["rouge_l_vs_full"] == 1.0, full
for n in names[1:]:
    m = r["methods"][n]
    assert 0.0 < m["recompute_fraction"] < 1.0, (n, m["recompute_fraction"])
    assert m["kl_first_token"] >= 0.0, (n, m)
# Prefix caching reuses exact in-context KV: the same first-token distribution up to float rounding.
assert r["methods"]["prefix"]["kl_first_token"] < 1e-6, r["methods"]["prefix"]
# Teacher-forced fidelity over the full-prefill answer: full agrees with itself exactly; naive's gap is the unit.
assert r["per_question"][0]["methods"]["full"]["answer"] != ""
for n in names:
    for k in ["kl_answer_mean", "top1_answer_agreement", "gap_closed"]:
        assert k in r["methods"][n], (n, k)
    assert r["methods"][n]["kl_answer_mean"] >= 0.0 and 0.0 <= r["methods"][n]["top1_answer_agreement"] <= 1.0
assert full["kl_answer_mean"] == 0.0 and full["top1_answer_agreement"] == 1.0 and full["gap_closed"] == 1.0, full
assert r["methods"]["naive"]["gap_closed"] == 0.0, r["methods"]["naive"]
assert r["methods"]["prefix"]["kl_answer_mean"] < 1e-6, r["methods"]["prefix"]
print("results.json ok:", {n: round(r["methods"][n]["recompute_fraction"], 3) for n in names})
PY
# A second run finds every chunk cache on disk (--cache-dir persists across runs).
"$bin" --model "$model" --data "$data" --limit 1 --max-passages 2 --max-passage-tokens 40 --max-new-tokens 8 \
  --methods naive --out "$out/again" --cache-dir "$out/cache" --no-plot >/dev/null
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["chunk_caches_computed"] == 0, r["chunk_caches_computed"]' \
  "$out/again/results.json"
# Chunk caches behind the system turn (--chunk-context system, as kvfuse-server stores them): the passages' caches
# only (the system turn is computed every time, so naive reuse recomputes more), prefix entries still exact.
"$bin" --model "$model" --data "$data" --limit 1 --max-passages 2 --max-passage-tokens 40 --max-new-tokens 4 \
  --methods naive,prefix --chunk-context system --out "$out/system" --no-plot >/dev/null
python3 - "$out/system/results.json" "$out/results.json" <<'PY'
import json, sys
behind, alone = (json.load(open(p)) for p in sys.argv[1:])
assert (behind["chunk_context"], alone["chunk_context"]) == ("system", "none"), (behind["chunk_context"],
                                                                             alone["chunk_context"])
assert behind["chunk_caches_computed"] == 2, behind["chunk_caches_computed"]  # the 2 passages
naive_behind, naive_alone = behind["methods"]["naive"], alone["methods"]["naive"]
assert naive_behind["recompute_fraction"] > naive_alone["recompute_fraction"], (naive_behind, naive_alone)
assert behind["methods"]["prefix"]["kl_first_token"] < 1e-6, behind["methods"]["prefix"]
print("chunk context ok")
PY
# Real I/O: a disk store alone behind a 50 MB/s link, layer-pipelined (default) and whole blocks, passages cut
# into 16-token chunks by KVSplit: the same logits either way (layer-pipelined loading installs the same bytes),
# the per-layer trace present only when pipelined, the loading controller's ratio after the first measured run.
for pipeline in on off; do
  "$bin" --model "$model" --data "$data" --limit 1 --max-passages 2 --max-passage-tokens 40 --max-new-tokens 4 \
    --methods naive,cacheblend,cacheblend@auto --store disk --cache-dir "$out/disk" --link-mbps 50 \
    --pipeline $pipeline --split-tokens 16 --out "$out/$pipeline" --no-plot >/dev/null
done
python3 - "$out/on/results.json" "$out/off/results.json" <<'PY'
import json, sys
on, off = (json.load(open(p)) for p in sys.argv[1:])
assert on["store"] == "disk" and on["link_mbps"] == 50 and on["pipeline"] is True and off["pipeline"] is False
assert on["split_tokens"] == 16
q_on, q_off = on["per_question"][0], off["per_question"][0]
assert q_on["chunk_caches_computed"] >= 5, q_on["chunk_caches_computed"]  # 2 passages of 40 tokens -> 16-token chunks
for m in ["naive", "cacheblend"]:
    a, b = q_on["methods"][m], q_off["methods"][m]
    assert a["layerwise"] == 1.0 and b["layerwise"] == 0.0, (m, a["layerwise"], b["layerwise"])
    assert len(a["layers"]) == 30 and "layers" not in b, m
    assert a["preload_depth"] >= 1, a
    assert a["kl_first_token"] == b["kl_first_token"], (m, a["kl_first_token"], b["kl_first_token"])
assert "controller_ratio" in q_on["methods"]["cacheblend@auto"], q_on["methods"]["cacheblend@auto"]
assert 0.15 <= q_on["methods"]["cacheblend@auto"]["controller_ratio"] <= 1.0
assert "controller_ratio" not in q_off["methods"]["cacheblend@auto"]  # nothing measured without pipelining
print("real I/O runs ok")
PY
