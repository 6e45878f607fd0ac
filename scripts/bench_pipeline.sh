#!/usr/bin/env bash
# Layer-pipelined loading on the real model and a real store (docs/pipeline.md): kvfuse-rag-eval on MuSiQue with
# the chunk caches in a DiskKVStore behind a 20 MB/s link, once with layer-pipelined loading and once with whole
# blocks loaded before layer 0, with CacheBlend's ratio swept and picked by its loading controller
# (cacheblend@auto). Prints both tables; results.json of each run under build/bench-pipeline/.
#   KVFUSE_MODEL (default: scripts/fetch_model.sh), KVFUSE_DATA, QUESTIONS (3), PASSAGES (6), PASSAGE_TOKENS (150),
#   MBPS (20)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
eval_bin=${KVFUSE_RAG_EVAL:-build/ci/examples/kvfuse-rag-eval}
[ -x "$eval_bin" ] || { echo "build kvfuse-rag-eval first (cmake --preset ci && cmake --build --preset ci)" >&2; exit 2; }
model=${KVFUSE_MODEL:-$(bash scripts/fetch_model.sh)}
data=${KVFUSE_DATA:-$root/../shared/data/musique_dev.json}
out=build/bench-pipeline
methods=full,naive,attnlink,cachecraft,cacheblend@0.05,cacheblend,cacheblend@0.3,cacheblend@0.4,cacheblend@0.5,cacheblend@0.7,cacheblend@auto
for pipeline in on off; do
  rm -rf "$out/$pipeline"
  "$eval_bin" --model "$model" --data "$data" --limit "${QUESTIONS:-3}" --max-passages "${PASSAGES:-6}" \
    --max-passage-tokens "${PASSAGE_TOKENS:-150}" --max-new-tokens 8 --methods "$methods" --store disk \
    --link-mbps "${MBPS:-20}" --pipeline "$pipeline" --out "$out/$pipeline" --no-plot
done
