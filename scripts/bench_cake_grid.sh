#!/usr/bin/env bash
# Cake at its defaults over a grid of link speeds and stored-prefix lengths (docs/cake-real.md): for each cell one
# kvfuse-cake-run with the chunk sizes it chooses from measured speeds, a disk store behind a throttled link of that
# speed (1 ms latency), PROMPTS MuSiQue prompts from question START (a prefix longer than a question's ten passages
# takes the next questions' passages), each prompt's best static split found by the coarse-to-fine sweep and then
# Cake, compute-only, load-only and that split REPEATS times each. Builds kvfuse-cake-run in build/ci (the ci
# preset). One JSON file per cell in OUT (a cell already there is kept: the grid resumes), then a markdown table of
# Cake / best static split and Cake / better single resource per cell, over its prompts (ratios of the means of the
# prompts' medians), against the goals 1.05 and 1.02. Paths are relative to the repository's root.
#   PREFIXES ("1024 2048 4096"), LINKS ("2 4 8 15 30 60 120", MB/s), PROMPTS (5), START (50), REPEATS (3),
#   OUT (build/cake-grid), KVFUSE_MODEL (default: scripts/fetch_model.sh smollm2), DATA (../shared/data/musique_dev.json)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake --preset ci >/dev/null
cmake --build build/ci --target kvfuse-cake-run >/dev/null
bin=build/ci/examples/kvfuse-cake-run
model=${KVFUSE_MODEL:-$(bash scripts/fetch_model.sh smollm2)}
data=${DATA:-../shared/data/musique_dev.json}
out=${OUT:-build/cake-grid}
mkdir -p "$out"
for prefix in ${PREFIXES:-1024 2048 4096}; do
  for link in ${LINKS:-2 4 8 15 30 60 120}; do
    cell="$out/prefix-$prefix-link-$link.json"
    [[ -s $cell ]] && continue
    echo "bench_cake_grid.sh: prefix $prefix, $link MB/s ($(date -u +%H:%M:%S) UTC)" >&2
    "$bin" --model "$model" --data "$data" --prefix-tokens "$prefix" --limit "${PROMPTS:-5}" --start "${START:-50}" \
      --store disk --link-mbps "$link" --link-latency-ms 1 --repeats "${REPEATS:-3}" --composed 0 >"$cell.part"
    mv "$cell.part" "$cell"
  done
done
python3 scripts/check_docs.py --cake-grid "$out"
