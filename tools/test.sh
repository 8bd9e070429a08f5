#!/usr/bin/env bash
# Runs the tests, in tiers:
#   tools/test.sh unit [BAZEL_ARGS...]         Bazel's unit tests: one component each, no agent
#                                              process (~2 minutes after the build)
#   tools/test.sh integration [BAZEL_ARGS...]  the Bazel tests tagged "integration" (real agents as
#                                              processes, network namespaces, Prometheus), the Python
#                                              client's pytest suite (tools/pytest.sh; plain and
#                                              --config=asan) and, without BAZEL_ARGS, the
#                                              deployment checks (tools/deploy_check.sh)
#   tools/test.sh [full] [BAZEL_ARGS...]       both; and, without BAZEL_ARGS, once per CI run: clang's
#                                              thread-safety analysis, the formatting check, the agent's
#                                              image run as the chart runs it (tools/container_test.sh),
#                                              vLLM's connector tests (tools/vllm_test.sh), a short scale
#                                              run and the demo. CI runs full, and full --config=asan ...
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
bazel test //... --test_summary=short "${filter[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE)' "$log")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed, or Bazel stopped before testing
fi

# extra_target NAME COMMAND...: runs COMMAND as one more target, counted like Bazel's.
extra_target() {
  echo "== $1 =="
  if "${@:2}" 2>&1 | tee -a "$log"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    rc=1
    echo "$1 FAILED" | tee -a "$log"
  fi
}

# The GPU suite passes without asserting anything where there is no GPU: say so.
skipped=0
if grep -qE '^//tests/gpu:gpu_test +(\(cached\) )?PASSED' "$log" &&
   grep -q "^SKIPPED .*(needs a GPU)" bazel-testlogs/tests/gpu/gpu_test/test.log 2>/dev/null; then
  passed=$((passed - 1))
  skipped=1
fi

if [ "$tier" != unit ]; then
  # The Python client's pytest suite, against a ferryd built as Bazel's tests are: plain
  # and under ASan; under UBSan and TSan only the C++ suites run (CI's hour: ~6 minutes
  # each; the C++ integration suites drive the same agent paths under every sanitizer).
  case " $* " in
    *" --config=ubsan "* | *" --config=tsan "*) ;;
    *) extra_target //client/python:pytest bash tools/pytest.sh "$@" ;;
  esac
  # The deployment checks (helm lint, manifests validated against the Kubernetes API types,
  # invariants between chart, agent and examples): no C++ of ours, so not again under a
  # sanitizer.
  [ "$#" -gt 0 ] || extra_target //deploy:k8s_check bash tools/deploy_check.sh
fi
# Once per CI run, only without a sanitizer config: clang's thread-safety analysis of
# the lock annotations GCC ignores, the formatting of the C++ tree (.clang-format), the
# vLLM connector, a short scale-and-churn run, and the README's main job, tools/demo.sh,
# run as a newcomer runs it (tests/demo/demo_test.sh checks its exit status, checksums,
# table rows and clean-up; the demo builds its own -c opt binaries).
if [ "$tier" = full ] && [ "$#" -eq 0 ]; then
  extra_target //tools:check_thread_safety bash tools/check_thread_safety.sh
  extra_target //tools:check_format bash tools/check_format.sh
  # The image (podman) run as the chart's rendered DaemonSet runs it, per profile.
  extra_target //deploy:container_test bash tools/container_test.sh
  # FerryConnector with the real vLLM (its cached venv is made on first use, ~6 minutes).
  extra_target //client/python:vllm_test bash tools/vllm_test.sh
  extra_target //tests/demo:demo_test bash tests/demo/demo_test.sh
  # Scale and churn, short: 16 agents in network namespaces for a minute.
  extra_target //tools:scale_short bash tools/scale.sh --agents=16 --minutes=1
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
