#!/usr/bin/env bash
# Runs the fuzz targets in tests/fuzz under libFuzzer (clang, with ASan and UBSan) for
# a bounded time each, starting from the seed corpus. New crashes are written to
# tests/fuzz/crashes/ and fail the run.
#   tools/fuzz.sh [--seconds=N]     (default 60 per target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
for a in "$@"; do case $a in --seconds=*) seconds=${a#--seconds=} ;; esac; done
bash tools/setup.sh
bazel build //proto/ferry/v1:ferry_cc_proto 2>&1 | tail -n 1
gen=$(bazel info bazel-bin 2>/dev/null)
out=$(mktemp -d /tmp/ferry-fuzz.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir -p tests/fuzz/crashes
libs=$(pkg-config --cflags --libs protobuf absl_status absl_statusor absl_strings absl_str_format absl_synchronization absl_time absl_flat_hash_map absl_hash absl_random_random)
cxx="clang++-14 -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. -I$gen"
# Each target: its sources (everything it links from agent/ and proto/).
declare -A srcs=(
  [chunk_plan]="agent/transfer/chunk_plan.cc $gen/proto/ferry/v1/ferry.pb.cc"
  [transfer_queue]="agent/queue/transfer_queue.cc proto/ferry/wire/ring_shape.cc agent/queue/shared_ring.cc agent/session/session.cc agent/common/token.cc agent/common/log.cc $gen/proto/ferry/v1/ferry.pb.cc"
)
failed=0
for t in chunk_plan transfer_queue; do
  echo "== fuzz $t (${seconds}s)"
  $cxx "tests/fuzz/${t}_fuzz.cc" ${srcs[$t]} $libs -o "$out/$t"
  mkdir -p "$out/corpus_$t"
  cp tests/fuzz/corpus/$t/* "$out/corpus_$t/"
  if ! "$out/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="tests/fuzz/crashes/${t}-" "$out/corpus_$t" 2>"$out/$t.log"; then
    failed=1
    tail -n 40 "$out/$t.log"
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/$t.log" | tr '\n' ' '
  echo "corpus: $(ls "$out/corpus_$t" | wc -l) inputs"
done
[ "$failed" -eq 0 ] && echo "fuzz: no crashes" || echo "fuzz: CRASHES (tests/fuzz/crashes)"
exit $failed
