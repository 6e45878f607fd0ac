#!/usr/bin/env bash
# A/B of LlamaCppFusion's block restore: eager (before) vs lazy (after), same questions, alternating.
cd /work/main
for which in before after; do
  /tmp/ab/rag-eval-$which --engine llamacpp --model smollm2 --data ../shared/data/musique_dev.json --start 20 --limit 2 \
    --methods full,naive,attnlink@16,cachecraft@0.5-nofocus,cachecraft@0.25-nofocus --threads 2 --no-plot \
    --out /tmp/ab/$which > /tmp/ab/$which.log 2>&1
done
echo done > /tmp/ab/finished
