#!/usr/bin/env bash
# Runs the GPU suite on a GPU host from a bundle made by tests/gpu/bundle.sh.
#   tests/gpu/run.sh [bundle-dir] [catch2 args...]
# Findings (which handle kinds cross PID/IPC namespaces) go to $FERRY_FINDINGS if set.
set -uo pipefail
cd "$(dirname "$0")/../.."
b=$(realpath "${1:-.gpu-bundle}")
shift || true
export LD_LIBRARY_PATH="$b/lib" FERRY_BIN_DIR="$b/bin" PATH="$PATH:$b/bin"  # the host's ip first, if any
if ldd "$b/bin/ferryd" | grep 'not found'; then
  echo "run.sh: the bundle lacks libraries for this host" >&2
  exit 1
fi
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader || true
"$b/bin/gpu_test" --durations yes "$@"
rc=$?
# The Python KV handoff with CUDA tensors, when the Python client was packed for this
# host (tests/gpu/python_bundle.sh) and PyTorch is here.
if [ -d .gpu-python ] && python3 -c "import torch, grpc" 2>/dev/null; then
  PYTHONPATH="$PWD/.gpu-python" python3 tests/gpu/kv_handoff_gpu.py --bin="$b/bin" || rc=1
else
  echo "kv_handoff_gpu.py: skipped (no .gpu-python from tests/gpu/python_bundle.sh, or no torch/grpc)"
fi
exit $rc
