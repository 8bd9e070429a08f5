#!/usr/bin/env bash
# The Python client's tests (client/python/tests) against live ferryd processes: builds
# ferryd (extra arguments go to Bazel, e.g. --config=asan), installs the package into
# .venv with pip (stubs generated from proto/ at build time), runs pytest. In the plain
# configuration (no arguments) also test_native_rpc.py, and test_client.py again with
# every client's unary calls through libferry_rpc (client/native): a library loaded
# into Python is not built with a sanitizer. First, in the plain configuration, ruff's
# lint of the package and its tests and mypy --strict over the package's types (the rules
# of both in client/python/pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(//agent/main:ferryd)
[ $# -gt 0 ] || targets+=(//client/native:libferry_rpc.so)
bazel build "$@" "${targets[@]}" 2>&1 | tail -n 1
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade ./client/python pytest
if [ $# -eq 0 ]; then
  .venv/bin/pip install -q ruff==0.8.4 mypy==1.13.0
  (cd client/python && ../../.venv/bin/ruff check --quiet .) || { echo "ruff: the findings above (client/python/pyproject.toml)"; exit 1; }
  (cd client/python && ../../.venv/bin/mypy --no-error-summary) || { echo "mypy: the findings above (client/python/pyproject.toml)"; exit 1; }
fi
# --test_env=NAME=VALUE arguments (tools/test.sh --config=tsan) reach ferryd as they
# reach Bazel's tests.
test_env=()
for arg in "$@"; do
  case $arg in
    --test_env=*=*) test_env+=("${arg#--test_env=}") ;;
    # Tests that measure the agent's memory or fds skip those checks under a sanitizer.
    --config=*san) test_env+=("FERRY_TEST_SANITIZER=${arg#--config=}") ;;
  esac
done
# test_native_rpc.py loads libferry_rpc into pytest's own process, which under
# --config=tsan has TSan's Abseil on LD_LIBRARY_PATH (meant for ferryd) and could not
# load it: it runs in the plain configuration (tests/integration/client covers the library under
# every sanitizer).
ignore=(--ignore=client/python/tests/vllm)
if [ $# -eq 0 ]; then
  export FERRY_TEST_RPC_LIB=$PWD/bazel-bin/client/native/libferry_rpc.so
else
  ignore+=(--ignore=client/python/tests/test_native_rpc.py)
fi
env "${test_env[@]}" FERRYD="$PWD/bazel-bin/agent/main/ferryd" .venv/bin/python -m pytest -q -p no:cacheprovider "${ignore[@]}" client/python/tests
if [ $# -eq 0 ]; then
  FERRY_RPC_LIB=$FERRY_TEST_RPC_LIB FERRYD="$PWD/bazel-bin/agent/main/ferryd" \
    .venv/bin/python -m pytest -q -p no:cacheprovider client/python/tests/test_client.py
fi
