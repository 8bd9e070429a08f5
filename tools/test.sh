#!/usr/bin/env bash
# Runs the tests, in tiers:
#   tools/test.sh unit [BAZEL_ARGS...]         Bazel's unit tests: one component each, no agent
#                                              process (~2 minutes after the build)
#   tools/test.sh integration [BAZEL_ARGS...]  the Bazel tests tagged "integration" (real agents as
#                                              processes, network namespaces, Prometheus), with the
#                                              Python client's suite (//client/python:pytest; plain
#                                              and --config=asan) and, without BAZEL_ARGS, the
#                                              deployment checks (//deploy:k8s_check)
#   tools/test.sh [full] [BAZEL_ARGS...]       both; and, without BAZEL_ARGS, once per CI run: the vLLM
#                                              connector's tests (//client/python:vllm_test), a short
#                                              scale run (//tools/scale:scale_short), the agent's image
#                                              run as the chart runs it (//deploy:container_test),
#                                              clang's thread-safety analysis and the formatting of the
#                                              whole tree (//tools:check_thread_safety, :check_format),
#                                              and the demo as a newcomer runs it (tests/demo). CI runs
#                                              full, and full --config=asan ...
# BAZEL_ARGS are sanitizer configs and the like, e.g. `tools/test.sh unit --config=asan`.
# Prints the logs of failing tests and ends with the line "N passed, N failed" (a suite
# that could only skip on this machine, the GPU suite without a GPU, is counted apart).
set -uo pipefail
cd "$(dirname "$0")/.."
tier=full
case ${1:-} in unit | integration | full) tier=$1; shift ;; esac
bash tools/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

# --config=tsan: the tests (not Bazel itself) load an Abseil built with TSan in place of
# Debian's (tools/tsan/build_abseil.sh); TSan reads tools/tsan/suppressions.txt.
for arg in "$@"; do
  if [ "$arg" = "--config=tsan" ]; then
    bash tools/tsan/build_abseil.sh || { echo "0 passed, 1 failed"; exit 1; }
    set -- "$@" "--test_env=LD_LIBRARY_PATH=$PWD/tools/tsan/abseil/lib" \
      "--test_env=TSAN_OPTIONS=suppressions=$PWD/tools/tsan/suppressions.txt:second_deadlock_stack=1"
  fi
done

log=$(mktemp /tmp/ferry-test.XXXXXX)
trap 'rm -f "$log"' EXIT
filter=()
[ "$tier" = unit ] && filter=(--test_tag_filters=-integration)
[ "$tier" = integration ] && filter=(--test_tag_filters=integration)
# The suites tagged "manual" (tools/bazel/checkout_test.bzl says why): Bazel tests whose
# scripts use what the checkout has beside Bazel's graph (its tree, a venv, helm, podman).
# The Python suite runs plain and under ASan; under UBSan and TSan only the C++ suites run
# (CI's hour: ~6 minutes each; the C++ integration suites drive the same agent paths under
# every sanitizer). The deployment checks have no C++ of ours: not again under a sanitizer.
extra=()
if [ "$tier" != unit ]; then
  case " $* " in
    *" --config=ubsan "* | *" --config=tsan "*) ;;
    *) extra+=(//client/python:pytest) ;;
  esac
  [ "$#" -gt 0 ] || extra+=(//deploy:k8s_check)
fi
# Once per CI run, only without a sanitizer config: the connector with the real vLLM (its
# venv cached under ~/.cache/ferry, ~6 minutes once per machine), 16 agents in network
# namespaces for a minute, the image run as each profile's rendered pod, and the checks
# over the whole tree: clang's thread-safety analysis of the lock annotations GCC ignores
# and the formatting (.clang-format).
if [ "$tier" = full ] && [ "$#" -eq 0 ]; then
  extra+=(//client/python:vllm_test //tools/scale:scale_short //deploy:container_test)
  extra+=(//tools:check_thread_safety //tools:check_format)
fi
bazel test //... "${extra[@]}" --test_summary=short "${filter[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$log")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed, or Bazel stopped before testing
fi

# The GPU suite passes without asserting anything where there is no GPU: say so.
skipped=0
if grep -qE '^//tests/gpu:gpu_test +(\(cached\) )?PASSED' "$log" &&
   grep -q "^SKIPPED .*(needs a GPU)" bazel-testlogs/tests/gpu/gpu_test/test.log 2>/dev/null; then
  passed=$((passed - 1))
  skipped=1
fi

# The README's main job, tools/demo.sh, run as a newcomer runs it, once per CI run: not a
# Bazel test, because the demo builds its own -c opt binaries with Bazel as a newcomer's
# run does (tests/demo/demo_test.sh checks its exit status, checksums, table rows and
# clean-up). Counted like a target.
if [ "$tier" = full ] && [ "$#" -eq 0 ]; then
  echo "== tests/demo/demo_test.sh =="
  if bash tests/demo/demo_test.sh 2>&1 | tee -a "$log"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    rc=1
    echo "tests/demo/demo_test.sh FAILED" | tee -a "$log"
  fi
fi

if [ "$failed" -ne 0 ]; then
  echo
  echo "== failing tests =="
  grep -E '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$log"
  for t in $(grep -oE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT)' "$log" | awk '{print $1}'); do
    path=${t#//}; path=${path/://}
    f="bazel-testlogs/$path/test.log"
    if [ -f "$f" ]; then
      echo "---- $t (last 60 lines of $f) ----"
      tail -n 60 "$f"
    fi
  done
fi
[ "$skipped" -eq 0 ] || echo "$skipped skipped (//tests/gpu:gpu_test: no GPU here; tests/gpu/run.sh runs it on a GPU host)"
echo "$passed passed, $failed failed"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
