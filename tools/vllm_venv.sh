#!/usr/bin/env bash
# Prints the path of a Python venv with vLLM (and PyTorch), made once per machine under
# nice in a cache outside the repository ($FERRY_CACHE, default ~/.cache/ferry): ~4 GB
# of wheels, a ~9 GB venv, ~6 minutes on 2 cores. Used by tools/vllm_test.sh and
# tools/bench.sh kv.
set -euo pipefail
# The release CI tests; the connector supports 0.26 ... 0.33 (VLLM_VERSION=0.26.0 for another).
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
venv=${FERRY_CACHE:-$HOME/.cache/ferry}/vllm-$VLLM_VERSION
mkdir -p "$(dirname "$venv")"
# One installer at a time: a second caller (a test run beside CI's) waits for the first
# to finish rather than deleting the venv under it.
exec 9>"$venv.lock"
flock 9
if [ ! -f "$venv/.complete" ] || [ ! -x "$venv/bin/python" ]; then
  echo "vllm_venv: installing vLLM $VLLM_VERSION into $venv (once per machine, ~6 minutes)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  nice -n 19 "$venv/bin/python" -m pip install -q "vllm==$VLLM_VERSION" pytest >&2
  touch "$venv/.complete"
fi
exec 9>&-
echo "$venv"
