#!/usr/bin/env bash
# FerryConnector's tests with the real vLLM package (client/python/tests/vllm): two real
# vLLM schedulers drive the connector, whose workers move host-memory KV caches through
# two real ferryd agents. vLLM comes from tools/vllm_venv.sh's cached venv (made on first
# use); the ferry package is reinstalled into it, with its [vllm] extra, on every run.
# Extra arguments go to Bazel.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash tools/vllm_venv.sh)
bazel build "$@" //agent/main:ferryd 2>&1 | tail -n 1
nice -n 10 "$venv/bin/python" -m pip install -q './client/python[vllm]'
FERRYD="$PWD/bazel-bin/agent/main/ferryd" HF_HUB_OFFLINE=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning client/python/tests/vllm
