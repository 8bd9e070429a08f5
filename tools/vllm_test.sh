#!/usr/bin/env bash
# FerryConnector's tests with the real vLLM package (client/python/tests/vllm): two real
# vLLM schedulers drive the connector, whose workers move host-memory KV caches through
# two real ferryd agents. vLLM (~4 GB of wheels, a ~9 GB venv, ~6 minutes on 2 cores) is
# installed once per machine, under nice, into a cached venv outside the repository:
#   $FERRY_CACHE/vllm-0.32.0       (FERRY_CACHE defaults to ~/.cache/ferry)
# The ferry package is reinstalled into it on every run, with its [vllm] extra.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0  # 0.33.0 needs a certifi release newer than the registry here has
venv=${FERRY_CACHE:-$HOME/.cache/ferry}/vllm-$VLLM_VERSION
if [ ! -f "$venv/.complete" ]; then
  echo "vllm_test: installing vLLM $VLLM_VERSION into $venv (once per machine, ~6 minutes)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  nice -n 19 "$venv/bin/python" -m pip install -q "vllm==$VLLM_VERSION" pytest
  touch "$venv/.complete"
fi
bazel build "$@" //agent/main:ferryd 2>&1 | tail -n 1
nice -n 10 "$venv/bin/python" -m pip install -q './client/python[vllm]'
FERRYD="$PWD/bazel-bin/agent/main/ferryd" HF_HUB_OFFLINE=1 \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning client/python/tests/vllm
