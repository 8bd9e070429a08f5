#!/usr/bin/env bash
# Checks the lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...) that
# GCC ignores: every C++ file of the tree through clang's thread-safety analysis, as
# errors (-Werror=thread-safety), syntax only. Needs the generated protos.
#   bazel test //tools:check_thread_safety   as tools/test.sh runs it: the generated protos
#                                            are the test's data, in its runfiles
#   tools/check_thread_safety.sh             by hand: builds them first
# Ends PASSED or FAILED.
set -uo pipefail
if [ -n "${TEST_SRCDIR:-}" ]; then
  generated=$PWD
  cd "$(dirname "$(readlink -f "$0")")/.."  # the checkout, from Bazel's runfiles
else
  cd "$(dirname "$0")/.."
  bazel build //proto/... //tools/bench:echo_cc_proto 2>&1 | tail -n 1
  generated=bazel-bin
fi
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Werror=thread-safety -I. "-I$generated" -Itools/cuda/include
       $(pkg-config --cflags grpc++ protobuf libfabric prometheus-cpp-core))
log=$(mktemp /tmp/ferry-tsa.XXXXXX)
trap 'rm -f "$log"' EXIT
find agent client/cpp client/native proto tests tools -name '*.cc' -print0 | sort -z |
  xargs -0 -n 4 -P "$(nproc)" clang++-14 "${flags[@]}" >"$log" 2>&1
rc=$?
grep -E 'error|warning' "$log" | head -n 40
files=$(find agent client/cpp client/native proto tests tools -name '*.cc' | wc -l)
if [ "$rc" -eq 0 ]; then
  echo "thread-safety analysis: $files files clean"
  echo "thread-safety analysis: PASSED"
else
  echo "thread-safety analysis failed (clang exit $rc) in $files files"
  echo "thread-safety analysis: FAILED"
fi
[ "$rc" -eq 0 ]
