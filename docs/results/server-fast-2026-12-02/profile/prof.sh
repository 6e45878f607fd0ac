#!/bin/bash
# perf profile of kvfuse-server ($1) on the calibration requests (questions 50-53), Cache-Craft α = 1.5 with coverage; out $2
set -e
cd /work/main
model=/root/.cache/kvfuse/SmolLM2-135M-Instruct.Q4_1.gguf
port=$((18600 + RANDOM % 1000))
$1 --model $model --host 127.0.0.1 --port $port --threads 2 --max-running 8 --store memory --chunk-context system >/tmp/prof/$2.server.log 2>&1 &
pid=$!
until curl -sf http://127.0.0.1:$port/health >/dev/null; do sleep 0.3; done
perf record -F 499 -g -p $pid -o /tmp/prof/$2.data 2>/tmp/prof/$2.perf.err &
ppid=$!
build/bench-venv/bin/python3 scripts/server_loadgen.py --url http://127.0.0.1:$port/v1 --data ../shared/data/musique_dev.json --requests 64 --concurrency 8 --passages 5 --pool 40 --max-tokens 32 --passage-words 100 --first-question 50 --label kvfuse --method cachecraft@1.5-cover > /tmp/prof/$2.json
kill -INT $ppid; wait $ppid || true
kill $pid; wait $pid || true
perf report -i /tmp/prof/$2.data --no-children --sort symbol 2>/dev/null | grep -E '^ +[0-9]+\.[0-9]+%' | head -30 | sed -E 's/ +-? +-? *$//' | cut -c1-230 > /tmp/prof/$2.txt
