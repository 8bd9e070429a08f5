#!/usr/bin/env bash
# Benchmarks (not tests). Prints nccl-tests-style tables with a baseline from the same run.
#
#   tools/bench.sh cross-node [--count=N] [--rounds=R] [--row_mib=M] [--sizes=B,B..] [--cpus_a=LIST --cpus_b=LIST] [--bundle=DIR]
#                             [--ferryd_flags='...'] [--queue_flags='...']
#                                           ferry agent-to-agent vs raw libfabric fi_write
#                                           (extra flags for both agents / the queue runs of ferry_bench)
#   tools/bench.sh gpu [--bundle=DIR]       GPU paths vs cuMemcpyAsync (and NCCL with two GPUs) on a GPU host
#   tools/bench.sh control [--iters=N] [--cpus_a=LIST --cpus_b=LIST]
#                                           the local API's round trips vs a bare gRPC echo and raw fi_write
#   tools/bench.sh kv [--tokens=T,T..] [--rounds=R] [--cpus_a=LIST --cpus_b=LIST]
#                                           one request's KV handoff through FerryConnector vs raw fi_write
#   tools/bench.sh kv --device[=BUNDLE] [--rounds=R] [--busy]
#                                           the same on GPUs, same GPU and GPU0 -> GPU1, vs raw copies
#   tools/bench.sh qos [--seconds=T] [--ferryd_flags='...'] [--cpus_a=LIST --cpus_b=LIST]
#                                           tenants sharing a NIC: traffic classes vs first in first out, weights
#
# Pinning: initiator side (agent A, the bench client, the raw initiator) on --cpus_a,
# target side (agent B, the raw target) on --cpus_b (taskset lists; default CPU 0 and
# CPU 1, for 2-core machines). Both sides use libfabric tcp;ofi_rxm on loopback
# (127.0.0.1 -> 127.0.0.2) with FI_DELIVERY_COMPLETE. --bundle=DIR takes the binaries
# from tests/gpu/bundle.sh's folder instead of building them (a host without Bazel).
#
# Method for the write-queue rows (the goal's): R rounds; in each, every size runs once
# through raw fi_write and once through ferry, back to back, the order swapped every
# round (each run warms up untimed first). A row reports the median time over rounds and
# the median (and range) of the per-round ratios, so a slow minute of the machine hits
# both sides of a ratio. The RPC and paged rows run once, after the rounds. The queue's
# sender polls its completion ring (as the raw initiator polls its CQ) when --cpus_a has
# 2+ CPUs, and sleeps on the doorbell with one, where polling would take the agent's core.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true
count=20000 rounds=5 row_mib=1024 sizes=4096,65536,1048576,16777216,67108864 cpu_a=0 cpu_b=1 bundle="" ferryd_flags="" queue_flags=""
[ "$(nproc)" -gt 1 ] || cpu_b=0
for a in "$@"; do
  case $a in
    --count=*) count=${a#--count=} ;;
    --rounds=*) rounds=${a#--rounds=} ;;
    --row_mib=*) row_mib=${a#--row_mib=} ;;
    --sizes=*) sizes=${a#--sizes=} ;;
    --ferryd_flags=*) ferryd_flags=${a#--ferryd_flags=} ;;
    --queue_flags=*) queue_flags=${a#--queue_flags=} ;;
    --cpus_a=*) cpu_a=${a#--cpus_a=} ;;
    --cpus_b=*) cpu_b=${a#--cpus_b=} ;;
    --bundle=*) bundle=$(realpath "${a#--bundle=}") ;;
  esac
done
case $mode in
  cross-node) ;;
  gpu) exec bash tools/bench/gpu.sh "$@" ;;
  control) exec bash tools/bench/control.sh "$@" ;;
  kv) case " $* " in *" --device"*) exec bash tools/bench/kv_gpu.sh "$@" ;; esac
      exec bash tools/bench/kv.sh "$@" ;;
  qos) exec bash tools/bench/qos.sh "$@" ;;
  *) echo "usage: tools/bench.sh cross-node [--count=N] [--rounds=R] [--row_mib=M] [--sizes=B,B..] [--cpus_a=LIST --cpus_b=LIST] [--bundle=DIR] [--ferryd_flags=..] [--queue_flags=..] | gpu [--bundle=DIR] | control [--iters=N] | kv [--tokens=T,T..] | qos [--seconds=T]" >&2
     exit 2 ;;
esac

if [ -n "$bundle" ]; then
  bin=$bundle/bin
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ferryd=$bin/ferryd fi_write_bench=$bin/fi_write_bench ferry_bench=$bin/ferry_bench
else
  bash tools/setup.sh
  bazel build -c opt //agent/main:ferryd //tools/bench:fi_write_bench //tools/bench:ferry_bench 2>&1 | tail -n 1
  ferryd=bazel-bin/agent/main/ferryd fi_write_bench=bazel-bin/tools/bench/fi_write_bench
  ferry_bench=bazel-bin/tools/bench/ferry_bench
fi
source tools/lib.sh

echo "# ferry cross-node benchmark  $(date -u +%Y-%m-%dT%H:%MZ)  $(nproc) CPUs, $(uname -r)"
echo "# provider tcp;ofi_rxm, loopback 127.0.0.1 -> 127.0.0.2, initiator side on CPUs $cpu_a, target side on CPUs $cpu_b"
echo "# window 16 transfers in flight, count $count per size (write-queue rows capped at $row_mib MiB per size, others at 1 GiB), $rounds rounds; target agent --fabric_spin_us=200000"
echo "# queue sender: $(taskset -c "$cpu_a" nproc) CPU(s), so Reap $([ "$(taskset -c "$cpu_a" nproc)" -ge 2 ] && echo polls || echo sleeps on the doorbell) by default"

# ferry: two agents, a receiver pod on B. The target agent busy-polls its NIC while busy
# and 200 ms after (--fabric_spin_us), as the raw target spins on fi_cq_read; the
# initiator agent keeps the default (it shares its core with the client). A raw run
# starts its own target and starts only once agent B has gone back to sleep, so the two
# targets never spin on one core at the same time.
for node in a b; do
  if [ $node = a ]; then addr=127.0.0.1; cpu=$cpu_a; spin=100; else addr=127.0.0.2; cpu=$cpu_b; spin=200000; fi
  start_bg taskset -c $cpu "$ferryd" --socket="$work/$node.sock" --metrics_address=127.0.0.1:0 \
    --peer_address=$addr:0 --fabric_iface=$addr --fabric_provider='tcp;ofi_rxm' --fabric_spin_us=$spin \
    --ready_file="$work/$node.ready" --log_level=warning $ferryd_flags 2>"$work/$node.log"
done
wait_for "$work/a.ready" 20; wait_for "$work/b.ready" 20
start_bg taskset -c $cpu_b "$ferry_bench" receive --socket="$work/b.sock" --dir="$work" --size=$((64 << 20))
wait_for "$work/descriptor" 20
run() { taskset -c $cpu_a "$ferry_bench" "$@" --socket="$work/a.sock" --dir="$work"; }
raw() {
  sleep 0.3
  rm -rf "$work/raw" && mkdir -p "$work/raw"
  start_bg taskset -c $cpu_b "$fi_write_bench" target --iface=127.0.0.2 --dir="$work/raw" --size=$((64 << 20))
  local target=${pids[-1]}
  taskset -c $cpu_a "$fi_write_bench" initiator --iface=127.0.0.1 --dir="$work/raw" --window=16 "$@"
  touch "$work/raw/stop"
  wait "$target"
}

for r in $(seq 1 "$rounds"); do
  for size in ${sizes//,/ }; do
    if [ $((r % 2)) = 1 ]; then order="raw queue"; else order="queue raw"; fi
    for side in $order; do
      if [ $side = raw ]; then raw --sizes=$size --count="$count" --row_bytes=$((row_mib << 20)) --lat_iters=0
      else run send --sizes=$size --count="$count" --row_bytes=$((row_mib << 20)) --window=16 --api=queue $queue_flags; fi | sed "s/^/$r /" >> "$work/$side.txt"
    done
  done
done
raw --sizes=8 --count=4 --lat_iters=1000 > "$work/raw_lat.txt"
run send --sizes=$sizes --count="$count" --window=16 --layout=contiguous > "$work/contig.txt"
run send --sizes=$sizes --count="$count" --window=16 --layout=paged > "$work/paged.txt"
run latency --iters=1000 > "$work/lat.txt"
run latency --iters=1000 --api=queue > "$work/lat_queue.txt"
run blocks --blocks=10000 --block=4096 --iters=10 > "$work/blocks.txt"

env -u LD_LIBRARY_PATH python3 - "$work" <<'PY'
import statistics, sys
w = sys.argv[1]
def rounds(path):  # {size: {round: (count, us, GBps)}}
    rows = {}
    for line in open(path):
        r, size, n, us, bw = line.split()
        rows.setdefault(int(size), {})[int(r)] = (int(n), float(us), float(bw))
    return rows
def table(path):  # {size: (count, us, GBps)}
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) == 4 and f[0].isdigit():
            rows[int(f[0])] = (int(f[1]), float(f[2]), float(f[3]))
    return rows
def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024: return f"{n}{unit}"
        n //= 1024
raw, queue = rounds(f"{w}/raw.txt"), rounds(f"{w}/queue.txt")
contig, paged = table(f"{w}/contig.txt"), table(f"{w}/paged.txt")
med = statistics.median
print(f"\n{'size':>8} {'api':>6} {'layout':>10} {'count':>6} {'time_us':>10} {'algbw_GBps':>11} {'raw_GBps':>9} {'ratio':>6}  ratio_range")
worst, ratio_of = None, {}
for size in sorted(queue):
    q, r = queue[size], raw.get(size, {})
    paired = [q[k][2] / r[k][2] for k in q if k in r and r[k][2] > 0]
    ratio = med(paired) if paired else 0
    ratio_of[size] = ratio
    n = q[min(q)][0]
    print(f"{human(size):>8} {'queue':>6} {'contiguous':>10} {n:>6} {med(v[1] for v in q.values()):>10.1f} "
          f"{med(v[2] for v in q.values()):>11.3f} {med(v[2] for v in r.values()) if r else 0:>9.3f} {ratio:>6.2f}  "
          f"{min(paired, default=0):.2f}-{max(paired, default=0):.2f} over {len(paired)} rounds")
    if size >= 1 << 20:
        worst = ratio if worst is None else min(worst, ratio)
for name, rows in (("contiguous", contig), ("paged-4KiB", paged)):
    for size in sorted(rows):
        n, us, bw = rows[size]
        rb = med(v[2] for v in raw[size].values()) if size in raw else 0
        print(f"{human(size):>8} {'rpc':>6} {name:>10} {n:>6} {us:>10.1f} {bw:>11.3f} {rb:>9.3f} {bw / rb if rb else 0:>6.2f}  one run")
lat = open(f"{w}/lat.txt").read().split()
qlat = open(f"{w}/lat_queue.txt").read().split()
rlat = [l for l in open(f"{w}/raw_lat.txt") if l.startswith("lat8")][0].split()
print(f"\n8-byte write latency (us): ferry queue Post+Reap p50 {qlat[1]} p99 {qlat[2]}; "
      f"Write+Wait RPCs p50 {lat[1]} p99 {lat[2]}; raw fi_write p50 {rlat[1]} p99 {rlat[2]}")
b = open(f"{w}/blocks.txt").read().split()
print(f"paged write of {b[1]} blocks x {b[2]} B: {float(b[3]):.0f} us, {float(b[4])/1e6:.2f} M blocks/s, {b[5]} GB/s; "
      f"its Write RPC {float(b[6]):.0f} us")
if 65536 in ratio_of: print(f"ratio_64KiB={ratio_of[65536]:.2f}  (queue API, median of rounds)")
if worst is not None: print(f"ratio_1MiB_plus={worst:.2f}  (queue API, min over sizes of the median of rounds)")
PY
