#!/usr/bin/env bash
# example.rag_eval_redis: kvfuse-rag-eval --store redis://HOST:PORT against a redis-server this script starts on
# loopback, on the real model: the same answers as with chunk caches in memory; a second run reads them back from
# Redis; and a run whose server is SIGKILLed after its first question still completes, with the same answers.
# Skips (exit 77) without redis-server, the model file or the dataset.
set -euo pipefail
bin=$1 data=$2
model=${KVFUSE_MODEL:-${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}/SmolLM2-135M-Instruct.Q4_1.gguf}
command -v redis-server >/dev/null || { echo "skipped: no redis-server on PATH (scripts/deps.sh installs it)"; exit 77; }
[[ -f $model ]] || { echo "skipped: no model file $model (scripts/fetch_model.sh)"; exit 77; }
[[ -f $data ]] || { echo "skipped: no dataset $data"; exit 77; }
out=$(mktemp -d)
server=""
cleanup() {
  [[ -n $server ]] && kill -9 "$server" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_server() {
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$out" >"$out/redis.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.05
  done
  echo "redis-server did not answer on port $port" >&2
  cat "$out/redis.log" >&2
  exit 1
}
start_server

args=(--model "$model" --data "$data" --limit 3 --max-passages 2 --max-passage-tokens 40 --max-new-tokens 4
      --methods naive,cacheblend,attnlink@4 --no-plot)
"$bin" "${args[@]}" --out "$out/memory" >/dev/null
"$bin" "${args[@]}" --out "$out/redis" --store "redis://127.0.0.1:$port" >/dev/null
keys=$(redis-cli -p "$port" dbsize)
((keys >= 3)) || { echo "Redis holds $keys keys after a run, expected the chunk caches" >&2; exit 1; }
"$bin" "${args[@]}" --out "$out/again" --store "redis://127.0.0.1:$port" >/dev/null

# The server goes away after the first question: the run completes by compute, with the same answers.
"$bin" "${args[@]}" --out "$out/killed" --store "redis://127.0.0.1:$port" >/dev/null 2>"$out/killed.log" &
run=$!
for _ in $(seq 600); do
  grep -q '^\[1/3\]' "$out/killed.log" && break
  sleep 0.1
done
grep -q '^\[1/3\]' "$out/killed.log" || { echo "the first question did not finish" >&2; cat "$out/killed.log" >&2; exit 1; }
kill -9 "$server"
wait "$server" 2>/dev/null || true
server=""
wait "$run" || { echo "kvfuse-rag-eval failed after the server was killed" >&2; cat "$out/killed.log" >&2; exit 1; }

python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {name: json.load(open(f"{out}/{name}/results.json")) for name in ["memory", "redis", "again", "killed"]}
def answers(r):
    return [{m: q["methods"][m]["answer"] for m in q["methods"]} for q in r["per_question"]]
for name in ["redis", "again", "killed"]:
    assert runs[name]["questions"] == 3, (name, runs[name]["questions"])
    assert answers(runs[name]) == answers(runs["memory"]), (name, answers(runs[name]), answers(runs["memory"]))
    assert runs[name]["redis"]["rejected_values"] == 0, (name, runs[name]["redis"])
assert runs["redis"]["redis"]["unavailable_reads"] == 0, runs["redis"]["redis"]
assert runs["again"]["chunk_caches_computed"] == 0, runs["again"]["chunk_caches_computed"]  # all read from Redis
assert runs["killed"]["redis"]["unavailable_reads"] > 0, runs["killed"]["redis"]
print("same answers with chunk caches in memory, in Redis, read back from Redis, and with Redis killed mid-run;",
      "unavailable reads after the kill:", runs["killed"]["redis"]["unavailable_reads"],
      "-", runs["killed"]["redis"]["last_error"])
PY
