#!/usr/bin/env bash
# FerryConnector's tests with the real vLLM package (client/python/tests/vllm): two real
# vLLM schedulers drive the connector, whose workers move host-memory KV caches through
# two real ferryd agents. vLLM comes from tools/vllm_venv.sh's cached venv (made on first
# use); the ferry package is reinstalled into it, with its [vllm] extra, on every run.
#   bazel test //client/python:vllm_test   as tools/test.sh runs it (ferryd as data: FERRYD)
#   tools/vllm_test.sh [BAZEL_ARGS]        by hand: builds ferryd first
set -euo pipefail
if [ -n "${FERRYD:-}" ]; then
  ferryd=$(realpath "$FERRYD")
  cd "$(dirname "$(readlink -f "$0")")/.."  # the checkout, from Bazel's runfiles
else
  cd "$(dirname "$0")/.."
  bazel build "$@" //agent/main:ferryd 2>&1 | tail -n 1
  ferryd=$PWD/bazel-bin/agent/main/ferryd
fi
venv=$(bash tools/vllm_venv.sh)
nice -n 10 "$venv/bin/python" -m pip install -q './client/python[vllm]'
FERRYD=$ferryd HF_HUB_OFFLINE=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning client/python/tests/vllm
