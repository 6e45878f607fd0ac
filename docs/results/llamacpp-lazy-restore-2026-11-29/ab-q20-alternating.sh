#!/usr/bin/env bash
cd /work/main
for which in after before after before; do
  n=$((${n:-0}+1))
  /tmp/ab/rag-eval-$which --engine llamacpp --model smollm2 --data ../shared/data/musique_dev.json --start 20 --limit 1 \
    --methods full,cachecraft@0.5-nofocus,cachecraft@0.25-nofocus --threads 2 --no-plot \
    --out /tmp/ab/r2-$n-$which > /tmp/ab/r2-$n-$which.log 2>&1
done
echo done > /tmp/ab/finished2
