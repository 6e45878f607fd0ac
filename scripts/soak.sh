#!/usr/bin/env bash
# Soak under random faults (docs/reliability.md): kvfuse-bench-soak on a redis-server this script starts on a free
# loopback port (no persistence) and stops at exit; the bench SIGKILLs / SIGSTOPs that server and restarts it on the
# same port (its restarts are its own children; this script shuts down whatever serves the port at exit).
# Builds nothing.
#   scripts/soak.sh [BIN] [-- bench flags...]     e.g. scripts/soak.sh -- --seconds 600 --json build/soak.json
#   BIN: the kvfuse-bench-soak binary (default build/bench/bench/kvfuse-bench-soak, the bench preset; also $KVFUSE_BENCH_SOAK)
# Exit status: the bench's (0 pass, 1 a failed request / wrong-KV use / byte lost, 2 setup error); a crash of the
# bench (killed by a signal) is reported as such.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin=${KVFUSE_BENCH_SOAK:-build/bench/bench/kvfuse-bench-soak}
if [ $# -gt 0 ] && [ "$1" != "--" ]; then bin=$1; shift; fi
[ "${1:-}" = "--" ] && shift
[ -x "$bin" ] || { echo "soak.sh: no executable $bin (cmake --preset bench && cmake --build --preset bench --target kvfuse-bench-soak)" >&2; exit 2; }
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
  { echo "soak.sh: redis-server and redis-cli must be on PATH" >&2; exit 2; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvfuse-soak-redis.XXXXXX")
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
pid=$!
disown "$pid"  # no "Killed" job notice when the bench SIGKILLs it
cleanup() {
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true  # whichever server holds the port now
  kill -CONT "$pid" 2>/dev/null || true
  kill "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do
  redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
redis-cli -p "$port" ping 2>/dev/null | grep -q PONG || { echo "soak.sh: redis-server did not start:" >&2; cat "$dir/redis.log" >&2; exit 2; }

echo "soak.sh: redis-server pid $pid on 127.0.0.1:$port; $bin $*"
set +e
"$bin" --redis "redis://127.0.0.1:$port" --redis-pid "$pid" "$@"
rc=$?
set -e
if [ $rc -gt 128 ]; then
  echo "soak.sh: CRASH: kvfuse-bench-soak died of signal $((rc - 128))" >&2
fi
exit $rc
