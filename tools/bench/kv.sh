#!/usr/bin/env bash
# tools/bench.sh kv: one request's KV handoff through FerryConnector's worker core
# (tools/bench/kv_handoff.py), from the producer's hold (request_finished) to the
# consumer's finished_recving, for a Llama-3-8B-shaped cache (32 layers, 8 KV heads,
# head dim 128, bf16, 16-token blocks: 128 KiB a token) in host memory, between two
# agents over libfabric tcp;ofi_rxm on loopback (127.0.0.1 -> 127.0.0.2). The lower
# bound, in the same run: raw fi_write of as many bytes between the same addresses, as
# 32 KiB writes (one block's K or V of one layer: what any mover of these blocks posts)
# with 16 in flight, each from and to a distinct block of a buffer the request's size
# on each side, in random order (fi_write_bench --span: the bytes come from and land in
# memory, as a request's scattered blocks do, not from one block the CPUs keep cached).
# Rounds alternate ferry and raw; medians are reported. --concurrent=N hands off N
# requests of each size at once (raw: N times the writes), a throughput row.
# --write_windows=1 puts the consumer's caches in window mode, a window opened and closed
# around each request (FerryConnector's write_windows; default 0).
#   tools/bench.sh kv [--tokens=1024,4096,16384] [--rounds=3] [--concurrent=1] [--cpus_a=0 --cpus_b=1] [--write_windows=0]
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=1024,4096,16384 rounds=3 concurrent=1 cpu_a=0 cpu_b=1 windows=0
[ "$(nproc)" -gt 1 ] || cpu_b=0
for a in "$@"; do
  case $a in
    --tokens=*) tokens=${a#--tokens=} ;;
    --rounds=*) rounds=${a#--rounds=} ;;
    --concurrent=*) concurrent=${a#--concurrent=} ;;
    --cpus_a=*) cpu_a=${a#--cpus_a=} ;;
    --cpus_b=*) cpu_b=${a#--cpus_b=} ;;
    --write_windows=*) windows=${a#--write_windows=} ;;
    *) echo "kv: unknown argument $a" >&2; exit 2 ;;
  esac
done
bash tools/setup.sh
venv=$(bash tools/vllm_venv.sh)
bazel build -c opt //agent/main:ferryd //tools/bench:fi_write_bench 2>&1 | tail -n 1
"$venv/bin/python" -m pip install -q --no-deps ./client/python
ferryd=bazel-bin/agent/main/ferryd fi_write_bench=bazel-bin/tools/bench/fi_write_bench
source tools/lib.sh

echo "# ferry KV handoff benchmark  $(date -u +%Y-%m-%dT%H:%MZ)  $(nproc) CPUs, $(uname -r)"
echo "# Llama-3-8B-shaped KV (32 layers x [2, blocks, 16, 8, 128] bf16), host memory, tcp;ofi_rxm 127.0.0.1 -> 127.0.0.2"
echo "# producer side on CPUs $cpu_a, consumer side on CPUs $cpu_b; $rounds rounds, ferry and raw alternated; $concurrent request(s) at once; write windows $windows"
# The consumer's agent busy-polls its NIC while busy and 200 ms after, as the raw target
# spins on fi_cq_read (tcp moves incoming data only while the target progresses), as in
# tools/bench.sh cross-node.
for node in a b; do
  if [ $node = a ]; then addr=127.0.0.1; cpu=$cpu_a; spin=100; else addr=127.0.0.2; cpu=$cpu_b; spin=200000; fi
  start_bg taskset -c $cpu "$ferryd" --socket="$work/$node.sock" --metrics_address=127.0.0.1:0 \
    --peer_address=$addr:0 --fabric_iface=$addr --fabric_provider='tcp;ofi_rxm' --fabric_spin_us=$spin \
    --ready_file="$work/$node.ready" --log_level=warning 2>"$work/$node.log"
done
wait_for "$work/a.ready" 20; wait_for "$work/b.ready" 20
raw() {  # raw TOKENS
  local ops=$(( concurrent * $1 / 16 * 32 * 2 ))
  local span=$((ops * 32768))
  rm -rf "$work/raw" && mkdir -p "$work/raw"
  start_bg taskset -c $cpu_b "$fi_write_bench" target --iface=127.0.0.2 --dir="$work/raw" --size=$span
  local target=${pids[-1]}
  taskset -c $cpu_a "$fi_write_bench" initiator --iface=127.0.0.1 --dir="$work/raw" --window=16 --sizes=32768 \
    --count=$ops --row_bytes=$span --span=$span --lat_iters=0 | awk -v t="$1" 'NF == 4 && $1 ~ /^[0-9]+$/ {print t, $4}'
  touch "$work/raw/stop"
  wait "$target"
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="raw ferry"; else order="ferry raw"; fi
  for side in $order; do
    if [ $side = raw ]; then
      for t in ${tokens//,/ }; do raw "$t"; done >> "$work/raw.txt"
    else
      taskset -c $cpu_a "$venv/bin/python" tools/bench/kv_handoff.py --producer="$work/a.sock" \
        --consumer="$work/b.sock" --tokens="$tokens" --concurrent="$concurrent" --write_windows="$windows" \
        >> "$work/ferry.txt"
    fi
  done
done
python3 - "$work" <<'PY'
import statistics, sys
w = sys.argv[1]
ferry, raw = {}, {}
for line in open(f"{w}/ferry.txt"):
    t, nbytes, ms, gbps, submit = line.split()
    ferry.setdefault(int(t), []).append((int(nbytes), float(ms), float(gbps), float(submit)))
for line in open(f"{w}/raw.txt"):
    t, gbps = line.split()
    raw.setdefault(int(t), []).append(float(gbps))
med = statistics.median
print(f"\n{'tokens':>7} {'MiB':>6} {'handoff_ms':>11} {'GB/s':>7} {'raw_ms':>8} {'raw_GB/s':>9} {'ratio':>6} {'submit_ms':>10}")
for t in sorted(ferry):
    f, r = ferry[t], raw.get(t, [])
    ms, gbps = med(x[1] for x in f), med(x[2] for x in f)
    rgbps = med(r) if r else 0
    rms = f[0][0] / rgbps / 1e6 if rgbps else 0
    print(f"{t:>7} {f[0][0] >> 20:>6} {ms:>11.1f} {gbps:>7.3f} {rms:>8.1f} {rgbps:>9.3f} "
          f"{gbps / rgbps if rgbps else 0:>6.2f} {med(x[3] for x in f):>10.2f}")
PY
