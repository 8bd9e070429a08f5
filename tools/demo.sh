#!/usr/bin/env bash
# The main job: ferry on this machine, end to end, as a serving pod uses it.
# Installs what it needs, builds, starts two ferryd agents (two "nodes"), starts a pod
# process on each that registers host memory, and moves data from one to the other
# through the agents (libfabric tcp;ofi_rxm): for each size through the shared-memory
# write queue with 16 writes in flight, next to raw libfabric fi_write between the same
# two nodes in the same run; then one Write RPC at a time; then one KV-cache handoff
# (32 layers of scattered blocks, one Write, one notification). The receiving pod
# checksums every row's bytes. On a machine with an NVIDIA GPU it adds GPU rows.
# Prints the table and the metrics URL, and stops everything it started.
#   tools/demo.sh [--bundle=DIR]   DIR: prebuilt binaries (tests/gpu/bundle.sh), no build
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=""
for a in "$@"; do
  case $a in
    --bundle=*) bundle=$(realpath "${a#--bundle=}") ;;
    *) echo "usage: tools/demo.sh [--bundle=DIR]" >&2; exit 2 ;;
  esac
done
if [ -n "$bundle" ]; then
  bin=$bundle/bin
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PATH="$PATH:$bundle/bin"  # its ip, if needed
else
  bash tools/setup.sh --roles=build,runtime  # not the test tools (helm, grpcurl, ...)
  echo "== building (the first build takes a few minutes) =="
  bazel build -c opt //agent/main:ferryd //tools/demo:demo_pod //tools/ferryctl //tools/bench:fi_write_bench \
    //tools/bench:gpu_bench 2>&1 | tail -n 2
  mkdir -p "${TMPDIR:-/tmp}"
  bin=$(mktemp -d /tmp/ferry-demo-bin.XXXXXX)
  for b in agent/main/ferryd tools/demo/demo_pod tools/ferryctl/ferryctl tools/bench/fi_write_bench tools/bench/gpu_bench; do
    cp -L "bazel-bin/$b" "$bin/"
  done
fi

source tools/lib.sh

# Two "nodes": network namespaces joined by a veth pair when this machine allows it
# (root + iproute2), else two loopback addresses. Test traffic stays on this machine.
ns_a=ferrydemo$$a; ns_b=ferrydemo$$b
wrap_a=(); wrap_b=()
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null &&
   ip netns add "$ns_a" 2>/dev/null && ip netns add "$ns_b" 2>/dev/null &&
   ip link add vdemo$$a netns "$ns_a" type veth peer name vdemo$$b netns "$ns_b" 2>/dev/null; then
  ip -n "$ns_a" addr add 169.254.90.1/30 dev vdemo$$a; ip -n "$ns_a" link set vdemo$$a up; ip -n "$ns_a" link set lo up
  ip -n "$ns_b" addr add 169.254.90.2/30 dev vdemo$$b; ip -n "$ns_b" link set vdemo$$b up; ip -n "$ns_b" link set lo up
  addr_a=169.254.90.1; addr_b=169.254.90.2
  wrap_a=(ip netns exec "$ns_a"); wrap_b=(ip netns exec "$ns_b")
  echo "nodes: two network namespaces ($ns_a, $ns_b) joined by a veth pair"
else
  ip netns del "$ns_a" 2>/dev/null || true
  addr_a=127.0.0.1; addr_b=127.0.0.2
  echo "nodes: loopback addresses $addr_a and $addr_b (network namespaces unavailable here)"
fi
on_exit_extra() {
  ip netns del "$ns_a" 2>/dev/null || true; ip netns del "$ns_b" 2>/dev/null || true
  [ -n "$bundle" ] || rm -rf "$bin"
}

# Each node's processes (agent, pod, raw fi_write side) on a CPU of their own where
# there are two, as tools/bench.sh pins them: on 2 cores, unpinned busy pollers and the
# kernel's TCP work swing either side's rate by tens of percent.
if [ "$(nproc)" -ge 2 ]; then
  wrap_a=("${wrap_a[@]}" taskset -c 0); wrap_b=("${wrap_b[@]}" taskset -c 1)
fi

echo "== starting two ferryd agents (libfabric tcp;ofi_rxm) =="
# Node b, the receiving side, has a core to spare: its agent keeps polling its NIC for
# 200 ms after the last write (--fabric_spin_us), as the raw target polls its CQ; tcp;ofi_rxm
# moves incoming data only while the target polls.
for node in a b; do
  if [ $node = a ]; then wrap=("${wrap_a[@]}"); addr=$addr_a; spin=100; else wrap=("${wrap_b[@]}"); addr=$addr_b; spin=200000; fi
  start_bg "${wrap[@]}" "$bin/ferryd" --socket="$work/$node.sock" --metrics_address=127.0.0.1:0 \
    --peer_address="$addr:0" --fabric_iface="$addr" --fabric_provider='tcp;ofi_rxm' --fabric_spin_us=$spin \
    --ready_file="$work/$node.ready" 2>"$work/ferryd-$node.log"
done
wait_for "$work/a.ready" 20
wait_for "$work/b.ready" 20
echo "agent a: unix:$work/a.sock, peer $(sed -n 's/^peer_address=//p' "$work/a.ready")"
echo "agent b: unix:$work/b.sock, peer $(sed -n 's/^peer_address=//p' "$work/b.ready")"

sizes=4096,32768,65536,1048576,16777216,67108864
echo "== pods: the receiver on node b registers 256 MiB; the sender on node a writes into it =="
start_bg "${wrap_b[@]}" "$bin/demo_pod" receive --socket="$work/b.sock" --dir="$work" --size=$((256 << 20)) \
  2>"$work/receiver.log"
wait_for "$work/descriptor" 20
fail=0
# Size by size, raw libfabric between the same two nodes (fi_write with the provider,
# flags, window of 16 and row lengths of the queue rows, no agent) and ferry's write
# queue, back to back, in 3 rounds that swap which goes first; the table takes medians.
# The raw target busy-polls, so it runs only for its own row, once agent b has stopped
# polling: two pollers on one core would slow whichever row ran.
raw_row() {
  sleep 0.3
  rm -rf "$work/raw" && mkdir -p "$work/raw"
  start_bg "${wrap_b[@]}" "$bin/fi_write_bench" target --iface=$addr_b --dir="$work/raw" --size=$((64 << 20))
  "${wrap_a[@]}" "$bin/fi_write_bench" initiator --iface=$addr_a --dir="$work/raw" --sizes=$1 --count=20000 \
    --row_bytes=$((256 << 20)) --window=16 --lat_iters=0 | sed "s/^/$2 /" >> "$work/raw.txt" || fail=1
  touch "$work/raw/stop"
  wait "${pids[-1]}" || fail=1
}
queue_row() {
  "${wrap_a[@]}" "$bin/demo_pod" send --api=queue --socket="$work/a.sock" --dir="$work" --sizes=$1 --count=20000 |
    grep '^ *[0-9]' | sed "s/^/$2 /" >> "$work/queue.txt" || fail=1
}
for round in 1 2 3; do
  for size in ${sizes//,/ }; do
    if [ $((round % 2)) = 1 ]; then raw_row $size $round; queue_row $size $round
    else queue_row $size $round; raw_row $size $round; fi
  done
done
"${wrap_a[@]}" "$bin/demo_pod" send --api=rpc --socket="$work/a.sock" --dir="$work" --sizes=$sizes --iters=5 > "$work/rpc.txt" || fail=1
"${wrap_a[@]}" "$bin/demo_pod" kv --socket="$work/a.sock" --dir="$work" > "$work/kv.txt" || fail=1

echo
env -u LD_LIBRARY_PATH python3 - "$work" <<'PY'
import sys
w = sys.argv[1]
from statistics import median
def rows(path):  # {size: (count, us, GBps, check)}; demo_pod's and fi_write_bench's lines
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 4 and f[0].isdigit():
            out[int(f[0])] = (int(f[1]), float(f[2]), float(f[3]), f[4] if len(f) > 4 else "")
    return out
def rounds(path):  # {size: {round: (count, GBps, check)}}
    out = {}
    for line in open(path):
        f = line.split()
        out.setdefault(int(f[1]), {})[int(f[0])] = (int(f[2]), float(f[4]), f[5] if len(f) > 5 else "")
    return out
def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024: return f"{n} {unit}"
        n //= 1024
queue, raw, rpc = rounds(f"{w}/queue.txt"), rounds(f"{w}/raw.txt"), rows(f"{w}/rpc.txt")
print("medians over 3 rounds; ratio = ferry / raw, median of the rounds' ratios (range)")
print(f"{'':20} {'size':>8} {'writes':>7} {'ferry GB/s':>11} {'raw GB/s':>9} {'ratio':>6} {'range':>10}  checksum")
for size in sorted(set(queue) | set(raw)):
    q, r = queue.get(size, {}), raw.get(size, {})
    paired = [q[k][1] / r[k][1] for k in q if k in r and r[k][1] > 0]
    ratio = f"{median(paired):.2f}" if paired else "-"
    spread = f"{min(paired):.2f}-{max(paired):.2f}" if paired else "-"
    checks = {v[2] for v in q.values()}
    check = "verified" if checks == {"verified"} and len(q) == 3 else "MISMATCH"
    print(f"{'write queue, 16 in flight':20} {human(size):>8} {q[min(q)][0] if q else 0:>7} "
          f"{median(v[1] for v in q.values()) if q else 0:>11.3f} {median(v[1] for v in r.values()) if r else 0:>9.3f} "
          f"{ratio:>6} {spread:>10}  {check}")
raw = {s: (0, 0, median(v[1] for v in r.values()), "") for s, r in raw.items()}  # medians, as rows() gives
for size in sorted(rpc):
    n, us, bw, check = rpc[size]
    print(f"{'one Write RPC at a time':20} {human(size):>8} {n:>7} {bw:>11.3f} {'':>9} {'':>6}  {check}  ({us:.0f} us each)")
best_raw = max((r[2] for s, r in raw.items() if s >= 1 << 20), default=0)
block_raw = raw[32768][2] if 32768 in raw else 0
for line in open(f"{w}/kv.txt"):
    f = line.split()
    if f and f[0] == "kv":
        nbytes, chunks, us, bw, check, fastest, slowest = int(f[1]), int(f[2]), float(f[3]), float(f[4]), f[5], float(f[6]), float(f[7])
        def vs(rate): return f"{nbytes / rate / 1e6:.1f} ms (ratio {nbytes / rate / 1e3 / us:.2f})" if rate else "-"
        print(f"\nKV handoff, Llama-3-8B shape (32 layers x K,V x 64 blocks of 32 KiB = 1k tokens, scattered over a "
              f"128-block pool),\none Write of {chunks} chunks with a notification, all layers in one region:  {check}\n"
              f"  {human(nbytes)}: {us / 1e3:.1f} ms from submit to the receiver notified (median of 3, "
              f"{fastest / 1e3:.1f}-{slowest / 1e3:.1f}), {bw:.3f} GB/s\n"
              f"  raw fi_write of the same bytes as 32 KiB writes: {vs(block_raw)}; at its best rate above: {vs(best_raw)}")
PY

# GPU rows, where there is a GPU: node-local paged KV blocks (GPU0 -> GPU1, or GPU0 ->
# GPU0 on one GPU) and the staged cross-agent path between the two agents, each row's
# destination read back and compared (tools/bench/gpu_bench).
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l || true)
if [ "${gpus:-0}" -gt 0 ]; then
  dst_device=$(( gpus > 1 ? 1 : 0 ))
  echo
  echo "== GPU rows ($gpus GPU(s)): node-local on agent a, then staged from agent a to agent b =="
  "$bin/gpu_bench" --socket="$work/a.sock" --src_device=0 --dst_device=$dst_device --paged_only | tee "$work/gpu.txt" ||
    fail=1
  "$bin/gpu_bench" --socket="$work/a.sock" --dst_socket="$work/b.sock" --src_device=0 --dst_device=$dst_device \
    --transport="staged over tcp;ofi_rxm ($addr_a -> $addr_b)" | tee -a "$work/gpu.txt" || fail=1
else
  touch "$work/gpu.txt"
  echo
  echo "GPU rows: skipped (no NVIDIA GPU on this machine)"
fi

if [ "$fail" -ne 0 ] || grep -qE "MISMATCH|UNREADABLE" "$work/queue.txt" "$work/rpc.txt" "$work/kv.txt" "$work/gpu.txt"; then
  echo "demo: a transfer failed or a checksum did not match (logs: $work)" >&2
  KEEP_WORK=1
  exit 1
fi

echo
"$bin/ferryctl" --socket="$work/a.sock" status | sed -n '/^NIC/,$p'
metrics_port=$(sed -n 's/^metrics_port=//p' "$work/a.ready")
echo
if [ ${#wrap_a[@]} -gt 0 ]; then
  echo "metrics of agent a: ip netns exec $ns_a curl http://127.0.0.1:$metrics_port/metrics (while the demo runs)"
else
  echo "metrics of agent a: http://127.0.0.1:$metrics_port/metrics (while the demo runs)"
fi
if command -v curl >/dev/null; then
  "${wrap_a[@]}" curl -s "http://127.0.0.1:$metrics_port/metrics" | grep -E '^ferry_(transfers_total|transfer_bytes_total)' || true
fi
echo "demo: done"
