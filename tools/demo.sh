#!/usr/bin/env bash
# The main job: ferry on this machine, end to end, with the default embedded setup.
# Installs what it needs, builds, starts two ferryd agents (two "nodes"), starts a pod
# process on each that registers host memory, moves data from one to the other through
# the agents (libfabric, several sizes, checksummed by the receiver), prints a table and
# the metrics URL, and stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

echo "== building (the first build takes a few minutes) =="
bazel build -c opt //agent/main:ferryd //tools/demo:demo_pod //tools/ferryctl 2>&1 | tail -n 2
bin=bazel-bin

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
on_exit_extra() { ip netns del "$ns_a" 2>/dev/null || true; ip netns del "$ns_b" 2>/dev/null || true; }

echo "== starting two ferryd agents (libfabric tcp;ofi_rxm) =="
for node in a b; do
  if [ $node = a ]; then wrap=("${wrap_a[@]}"); addr=$addr_a; else wrap=("${wrap_b[@]}"); addr=$addr_b; fi
  start_bg "${wrap[@]}" "$bin/agent/main/ferryd" --socket="$work/$node.sock" --metrics_address=127.0.0.1:0 \
    --peer_address="$addr:0" --fabric_iface="$addr" --fabric_provider='tcp;ofi_rxm' \
    --ready_file="$work/$node.ready" 2>"$work/ferryd-$node.log"
done
wait_for "$work/a.ready" 20
wait_for "$work/b.ready" 20
echo "agent a: unix:$work/a.sock, peer $(sed -n 's/^peer_address=//p' "$work/a.ready")"
echo "agent b: unix:$work/b.sock, peer $(sed -n 's/^peer_address=//p' "$work/b.ready")"

echo "== pods: the receiver on node b registers 64 MiB; the sender on node a writes into it =="
start_bg "$bin/tools/demo/demo_pod" receive --socket="$work/b.sock" --dir="$work" --size=$((64 << 20)) \
  2>"$work/receiver.log"
wait_for "$work/descriptor" 20
"$bin/tools/demo/demo_pod" send --socket="$work/a.sock" --dir="$work" \
  --sizes=4096,65536,1048576,16777216,67108864 --iters=5

echo
"$bin/tools/ferryctl/ferryctl" --socket="$work/a.sock" status | sed -n '/^NIC/,$p'
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
