#!/usr/bin/env bash
# Three builds of kvfuse-rag-eval on Gemma 3, questions 0-1, 10 passages, 2 threads, rotating order:
#   eager: 760630c (every block restored, and shifted by llama.cpp, in load_rows)
#   lazy:  05094e0 (each block checked by a restore in load_rows, restored again before its run, shifted by llama.cpp)
#   bytes: 9a5a454 (checked without llama.cpp, moved in its bytes by kvfuse, restored once before its run)
cd /work/main
# Binaries: eager = kvfuse-rag-eval of 760630c, lazy = of 05094e0, bytes = of 9a5a454 (its angles were kvfuse's double
# table; a465ac3 then formed them as ggml does, which changes the rounding of K, not the time).
n=0
for round in 1 2 3; do
  for which in bytes lazy eager; do
    n=$((n+1))
    /tmp/ab2/rag-eval-$which --engine llamacpp --model ${MODEL:-gemma3} --data ../shared/data/musique_dev.json --start 0 \
      --limit 2 --methods full,naive,attnlink@16,cachecraft@0.125-nofocus --threads 2 --no-plot \
      --out /tmp/ab3/${MODEL:-gemma3}-$n-$which > /tmp/ab3/${MODEL:-gemma3}-$n-$which.log 2>&1
  done
done
echo done > /tmp/ab3/finished-${MODEL:-gemma3}
