#!/usr/bin/env bash
# Cache-Craft (no focus termination) inside llama.cpp, its α chosen on calibration questions and judged on others
# (docs/llamacpp.md §7). For each model: kvfuse-rag-eval --engine llamacpp over the calibration questions with every α
# of ALPHAS; the largest α whose mean TTFT there is at most BUDGET × llama.cpp's full prefill is chosen
# (scripts/check_docs.py --choose-alpha); then the judged questions run full prefill, naive reuse, AttnLink-16 and
# Cache-Craft at that α. All 10 passages, 2 threads. Resumable: a run whose results.json holds all its questions is
# not run again (kvfuse-rag-eval writes it after each question, so an interrupted run is redone).
# About 100 minutes on the 2-core VM: SmolLM2 about 70-75 (calibration 6-10, judged 56-64, docs/llamacpp.md §7, §9,
# §10), Gemma 3 about 27 (3 and 24, §7).
#   OUT (build/bench-llamacpp-cachecraft), MODELS ("smollm2 gemma3"), ALPHAS ("0.5 0.25 0.125"), BUDGET (0.30),
#   CAL_START (20), CAL_LIMIT (2), START (0), LIMIT (20), SUFFIX ("", or "-cover": Cache-Craft with prefix coverage,
#   cachecraft@α-nofocus-cover)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out=${OUT:-build/bench-llamacpp-cachecraft}
alphas=${ALPHAS:-0.5 0.25 0.125}
budget=${BUDGET:-0.30}
bin=build/ci/examples/kvfuse-rag-eval
cmake --build build/ci --target kvfuse-rag-eval >/dev/null
data=../shared/data/musique_dev.json
mkdir -p "$out"
# Whether DIR/results.json holds N questions.
complete() { [ -f "$1/results.json" ] && python3 -c "import json,sys; sys.exit(json.load(open('$1/results.json'))['questions'] != $2)"; }
for model in ${MODELS:-smollm2 gemma3}; do
  methods=full,naive
  for a in $alphas; do methods+=",cachecraft@$a-nofocus${SUFFIX:-}"; done
  if ! complete "$out/$model-calibration" "${CAL_LIMIT:-2}"; then
    echo "bench_llamacpp_cachecraft.sh: $model, calibration questions" >&2
    "$bin" --engine llamacpp --model "$model" --data "$data" --start "${CAL_START:-20}" --limit "${CAL_LIMIT:-2}" \
      --methods "$methods" --threads 2 --no-plot --out "$out/$model-calibration" >"$out/$model-calibration.log" 2>&1
  fi
  chosen=$(python3 scripts/check_docs.py --choose-alpha "$out/$model-calibration/results.json" --budget "$budget")
  echo "bench_llamacpp_cachecraft.sh: $model, chosen $chosen" >&2
  if ! complete "$out/$model-judged" "${LIMIT:-20}"; then
    "$bin" --engine llamacpp --model "$model" --data "$data" --start "${START:-0}" --limit "${LIMIT:-20}" \
      --methods "full,naive,attnlink@16,$chosen" --threads 2 --no-plot --out "$out/$model-judged" \
      >"$out/$model-judged.log" 2>&1
  fi
done
python3 scripts/check_docs.py --cachecraft-llamacpp "$out"
