#!/usr/bin/env bash
# tools/bench.sh kv --device[=BUNDLE]: KV handoffs through FerryConnector's worker core
# (tools/bench/kv_handoff.py, the consumer in a process of its own, both stepped every
# 0.1 ms) on a GPU host, in every placement the host has, each beside its raw bound from
# the same run:
#   same GPU        one agent, both caches on GPU0; raw: one contiguous copy on GPU0
#   GPU0 -> GPU1    one agent, the consumer's cache on GPU1 (two GPUs or more); raw: one
#                   contiguous peer copy GPU0 -> GPU1 (NVLink where the GPUs have it)
#   two agents      a second pair of agents with a fabric (tcp;ofi_rxm on 127.0.0.1 ->
#                   127.0.0.2), the producer's cache on GPU0, the consumer's on GPU1 (GPU0
#                   with one GPU): GPU memory staged through host buffers; raw: fi_write of
#                   as many bytes as 32 KiB writes from and into host memory (16 in flight)
# Single requests of 1k / 4k / 16k tokens, then 16 x 1k and 64 x 256 at once. Llama-3-8B
# shape (32 layers x [2, blocks, 16, 8, 128] bf16), PyTorch-allocator tensors (legacy IPC
# handles). Columns: tokens, bytes, time_ms, GBps, submit_ms (the producer answering the
# pull), raw_copy_ms. Rows are rounds (the first of each size is a warm-up, not printed).
# BUNDLE: tests/gpu/bundle.sh's folder (default .gpu-bundle, built if missing); the Python
# client from PYTHONPATH (tests/gpu/python_bundle.sh on a host without pip).
#
# With --busy, instead: handoffs beside a busy model. A third process runs bf16 matmuls
# back to back on the producer's GPU (or the consumer's); each size's p50 / p99 / max
# under each load, with the raw copy measured under the same load and the matmul rate
# alone and beside the handoffs. Once per way the agent can run its gather/scatter
# kernel: on the source GPU (the default), on the destination GPU (--gpu_kernel_pull),
# and on the source GPU with every process a client of CUDA MPS (where the host has
# nvidia-cuda-mps-control), so that kernels of different processes share the SMs.
# --write_windows=1: the consumer's caches in window mode, a window per request.
#   tools/bench.sh kv --device[=BUNDLE] [--rounds=R] [--busy] [--write_windows=0]
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=.gpu-bundle rounds=5 busy= windows=0
for a in "$@"; do
  case $a in
    --device) ;;
    --device=*) bundle=${a#--device=} ;;
    --rounds=*) rounds=${a#--rounds=} ;;
    --busy) busy=1 ;;
    --write_windows=*) windows=${a#--write_windows=} ;;
    *) echo "kv --device: unknown argument $a" >&2; exit 2 ;;
  esac
done
[ -x "$bundle/bin/ferryd" ] || bash tests/gpu/bundle.sh "$bundle"
bundle=$(realpath "$bundle")
source tools/lib.sh

gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
echo "# ferry KV handoff on GPUs  $(date -u +%Y-%m-%dT%H:%MZ)  $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | xargs)"

if [ -n "$busy" ]; then
  echo "# beside a busy model: 8192 x 8192 bf16 matmuls back to back in a third process; $rounds rounds per row"
  ways=("kernel on the source GPU:" "kernel on the destination GPU:--gpu_kernel_pull")
  if command -v nvidia-cuda-mps-control >/dev/null; then ways+=("kernel under MPS:"); else
    echo "# no nvidia-cuda-mps-control on this host: no MPS rows"; fi
  n=0
  for way in "${ways[@]}"; do
    name=${way%%:*} flags=${way#*:} n=$((n + 1))
    if [ "$name" = "kernel under MPS" ]; then
      export CUDA_MPS_PIPE_DIRECTORY=$work/mps CUDA_MPS_LOG_DIRECTORY=$work/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      nvidia-cuda-mps-control -d
    fi
    LD_LIBRARY_PATH="$bundle/lib" start_bg "$bundle/bin/ferryd" --socket="$work/busy$n.sock" \
      --metrics_address=127.0.0.1:0 --ready_file="$work/busy$n.ready" --log_level=warning $flags 2>"$work/busy$n.log"
    wait_for "$work/busy$n.ready" 30
    for consumer in $(seq 0 $((gpus > 1 ? 1 : 0))); do
      loads=idle,producer
      [ "$consumer" = 0 ] || loads+=,consumer
      echo "# $name, GPU0 -> GPU$consumer"
      python3 tools/bench/kv_handoff.py --write_windows="$windows" --producer="$work/busy$n.sock" --consumer="$work/busy$n.sock" \
        --tokens=1024,4096,16384 --rounds="$rounds" --device=cuda:0 --consumer_device=cuda:$consumer --two_processes \
        --step_ms=0.1 --loads=$loads || { echo "# $name: the handoffs failed (agent log below)"; tail -n 5 "$work/busy$n.log"; }
    done
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
    if [ "$name" = "kernel under MPS" ]; then
      echo quit | nvidia-cuda-mps-control
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  done
  exit 0
fi
echo "# Llama-3-8B-shaped KV (32 layers x [2, blocks, 16, 8, 128] bf16), PyTorch's allocator, one agent; $rounds rounds"
LD_LIBRARY_PATH="$bundle/lib" start_bg "$bundle/bin/ferryd" --socket="$work/a.sock" --metrics_address=127.0.0.1:0 \
  --ready_file="$work/a.ready" --log_level=warning 2>"$work/a.log"
wait_for "$work/a.ready" 30
placements=("same GPU:cuda:0")
[ "$gpus" -gt 1 ] && placements+=("GPU0 -> GPU1:cuda:1")
for p in "${placements[@]}"; do
  name=${p%%:cuda*} consumer=cuda:${p##*:cuda:}
  for shape in "1024,4096,16384 1" "1024 16" "256 64"; do
    set -- $shape
    echo "# $name, $2 request(s) at once"
    echo "# tokens bytes time_ms GBps submit_ms raw_copy_ms"
    python3 tools/bench/kv_handoff.py --write_windows="$windows" --producer="$work/a.sock" --consumer="$work/a.sock" --tokens="$1" \
      --concurrent="$2" --rounds="$rounds" --device=cuda:0 --consumer_device="$consumer" --two_processes \
      --step_ms=0.1 || { cat "$work/a.log" >&2; exit 1; }
  done
done
[ "$gpus" -gt 1 ] || echo "# one GPU: no GPU0 -> GPU1 rows"

for node in b c; do
  if [ $node = b ]; then addr=127.0.0.1; else addr=127.0.0.2; fi
  LD_LIBRARY_PATH="$bundle/lib" start_bg "$bundle/bin/ferryd" --socket="$work/$node.sock" --metrics_address=127.0.0.1:0 \
    --peer_address=$addr:0 --fabric_iface=$addr --fabric_provider='tcp;ofi_rxm' --ready_file="$work/$node.ready" \
    --log_level=warning 2>"$work/$node.log"
done
wait_for "$work/b.ready" 30; wait_for "$work/c.ready" 30
consumer=cuda:$((gpus > 1 ? 1 : 0))
echo "# two agents (staged, tcp;ofi_rxm on loopback), GPU0 -> $consumer, 1 request at once"
echo "# tokens bytes time_ms GBps submit_ms raw_copy_ms"
python3 tools/bench/kv_handoff.py --write_windows="$windows" --producer="$work/b.sock" --consumer="$work/c.sock" --tokens=1024,4096,16384 \
  --concurrent=1 --rounds="$rounds" --device=cuda:0 --consumer_device="$consumer" --two_processes --step_ms=0.1 ||
  { cat "$work/b.log" "$work/c.log" >&2; exit 1; }
echo "# raw fi_write of as many bytes, host memory, 32 KiB writes, 16 in flight: tokens ms GBps"
for t in 1024 4096 16384; do
  ops=$((t / 16 * 32 * 2)) span=$((t / 16 * 32 * 2 * 32768))
  rm -rf "$work/raw" && mkdir -p "$work/raw"
  LD_LIBRARY_PATH="$bundle/lib" start_bg "$bundle/bin/fi_write_bench" target --iface=127.0.0.2 --dir="$work/raw" \
    --size=$span
  target=${pids[-1]}
  LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/fi_write_bench" initiator --iface=127.0.0.1 --dir="$work/raw" \
    --window=16 --sizes=32768 --count=$ops --row_bytes=$span --span=$span --lat_iters=0 |
    awk -v t="$t" -v b="$span" 'NF == 4 && $1 ~ /^[0-9]+$/ {printf "%d %.3f %.3f\n", t, b / $4 / 1e6, $4}'
  touch "$work/raw/stop"
  wait "$target"
done
