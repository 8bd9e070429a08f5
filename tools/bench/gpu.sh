#!/usr/bin/env bash
# `tools/bench.sh gpu [--bundle=DIR] [--cross_agent_only] [--hmem_libfabric=DIR]`: GPU
# benchmarks on a GPU host with one GPU or more. Without --bundle it builds one
# (tests/gpu/bundle.sh); on a host without Bazel, make the bundle elsewhere and pass it.
#
# Prints, in one run: the gather/scatter kernel alone vs a raw contiguous copy
# (tools/bench/copy_kernel_bench); ferry contiguous writes vs raw cuMemcpyAsync (and
# again with the queue's client polling its completions, and sleeping with 32 writes in
# flight rather than 16); ferry paged KV blocks vs the
# raw contiguous copy of the same bytes; with two GPUs, NCCL (PyTorch) moving the same
# blocks three ways (tools/bench/nccl_blocks.py); then the cross-agent path: GPU memory
# through host staging over tcp;ofi_rxm, against the PCIe hop and the raw transport
# (tools/bench/fi_write_bench). Node-local rows run GPU0 -> GPU1 on a host with two GPUs
# or more, else GPU0 -> GPU0 (two allocations on one GPU, as pods sharing it).
# --cross_agent_only skips the node-local part.
# --hmem_libfabric=DIR (a libfabric with CUDA, e.g. built by tests/gpu/hmem.sh) adds the
# same cross-agent rows with FI_HMEM over shm, staged and direct, from that library.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle="" cross_only=0 hmem_lf=""
for a in "$@"; do
  case $a in
    --bundle=*) bundle=${a#--bundle=} ;;
    --cross_agent_only) cross_only=1 ;;
    --hmem_libfabric=*) hmem_lf=$(realpath "${a#--hmem_libfabric=}") ;;
  esac
done
if [ -z "$bundle" ]; then
  bundle=.gpu-bundle
  bash tests/gpu/bundle.sh "$bundle"
fi
bundle=$(realpath "$bundle")
source tools/lib.sh

gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
dst_device=$(( gpus > 1 ? 1 : 0 ))
echo "# ferry GPU benchmark  $(date -u +%Y-%m-%dT%H:%MZ)  $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | xargs)"
if [ $cross_only = 0 ]; then
  LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/copy_kernel_bench" --device=0
  LD_LIBRARY_PATH="$bundle/lib" start_bg "$bundle/bin/ferryd" --socket="$work/a.sock" --metrics_address=127.0.0.1:0 \
    --ready_file="$work/a.ready" --log_level=warning 2>"$work/a.log"
  wait_for "$work/a.ready" 30
  LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/gpu_bench" --socket="$work/a.sock" --src_device=0 --dst_device=$dst_device ||
    { cat "$work/a.log" >&2; exit 1; }
  # The contiguous rows again with the queue's client polling its completions 50 us before
  # it sleeps (a pod with a core for them, as a CUDA stream synchronisation spends one).
  LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/gpu_bench" --socket="$work/a.sock" --src_device=0 --dst_device=$dst_device \
    --contiguous_only --reap_spin_us=50 | grep -v '^# ferry' || { cat "$work/a.log" >&2; exit 1; }
  # And with a client that sleeps but keeps 32 writes in flight: a pod that sleeps wakes
  # once per burst it waits for, and a deeper queue keeps the GPU busy meanwhile.
  LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/gpu_bench" --socket="$work/a.sock" --src_device=0 --dst_device=$dst_device \
    --contiguous_only --queue_window=32 | grep -v '^# ferry' || { cat "$work/a.log" >&2; exit 1; }
  if [ "$gpus" -gt 1 ]; then
    # The same paged writes with the kernel on the destination GPU (remote reads).
    LD_LIBRARY_PATH="$bundle/lib" start_bg "$bundle/bin/ferryd" --socket="$work/b.sock" --metrics_address=127.0.0.1:0 \
      --ready_file="$work/b.ready" --log_level=warning --gpu_kernel_pull 2>"$work/b.log"
    wait_for "$work/b.ready" 30
    echo "# with --gpu_kernel_pull"
    LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/gpu_bench" --socket="$work/b.sock" --paged_only | grep -v '^# ferry\|^# paged' ||
      { cat "$work/b.log" >&2; exit 1; }
    python3 tools/bench/nccl_blocks.py
  else
    echo "# one GPU: no --gpu_kernel_pull rows (the kernel's GPU is both sides) and no NCCL rows (NCCL needs two GPUs)"
  fi
fi

# cross_agent_rows NAME LIBRARY_PATH ADDR_A ADDR_B LABEL [ferryd flags]: two agents with
# the fabric on ADDR_A and ADDR_B, then gpu_bench's cross-agent rows between them.
cross_agent_rows() {
  local name=$1 lib=$2 a=$3 b=$4 label=$5 n addr
  shift 5
  for n in a b; do
    addr=$a; [ $n = b ] && addr=$b
    LD_LIBRARY_PATH="$lib" start_bg "$bundle/bin/ferryd" --socket="$work/$name$n.sock" --metrics_address=127.0.0.1:0 \
      --peer_address=$addr:0 --fabric_iface=$addr --ready_file="$work/$name$n.ready" --log_level=warning "$@" \
      2>"$work/$name$n.log"
  done
  { wait_for "$work/${name}a.ready" 30 && wait_for "$work/${name}b.ready" 30 &&
    LD_LIBRARY_PATH="$lib" "$bundle/bin/gpu_bench" --socket="$work/${name}a.sock" --dst_socket="$work/${name}b.sock" \
      --src_device=0 --dst_device=$dst_device --transport="$label"; } || { cat "$work/${name}a.log" "$work/${name}b.log" >&2; exit 1; }
}

# Staged cross-agent path over tcp;ofi_rxm, and the transport's own ceiling: raw fi_write
# between the same addresses (tools/bench/fi_write_bench).
cross_agent_rows tcp "$bundle/lib" 127.0.0.1 127.0.0.2 "staged over tcp;ofi_rxm (127.0.0.1 -> 127.0.0.2)" \
  --fabric_provider='tcp;ofi_rxm' --fabric_spin_us=1000000
mkdir -p "$work/raw"
LD_LIBRARY_PATH="$bundle/lib" start_bg "$bundle/bin/fi_write_bench" target --iface=127.0.0.2 --dir="$work/raw" --size=$((256 << 20))
echo "# transport: raw fi_write 127.0.0.1 -> 127.0.0.2, tcp;ofi_rxm, window 16 (size count time_us algbw_GBps)"
LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/fi_write_bench" initiator --iface=127.0.0.1 --dir="$work/raw" \
  --sizes=4194304,16777216,67108864,268435456 --count=32 --window=16 --lat_iters=0
touch "$work/raw/stop"

# FI_HMEM: the same cross-agent rows over shm from a libfabric with CUDA, once with GPU
# memory staged (--fabric_hmem=false) and once registered with the provider and written
# directly, on the same transport.
if [ -n "$hmem_lf" ]; then
  # Fresh addresses per mode: shm names its endpoints after them.
  cross_agent_rows staged "$hmem_lf/lib:$bundle/lib" 127.0.0.3 127.0.0.4 \
    "shm (the CUDA libfabric in $hmem_lf), GPU memory staged" --fabric_provider=shm --fabric_hmem=false
  cross_agent_rows direct "$hmem_lf/lib:$bundle/lib" 127.0.0.5 127.0.0.6 \
    "shm (the CUDA libfabric in $hmem_lf), GPU memory direct" --fabric_provider=shm --fabric_hmem=true
fi
