#!/usr/bin/env bash
# Runs every test: `bazel test //...`, then the Python client's pytest suite
# (tools/pytest.sh) against the same ferryd build, then the deployment checks
# (tools/deploy_check.sh: helm lint, manifests validated against the Kubernetes API), then,
# without extra arguments, clang's thread-safety analysis, the formatting check, the agent's
# image run as the chart runs it (tools/container_test.sh), vLLM's connector tests
# (tools/vllm_test.sh) and the demo. Extra arguments go to Bazel, e.g.
#   tools/test.sh --config=asan
# Prints the logs of failing tests and ends with the line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
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
bazel test //... --test_summary=short "$@" 2>&1 | tee "$log"
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

# The Python client's pytest suite.
extra_target //client/python:pytest bash tools/pytest.sh "$@"
# The deployment checks (helm lint, manifests validated against the Kubernetes API types,
# invariants between chart, agent and examples).
extra_target //deploy:k8s_check bash tools/deploy_check.sh
# Once per CI run, only without a sanitizer config: clang's thread-safety analysis of
# the lock annotations GCC ignores, the formatting of the C++ tree (.clang-format), the
# vLLM connector, a short scale-and-churn run, and the README's main job, tools/demo.sh,
# run as a newcomer runs it (tests/demo/demo_test.sh checks its exit status, checksums,
# table rows and clean-up; the demo builds its own -c opt binaries).
if [ "$#" -eq 0 ]; then
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
echo "$passed passed, $failed failed"
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
