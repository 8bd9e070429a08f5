#!/usr/bin/env bash
# The Python client's tests (client/python/tests) against live ferryd processes: installs
# the package into .venv with pip (stubs generated from proto/ at build time) and runs
# pytest. First, in the plain configuration, ruff's lint of the package and its tests and
# mypy --strict over the package's types (the rules of both in client/python/pyproject.toml);
# there also test_native_rpc.py, and test_client.py again with every client's unary calls
# through libferry_rpc (client/native): a library loaded into Python is not built with a
# sanitizer.
#   bazel test //client/python:pytest [--config=asan]   as tools/test.sh runs it: Bazel
#        builds ferryd and libferry_rpc as the test's data (FERRYD, FERRY_TEST_RPC_LIB) and
#        the sanitizer config names itself (FERRY_TEST_SANITIZER, .bazelrc)
#   tools/pytest.sh [BAZEL_ARGS]   by hand: builds them first (e.g. --config=asan)
set -euo pipefail
sanitizer=${FERRY_TEST_SANITIZER:-}
if [ -n "${FERRYD:-}" ]; then
  ferryd=$(realpath "$FERRYD")
  rpc_lib=$(realpath "$FERRY_TEST_RPC_LIB")
  cd "$(dirname "$(readlink -f "$0")")/.."  # the checkout, from Bazel's runfiles
else
  cd "$(dirname "$0")/.."
  for arg in "$@"; do
    case $arg in
      --config=*san) sanitizer=${arg#--config=} ;;
      --test_env=*=*) export "${arg#--test_env=}" ;;  # reaches ferryd as it reaches Bazel's tests
    esac
  done
  bazel build "$@" //agent/main:ferryd //client/native:libferry_rpc.so 2>&1 | tail -n 1
  ferryd=$PWD/bazel-bin/agent/main/ferryd
  rpc_lib=$PWD/bazel-bin/client/native/libferry_rpc.so
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade ./client/python pytest
if [ -z "$sanitizer" ]; then
  .venv/bin/pip install -q ruff==0.8.4 mypy==1.13.0
  (cd client/python && ../../.venv/bin/ruff check --quiet .) || { echo "ruff: the findings above (client/python/pyproject.toml)"; exit 1; }
  (cd client/python && ../../.venv/bin/mypy --no-error-summary) || { echo "mypy: the findings above (client/python/pyproject.toml)"; exit 1; }
fi
# Tests that measure the agent's memory or fds skip those checks under a sanitizer.
export FERRY_TEST_SANITIZER=$sanitizer FERRYD=$ferryd
ignore=(--ignore=client/python/tests/vllm)
if [ -z "$sanitizer" ]; then
  export FERRY_TEST_RPC_LIB=$rpc_lib
else
  ignore+=(--ignore=client/python/tests/test_native_rpc.py)
fi
.venv/bin/python -m pytest -q -p no:cacheprovider "${ignore[@]}" client/python/tests
if [ -z "$sanitizer" ]; then
  FERRY_RPC_LIB=$rpc_lib .venv/bin/python -m pytest -q -p no:cacheprovider client/python/tests/test_client.py
fi
