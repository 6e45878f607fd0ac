#!/usr/bin/env bash
# A/B of LlamaCppFusion's block check: "before" restores each block twice (checked by a restore in load_rows, then
# entered before its run), "after" reads it without llama.cpp and restores it once. Gemma 3, questions 0-1, alternating.
# Committed as gemma3-<n>-check ("after": kvfuse-rag-eval of 4a08a87) and gemma3-<n>-lazy ("before": of 05094e0).
# The sixth run was stopped once the result was clear; the fifth is the last complete one.
cd /work/main
n=0
for which in after before after before after before; do
  n=$((n+1))
  /tmp/ab2/rag-eval-$which --engine llamacpp --model gemma3 --data ../shared/data/musique_dev.json --start 0 --limit 2 \
    --methods full,naive,attnlink@16,cachecraft@0.125-nofocus --threads 2 --no-plot \
    --out /tmp/ab2/g-$n-$which > /tmp/ab2/g-$n-$which.log 2>&1
done
echo done > /tmp/ab2/finished
