#!/usr/bin/env bash
# The main job: ferry on this machine, end to end, with the default embedded setup.
# Installs what it needs, builds, starts ferryd, starts two pod processes that register
# host memory, moves data between them (several sizes, checksummed by the receiver),
# prints a table and the metrics URL, and stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

echo "== building (the first build takes a few minutes) =="
bazel build -c opt //agent/main:ferryd //tools/demo:demo_pod 2>&1 | tail -n 2
bin=bazel-bin

work=$(mktemp -d /tmp/ferry-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

wait_for() {  # wait_for FILE SECONDS
  for _ in $(seq 1 $(( $2 * 20 ))); do [ -e "$1" ] && return 0; sleep 0.05; done
  echo "demo: timed out waiting for $1" >&2; return 1
}

echo "== starting ferryd =="
"$bin/agent/main/ferryd" --socket="$work/ferry.sock" --metrics_address=127.0.0.1:0 \
  --ready_file="$work/agent.ready" 2>"$work/ferryd.log" &
pids+=($!)
wait_for "$work/agent.ready" 20
metrics_port=$(sed -n 's/^metrics_port=//p' "$work/agent.ready")
echo "ferryd pid ${pids[0]} on unix:$work/ferry.sock"

echo "== two pods: the receiver registers 64 MiB, the sender writes into it =="
"$bin/tools/demo/demo_pod" receive --socket="$work/ferry.sock" --dir="$work" --size=$((64 << 20)) \
  2>"$work/receiver.log" &
pids+=($!)
wait_for "$work/descriptor" 20
"$bin/tools/demo/demo_pod" send --socket="$work/ferry.sock" --dir="$work" \
  --sizes=4096,65536,1048576,16777216,67108864 --iters=5

echo
echo "metrics: http://127.0.0.1:$metrics_port/metrics"
command -v curl >/dev/null && curl -s "http://127.0.0.1:$metrics_port/metrics" 2>/dev/null | grep -E '^ferry_(transfers_total|transfer_bytes_total|sessions|regions)' || true
echo "demo: done"
