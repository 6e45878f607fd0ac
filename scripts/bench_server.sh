#!/usr/bin/env bash
# kvfuse-server against llama-server (docs/server.md, "Against llama-server"): the same model file, threads and
# number of concurrent requests, driven by one load generator written with the official openai client
# (scripts/server_loadgen.py, asyncio): REQUESTS MuSiQue chat requests, CONCURRENCY at a time, PASSAGES passages
# each drawn from a pool of POOL so that passages recur in other orders, MAX_TOKENS greedy answer tokens.
#
# Four arms per run (six with LLAMACPP_ARMS=1), each on a freshly started server (empty caches), in this order:
#   kvfuse-full     kvfuse-server, every request kvfuse.method = full (the reference of its answers)
#   kvfuse          kvfuse-server, every request kvfuse.method = METHOD (default cacheblend: r = 15 %)
#   kvfuse-llamacpp-full  LLAMACPP_ARMS=1: kvfuse-server --engine llamacpp, kvfuse.method = full (its reference)
#   kvfuse-llamacpp       LLAMACPP_ARMS=1: --engine llamacpp, kvfuse.method = LLAMACPP_METHOD (default attnlink)
#                   Off by default: with CONCURRENCY 8 and CTX_PER_SLOT 2048 every step of that engine attends over
#                   18432 cells and took about 47 s on 2 cores (docs/server.md), too long for a run.
#   llama-full      llama-server, every request cache_prompt = false (the reference of its answers)
#   llama-reuse     llama-server with its prefix cache and --cache-reuse 256 (shifted chunk reuse)
# Each reuse arm's answers are compared with its own server's full-prefill answers (exact match, ROUGE-L).
#
# Builds what it needs: kvfuse-server in build/ci (configured with `cmake --preset ci` if it is not), llama-server
# from the llama.cpp source scripts/fetch_llamacpp.sh fetches (build/llama-server; without AMX, as
# integrations/llamacpp builds it), and a venv with openai and rouge-score (build/bench-venv).
#   KVFUSE_MODEL (default: scripts/fetch_model.sh smollm2), KVFUSE_DATA, THREADS (2), RUNS (3), REQUESTS (64),
#   CONCURRENCY (8), PASSAGES (5), POOL (40), MAX_TOKENS (32), PASSAGE_WORDS (100: each passage's first 100 words,
#   about 130 tokens; 0 keeps them whole, about 600), METHOD (cacheblend), LLAMACPP_METHOD (attnlink), CTX_PER_SLOT
#   (2048: llama-server's context per slot and kvfuse-server --engine llamacpp's --region-cells), CHUNK_CONTEXT
#   (system: kvfuse-server --engine cpu's --chunk-context; none computes chunk caches alone), LLAMA_ARMS (1; 0 skips
#   the two llama-server arms and the ratios to them), FIRST_QUESTION (0: the pool's questions start there; the
#   judged requests are 0's, a setting is chosen on another's, e.g. 50), KVFUSE_FLAGS (more kvfuse-server --engine cpu
#   flags for both of its arms, e.g. "--products bf16"), OUT (build/bench-server)
# Writes OUT/run-N/<arm>.json (the load generator's output) and OUT/summary.json (medians over the runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

threads=${THREADS:-2}
chunk_context=${CHUNK_CONTEXT:-system}
runs=${RUNS:-3}
concurrency=${CONCURRENCY:-8}
ctx_per_slot=${CTX_PER_SLOT:-2048}
out=${OUT:-build/bench-server}
model=${KVFUSE_MODEL:-$(bash scripts/fetch_model.sh smollm2)}
data=${KVFUSE_DATA:-$root/../shared/data/musique_dev.json}

[[ -f build/ci/CMakeCache.txt ]] || cmake --preset ci >/dev/null
cmake --build build/ci --target kvfuse-server >/dev/null
kvfuse_server=build/ci/apps/server/kvfuse-server
if [[ ${LLAMA_ARMS:-1} == 1 ]]; then
  src=$(bash scripts/fetch_llamacpp.sh)
  noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  [[ -f build/llama-server/CMakeCache.txt ]] || cmake -S "$src" -B build/llama-server -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" >/dev/null
  cmake --build build/llama-server --target llama-server -j"$(nproc)" >/dev/null
fi
llama_server=build/llama-server/bin/llama-server
venv=build/bench-venv
[[ -x $venv/bin/python3 ]] || python3 -m venv "$venv"
"$venv/bin/python3" -c "import openai, rouge_score" 2>/dev/null || "$venv/bin/pip" install --quiet openai rouge-score

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pid=""
stop_server() { [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=""; }
trap stop_server EXIT
wait_ready() {  # $1 port: until /health answers 200
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { echo "bench_server.sh: the server exited; log: $2" >&2; exit 1; }
    sleep 0.2
  done
  echo "bench_server.sh: the server did not become ready; log: $2" >&2
  exit 1
}
port=""
start_kvfuse() {  # $1 log, rest: more server flags; sets port and pid
  local log=$1
  shift
  port=$(free_port)
  "$kvfuse_server" --model "$model" --host 127.0.0.1 --port "$port" --threads "$threads" \
    --max-running "$concurrency" --store memory "$@" >/dev/null 2>"$log" &
  pid=$!
  wait_ready "$port" "$log"
}
start_llama() {  # $1 log; sets port and pid
  port=$(free_port)
  "$llama_server" -m "$model" --host 127.0.0.1 --port "$port" -t "$threads" -tb "$threads" -np "$concurrency" \
    -c $((concurrency * ctx_per_slot)) --cache-reuse 256 >"$1" 2>&1 &
  pid=$!
  wait_ready "$port" "$1"
}
load() {  # $1 port, $2 label, rest: load generator flags
  local port=$1 label=$2
  shift 2
  "$venv/bin/python3" scripts/server_loadgen.py --url "http://127.0.0.1:$port/v1" --data "$data" \
    --requests "${REQUESTS:-64}" --concurrency "$concurrency" --passages "${PASSAGES:-5}" --pool "${POOL:-40}" \
    --max-tokens "${MAX_TOKENS:-32}" --passage-words "${PASSAGE_WORDS:-100}" --first-question "${FIRST_QUESTION:-0}" \
    --label "$label" "$@"
}

mkdir -p "$out"
for run in $(seq 1 "$runs"); do
  dir=$out/run-$run
  mkdir -p "$dir"
  echo "bench_server.sh: run $run of $runs" >&2
  # shellcheck disable=SC2086 # KVFUSE_FLAGS: words
  start_kvfuse "$dir/kvfuse-full.log" --chunk-context "$chunk_context" ${KVFUSE_FLAGS:-}
  load "$port" kvfuse-full --method full >"$dir/kvfuse-full.json"
  stop_server
  # shellcheck disable=SC2086
  start_kvfuse "$dir/kvfuse.log" --chunk-context "$chunk_context" ${KVFUSE_FLAGS:-}
  load "$port" kvfuse --method "${METHOD:-cacheblend}" --compare "$dir/kvfuse-full.json" >"$dir/kvfuse.json"
  stop_server
  if [[ ${LLAMACPP_ARMS:-0} == 1 ]]; then
    start_kvfuse "$dir/kvfuse-llamacpp-full.log" --engine llamacpp --region-cells "$ctx_per_slot"
    load "$port" kvfuse-llamacpp-full --method full >"$dir/kvfuse-llamacpp-full.json"
    stop_server
    start_kvfuse "$dir/kvfuse-llamacpp.log" --engine llamacpp --region-cells "$ctx_per_slot"
    load "$port" kvfuse-llamacpp --method "${LLAMACPP_METHOD:-attnlink}" --compare "$dir/kvfuse-llamacpp-full.json" \
      >"$dir/kvfuse-llamacpp.json"
    stop_server
  fi
  [[ ${LLAMA_ARMS:-1} == 1 ]] || continue
  start_llama "$dir/llama-full.log"
  load "$port" llama-full --newline-parts --no-cache-prompt >"$dir/llama-full.json"
  stop_server
  start_llama "$dir/llama-reuse.log"
  load "$port" llama-reuse --newline-parts --compare "$dir/llama-full.json" >"$dir/llama-reuse.json"
  stop_server
done

"$venv/bin/python3" - "$out" "$runs" "$model" "$threads" "$chunk_context" "${KVFUSE_FLAGS:-}" <<'PY'
import json, os, statistics, sys
out, runs, model, threads, chunk_context = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
kvfuse_flags = sys.argv[6]
arms = ("kvfuse-full", "kvfuse", "kvfuse-llamacpp-full", "kvfuse-llamacpp", "llama-full", "llama-reuse")
arms = tuple(a for a in arms if os.path.exists(f"{out}/run-1/{a}.json"))
rs = [{a: json.load(open(f"{out}/run-{i}/{a}.json")) for a in arms} for i in range(1, runs + 1)]
med = lambda f: statistics.median(f(r) for r in rs)
summary = {"runs": runs, "model": model, "threads": threads, "chunk_context": chunk_context,
           **({"kvfuse_flags": kvfuse_flags} if kvfuse_flags else {}),
           "requests": rs[0]["kvfuse"]["requests"], "concurrency": rs[0]["kvfuse"]["concurrency"],
           "passages": rs[0]["kvfuse"]["passages"], "pool": rs[0]["kvfuse"]["pool"],
           "passage_words": rs[0]["kvfuse"]["passage_words"],
           "first_question": rs[0]["kvfuse"].get("first_question", 0),
           "max_tokens": rs[0]["kvfuse"]["max_tokens"]}
for a in arms:
    summary[a] = {"ttft_p50_ms": med(lambda r: r[a]["ttft_ms"]["p50"]),
                  "ttft_p99_ms": med(lambda r: r[a]["ttft_ms"]["p99"]),
                  "output_tok_s": med(lambda r: r[a]["output_tok_s"])}
    if "agreement" in rs[0][a]:
        summary[a]["exact_match"] = med(lambda r: r[a]["agreement"]["exact_match"])
        summary[a]["rouge_l"] = med(lambda r: r[a]["agreement"]["rouge_l"])
# Ratios within each run (the same machine state), then their median.
if "llama-reuse" in arms:
    summary["ttft_p50_kvfuse_over_llama"] = med(
        lambda r: r["kvfuse"]["ttft_ms"]["p50"] / r["llama-reuse"]["ttft_ms"]["p50"])
    summary["throughput_kvfuse_over_llama"] = med(
        lambda r: r["kvfuse"]["output_tok_s"] / r["llama-reuse"]["output_tok_s"])
summary["ttft_p50_kvfuse_over_kvfuse_full"] = med(
    lambda r: r["kvfuse"]["ttft_ms"]["p50"] / r["kvfuse-full"]["ttft_ms"]["p50"])
if "kvfuse-llamacpp" in arms and "llama-reuse" in arms:
    summary["ttft_p50_kvfuse_llamacpp_over_llama"] = med(
        lambda r: r["kvfuse-llamacpp"]["ttft_ms"]["p50"] / r["llama-reuse"]["ttft_ms"]["p50"])
    summary["throughput_kvfuse_llamacpp_over_llama"] = med(
        lambda r: r["kvfuse-llamacpp"]["output_tok_s"] / r["llama-reuse"]["output_tok_s"])
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary))
PY
