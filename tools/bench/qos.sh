#!/usr/bin/env bash
# `tools/bench.sh qos [--seconds=T] [--ferryd_flags='...'] [--cpus_a=LIST --cpus_b=LIST --cpus_pods=LIST]
#                    [--bundle=DIR]`:
# tenants sharing agent A's NIC, in one run:
#   tenant B saturates with 64 MiB writes, 16 in flight (bulk), while tenant A writes
#   64 KiB one at a time (Write + Wait, latency class): A's p50 / p99 with traffic
#   classes, with first-in-first-out order (an agent run with --qos=false), with
#   classes and latency lanes (--fabric_latency_lane, against A alone on that agent), and alone;
#   B's bandwidth beside A against B alone; two bulk tenants at weights 3:1 (their pods
#   run with gids 2001 and 2002, which the agent's --qos_tenants weighs).
# Three initiator agents on --cpus_a (classes on 127.0.0.1, --qos=false on 127.0.0.3,
# classes and lanes on 127.0.0.4), one target agent with lanes on --cpus_b (127.0.0.2,
# spinning, a receiver pod with a 64 MiB region; agents without lanes use its NIC),
# the tenants' pods on --cpus_pods (default: --cpus_a), tcp;ofi_rxm on loopback as in
# `tools/bench.sh cross-node`. In each loaded case the stream runs T seconds and the probe
# the middle T - 1 of them; B's rate counts the writes that finished within its T
# seconds. --ferryd_flags go to the initiator agents. --bundle=DIR takes the binaries
# from tests/gpu/bundle.sh's folder (a host without Bazel).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=5 cpu_a=0 cpu_b=1 cpu_pods="" ferryd_flags="" bundle=""
[ "$(nproc)" -gt 1 ] || cpu_b=0
for a in "$@"; do
  case $a in
    --seconds=*) seconds=${a#--seconds=} ;;
    --ferryd_flags=*) ferryd_flags=${a#--ferryd_flags=} ;;
    --cpus_a=*) cpu_a=${a#--cpus_a=} ;;
    --cpus_b=*) cpu_b=${a#--cpus_b=} ;;
    --cpus_pods=*) cpu_pods=${a#--cpus_pods=} ;;
    --bundle=*) bundle=$(realpath "${a#--bundle=}") ;;
    *) echo "qos: unknown argument $a" >&2; exit 2 ;;
  esac
done
cpu_pods=${cpu_pods:-$cpu_a}
if [ -n "$bundle" ]; then
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ferryd=$bundle/bin/ferryd ferry_bench=$bundle/bin/ferry_bench
else
  bash tools/setup.sh
  bazel build -c opt //agent/main:ferryd //tools/bench:ferry_bench 2>&1 | tail -n 1
  ferryd=bazel-bin/agent/main/ferryd ferry_bench=bazel-bin/tools/bench/ferry_bench
fi
source tools/lib.sh

echo "# ferry traffic classes  $(date -u +%Y-%m-%dT%H:%MZ)  $(nproc) CPUs, $(uname -r); ${seconds} s per case"
echo "# initiator agents on CPUs $cpu_a, tenants' pods on CPUs $cpu_pods, target agent (--fabric_spin_us=200000) on CPUs $cpu_b"
echo "# initiator flags: ${ferryd_flags:-(defaults)}"
agent() {  # agent NAME ADDR CPUS FLAGS...
  local name=$1 addr=$2 cpu=$3
  shift 3
  start_bg taskset -c "$cpu" "$ferryd" --socket="$work/$name.sock" --metrics_address=127.0.0.1:0 \
    --peer_address="$addr:0" --fabric_iface="$addr" --fabric_provider='tcp;ofi_rxm' \
    --ready_file="$work/$name.ready" --log_level=warning "$@" 2>"$work/$name.log"
}
# shellcheck disable=SC2086
agent q 127.0.0.1 "$cpu_a" --qos_tenants='gid=2001,weight=3;gid=2002,weight=1' $ferryd_flags
# shellcheck disable=SC2086
agent f 127.0.0.3 "$cpu_a" --qos=false $ferryd_flags
# shellcheck disable=SC2086
agent l 127.0.0.4 "$cpu_a" --fabric_latency_lane $ferryd_flags
agent b 127.0.0.2 "$cpu_b" --fabric_spin_us=200000 --fabric_latency_lane
for n in q f l b; do wait_for "$work/$n.ready" 20; done
start_bg taskset -c "$cpu_b" "$ferry_bench" receive --socket="$work/b.sock" --dir="$work" --size=$((64 << 20))
wait_for "$work/descriptor" 20

bench() {  # bench AGENT GID MODE FLAGS...: one tenant, as a pod of group GID
  local sock=$work/$1.sock gid=$2
  shift 2
  taskset -c "$cpu_pods" setpriv --regid="$gid" --clear-groups "$ferry_bench" "$@" --socket="$sock" \
    --dir="$work"
}
stream() { bench "$1" "$2" stream --size=$((64 << 20)) --window=16 --seconds="$seconds" "${@:3}"; }
probe() { bench "$1" 0 probe --size=65536 --seconds="$3" --traffic_class="$2"; }
loaded() {  # loaded AGENT CLASS: B streams, A probes the middle of it
  stream "$1" 0 --traffic_class=bulk > "$work/stream.txt" &
  local s=$!
  sleep 0.5
  probe "$1" "$2" "$(python3 -c "print(max(1, $seconds - 1))")"
  wait $s
  cat "$work/stream.txt"
}

{
  echo "alone $(probe q latency "$seconds")"
  echo "b_alone $(stream q 0 --traffic_class=bulk)"
  loaded q latency | paste -sd' ' | sed 's/^/classes /'
  loaded f "" | paste -sd' ' | sed 's/^/fifo /'
  echo "alone_lanes $(probe l latency "$seconds")"
  loaded l latency | paste -sd' ' | sed 's/^/lanes /'
  stream q 2001 --traffic_class=bulk > "$work/w3.txt" &
  w=$!
  stream q 2002 --traffic_class=bulk > "$work/w1.txt"
  wait $w
  echo "weights $(cat "$work/w3.txt") $(cat "$work/w1.txt")"
} > "$work/rows.txt"

python3 - "$work/rows.txt" <<'PY'
import sys
rows = {l.split()[0]: l.split()[1:] for l in open(sys.argv[1]) if l.strip()}
def probe(f):   # ["probe", n, p50, p99]
    return int(f[1]), float(f[2]), float(f[3])
def stream(f):  # ["stream", bytes, seconds, GBps]
    return float(f[3])
alone = probe(rows["alone"])
b_alone = stream(rows["b_alone"])
cls_a, cls_b = probe(rows["classes"][:4]), stream(rows["classes"][4:])
fifo_a, fifo_b = probe(rows["fifo"][:4]), stream(rows["fifo"][4:])
alone_l = probe(rows["alone_lanes"])
lanes_a, lanes_b = probe(rows["lanes"][:4]), stream(rows["lanes"][4:])
w3, w1 = stream(rows["weights"][:4]), stream(rows["weights"][4:])
print(f"\n{'tenant A: 64 KiB Write+Wait, one at a time':<52} {'n':>7} {'p50_us':>9} {'p99_us':>9}")
for label, (n, p50, p99) in [("alone", alone), ("beside B, traffic classes (A latency, B bulk)", cls_a),
                             ("beside B, first in first out (--qos=false)", fifo_a),
                             ("alone, latency lanes", alone_l),
                             ("beside B, traffic classes and latency lanes", lanes_a)]:
    print(f"{label:<52} {n:>7} {p50:>9.1f} {p99:>9.1f}")
print(f"\n{'tenant B: 64 MiB writes, 16 in flight':<52} {'GB/s':>9}")
for label, bw in [("alone", b_alone), ("beside A, traffic classes", cls_b), ("beside A, first in first out", fifo_b),
                  ("beside A, traffic classes and latency lanes", lanes_b)]:
    print(f"{label:<52} {bw:>9.3f}")
print(f"\n{'two bulk tenants, weights 3:1 (gid 2001, 2002)':<52} {'GB/s':>9}")
print(f"{'weight 3':<52} {w3:>9.3f}\n{'weight 1':<52} {w1:>9.3f}")
print("\ngoals:")
print(f"  A's p99 beside B / A's p99 alone, classes   {cls_a[2] / alone[2]:6.2f}  (goal <= 2; first in first out: "
      f"{fifo_a[2] / alone[2]:.2f})")
print(f"    with latency lanes (over A alone there)   {lanes_a[2] / alone_l[2]:6.2f}")
print(f"  B's rate beside A / B alone, classes        {cls_b / b_alone:6.2f}  (goal >= 0.9; first in first out: "
      f"{fifo_b / b_alone:.2f})")
print(f"    with latency lanes                        {lanes_b / b_alone:6.2f}")
print(f"  weight-3 / weight-1 tenant's rate           {w3 / w1:6.2f}  (goal 3 +- 10 %: 2.7..3.3)")
PY
