#!/usr/bin/env bash
# Runs tools/demo.sh, the README's main job, and checks what a newcomer relies on: it
# exits 0 within its time, every row's checksum was verified by the receiving pod, a
# write-queue row with a raw fi_write rate and a ratio is there for every size, the RPC
# rows and the KV handoff row are there, it says how the nodes were made and whether GPU
# rows ran, and it leaves none of its processes or network namespaces behind.
# Usage: tests/demo/demo_test.sh   (tools/test.sh runs it; prints PASSED or FAILED)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp /tmp/ferry-demo-test.XXXXXX)
trap 'rm -f "$out"' EXIT
failures=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAILED: $1"; failures=$((failures + 1)); fi
}
# Everything the demo starts inherits this mark, so what it leaves behind is told apart
# from other processes on the machine (a benchmark beside CI uses the same temp names).
export FERRY_DEMO_TEST_RUN="$$.$RANDOM"
# Whether no process carries the mark (a process's environ is the one it was started
# with: this shell's has no mark, and the search runs without it).
left_behind() {
  local found
  found=$(env -u FERRY_DEMO_TEST_RUN grep -lsxz "FERRY_DEMO_TEST_RUN=$FERRY_DEMO_TEST_RUN" /proc/[0-9]*/environ)
  [ -z "$found" ] || echo "left running: $found"
  [ -z "$found" ]
}
# The build is tools/test.sh's (or cached); the demo itself must finish within a minute.
bazel build -c opt //agent/main:ferryd //tools/demo:demo_pod //tools/ferryctl //tools/bench:fi_write_bench \
  //tools/bench:gpu_bench 2>&1 | tail -n 1
start=$(date +%s)
timeout 300 bash tools/demo.sh >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
cat "$out"
echo "---- demo took ${took} s, exit status $rc"
sizes="4 KiB|32 KiB|64 KiB|1 MiB|16 MiB|64 MiB"
check "the demo exits 0" test "$rc" -eq 0
check "the demo finishes within a minute after the build (${took} s)" test "$took" -le 60
check "it says how the two nodes were made" grep -qE '^nodes: (two network namespaces|loopback addresses)' "$out"
check "a write-queue row with raw GB/s and a ratio for each of the 6 sizes" test "$(
  grep -cE "^write queue, 16 in flight +($sizes) +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9]+\.[0-9]{2} +[0-9.]+-[0-9.]+ +verified$" "$out")" -eq 6
check "a one-RPC row for each of the 6 sizes, verified" test "$(
  grep -cE "^one Write RPC at a time +($sizes) .* verified " "$out")" -eq 6
check "the KV handoff row, verified, with its handoff time and raw ratios" \
  grep -qE '^one Write of 4096 chunks with a notification, all layers in one region: +verified$' "$out"
check "the KV handoff's time and its raw bounds" grep -qE '^  128 MiB: [0-9.]+ ms from submit to the receiver notified.*' "$out"
check "no checksum mismatch or unreadable check" bash -c "! grep -qE 'MISMATCH|UNREADABLE' '$out'"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  check "GPU rows ran and were verified" grep -q '^== GPU rows' "$out"
else
  check "one line says GPU rows were skipped" test "$(grep -c '^GPU rows: skipped' "$out")" -eq 1
fi
check "no demo process left running" left_behind
# This run's namespaces, by the names its "nodes:" line gives (another demo may run beside it).
namespaces=$(sed -nE 's/^nodes: two network namespaces \((ferrydemo[0-9]+a), (ferrydemo[0-9]+b)\).*/\1 \2/p' "$out")
ours_left() {
  local ns
  for ns in $namespaces; do ip netns list 2>/dev/null | grep -qw "$ns" && { echo "left: $ns"; return 1; }; done
  return 0
}
check "no demo network namespace left" ours_left
if [ "$failures" -eq 0 ]; then echo "demo test: PASSED"; else echo "demo test: $failures check(s) FAILED"; fi
[ "$failures" -eq 0 ]
