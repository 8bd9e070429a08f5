#!/usr/bin/env bash
# `tools/bench.sh control [--iters=N] [--cpus_a=LIST --cpus_b=LIST] [--bundle=DIR]`: the
# control path —
# what one call of the local API costs — in one run, p50 and p99 of 8-byte round trips:
#   the floor: a bare gRPC unary echo over a unix socket, same gRPC library, same
#   synchronous server kind as the agent (tools/bench/grpc_echo), and the same echo on
#   gRPC's callback server (what moving the agent to it could gain);
#   GetStatus; Write + Wait node-local, cross-agent, cross-agent with a notification (by
#   fabric message, and by the peer Notify RPC from an agent R run with
#   --fabric_messages=false);
#   the write queue cross-agent — from C++ (ferry_bench control) and from Python
#   (tools/bench/py_control.py; its RPC rows through grpcio and through libferry_rpc,
#   the C++ gRPC library under the Python client); a notified queue write from Python
#   timed until the receiving session's inbox has its notification (node-local and
#   cross-agent); and raw fi_write (fi_write_bench) as the transport's own.
# Two agents on loopback over tcp;ofi_rxm as in `tools/bench.sh cross-node`: agent A,
# the callers and the echo server on --cpus_a; agent B (spinning) and its receiver pod
# on --cpus_b. Then the issue's goals as ratios: Write+Wait node-local against two echo
# calls, notified against un-notified, Python (through grpcio and through libferry_rpc)
# against C++. --bundle=DIR takes the binaries from tests/gpu/bundle.sh's folder (a host
# without Bazel) and runs py_control.py with the host's python3 (PYTHONPATH: the client
# of tests/gpu/python_bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
iters=2000 cpu_a=0 cpu_b=1 bundle=""
[ "$(nproc)" -gt 1 ] || cpu_b=0
for a in "$@"; do
  case $a in
    --iters=*) iters=${a#--iters=} ;;
    --cpus_a=*) cpu_a=${a#--cpus_a=} ;;
    --cpus_b=*) cpu_b=${a#--cpus_b=} ;;
    --bundle=*) bundle=$(realpath "${a#--bundle=}") ;;
    *) echo "control: unknown argument $a" >&2; exit 2 ;;
  esac
done
if [ -n "$bundle" ]; then
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ferryd=$bundle/bin/ferryd ferry_bench=$bundle/bin/ferry_bench fi_write_bench=$bundle/bin/fi_write_bench
  grpc_echo=$bundle/bin/grpc_echo rpc_lib=$bundle/lib/libferry_rpc.so python=python3
else
  bash tools/setup.sh
  bazel build -c opt //agent/main:ferryd //tools/bench:ferry_bench //tools/bench:fi_write_bench //tools/bench:grpc_echo \
    //client/native:libferry_rpc.so 2>&1 | tail -n 1
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --upgrade ./client/python
  ferryd=bazel-bin/agent/main/ferryd ferry_bench=bazel-bin/tools/bench/ferry_bench
  fi_write_bench=bazel-bin/tools/bench/fi_write_bench grpc_echo=bazel-bin/tools/bench/grpc_echo
  rpc_lib=$PWD/bazel-bin/client/native/libferry_rpc.so python=.venv/bin/python
fi
source tools/lib.sh

echo "# ferry control path  $(date -u +%Y-%m-%dT%H:%MZ)  $(nproc) CPUs, $(uname -r); $iters calls per row after warm-up"
echo "# callers, agent A and the echo server on CPUs $cpu_a; agent B (--fabric_spin_us=200000) and its receiver on CPUs $cpu_b"
for node in a b; do
  if [ $node = a ]; then addr=127.0.0.1; cpu=$cpu_a; spin=100; else addr=127.0.0.2; cpu=$cpu_b; spin=200000; fi
  start_bg taskset -c $cpu $ferryd --socket="$work/$node.sock" --metrics_address=127.0.0.1:0 \
    --peer_address=$addr:0 --fabric_iface=$addr --fabric_provider='tcp;ofi_rxm' --fabric_spin_us=$spin \
    --ready_file="$work/$node.ready" --log_level=warning 2>"$work/$node.log"
done
start_bg taskset -c $cpu_a $ferryd --socket="$work/r.sock" --metrics_address=127.0.0.1:0 \
  --peer_address=127.0.0.3:0 --fabric_iface=127.0.0.3 --fabric_provider='tcp;ofi_rxm' --fabric_messages=false \
  --ready_file="$work/r.ready" --log_level=warning 2>"$work/r.log"
start_bg taskset -c $cpu_a $grpc_echo serve --socket="$work/echo.sock"
start_bg taskset -c $cpu_a $grpc_echo serve --socket="$work/echo_cb.sock" --callback
wait_for "$work/a.ready" 20; wait_for "$work/b.ready" 20; wait_for "$work/r.ready" 20; wait_for "$work/echo.sock" 20; wait_for "$work/echo_cb.sock" 20
start_bg taskset -c $cpu_b $ferry_bench receive --socket="$work/b.sock" --dir="$work" --size=$((1 << 20))
wait_for "$work/descriptor" 20

taskset -c $cpu_a $grpc_echo call --socket="$work/echo.sock" --iters="$iters" > "$work/rows.txt"
taskset -c $cpu_a $grpc_echo call --socket="$work/echo_cb.sock" --iters="$iters" --label=echo_callback \
  >> "$work/rows.txt"
taskset -c $cpu_a $ferry_bench control --socket="$work/a.sock" --dir="$work" --iters="$iters" >> "$work/rows.txt"
taskset -c $cpu_a $ferry_bench control --socket="$work/r.sock" --dir="$work" --iters="$iters" |
  awk '$1 == "remote_notify" {print "remote_notify_rpc", $2, $3}' >> "$work/rows.txt"
taskset -c $cpu_a $python tools/bench/py_control.py --socket="$work/a.sock" --descriptor="$work/descriptor" \
  --echo_socket="$work/echo.sock" --peer_socket="$work/b.sock" --iters="$iters" \
  --rpc_lib="$rpc_lib" >> "$work/rows.txt"
sleep 0.3  # agent B back to sleep before the raw target spins on its core
mkdir -p "$work/raw"
start_bg taskset -c $cpu_b $fi_write_bench target --iface=127.0.0.2 --dir="$work/raw" --size=$((1 << 20))
taskset -c $cpu_a $fi_write_bench initiator --iface=127.0.0.1 --dir="$work/raw" --window=16 \
  --sizes=8 --count=4 --lat_iters="$iters" | awk '/^lat8/ {print "raw", $2, $3}' >> "$work/rows.txt"
touch "$work/raw/stop"

python3 - "$work/rows.txt" <<'PY'
import sys
rows = {l.split()[0]: (float(l.split()[1]), float(l.split()[2])) for l in open(sys.argv[1]) if l.strip()}
names = [
    ("echo", "bare gRPC unary echo (the floor)"),
    ("echo_callback", "  the same on gRPC's callback server"),
    ("getstatus", "GetStatus"),
    ("local", "C++ Write+Wait node-local 8 B"),
    ("remote", "C++ Write+Wait cross-agent 8 B"),
    ("remote_notify", "C++ Write+Wait cross-agent 8 B, notify"),
    ("remote_notify_rpc", "  notified by RPC (--fabric_messages=false)"),
    ("queue_remote", "C++ write queue cross-agent 8 B"),
    ("py_echo", "Python (grpcio) bare unary echo"),
    ("py_getstatus", "Python status()"),
    ("py_local", "Python write(wait=).result() node-local 8 B"),
    ("py_remote", "Python write(wait=).result() cross-agent 8 B"),
    ("py_remote_notify", "Python write(wait=).result() cross-agent 8 B, notify"),
    ("py_native_getstatus", "Python status(), libferry_rpc"),
    ("py_native_local", "Python write(wait=).result() node-local, libferry_rpc"),
    ("py_native_remote", "Python write(wait=).result() cross-agent, libferry_rpc"),
    ("py_native_remote_notify", "  the same, notify"),
    ("py_queue_remote", "Python write queue cross-agent 8 B"),
    ("py_notify_inbox_local", "Python queue, notified: post -> receiver's inbox"),
    ("py_notify_inbox_remote", "  the same cross-agent"),
    ("raw", "raw fi_write 8 B"),
]
print(f"\n{'round trip':<48} {'p50_us':>8} {'p99_us':>8}")
for key, label in names:
    if key in rows:
        print(f"{label:<48} {rows[key][0]:>8.1f} {rows[key][1]:>8.1f}")
def ratio(a, b, k=1.0):
    return rows[a][0] / (k * rows[b][0])
print("\ngoals (p50 ratios):")
print(f"  Write+Wait node-local / 2 x echo        {ratio('local', 'echo', 2):5.2f}  (goal <= 1.2)")
print(f"  notified / un-notified cross-agent      {ratio('remote_notify', 'remote'):5.2f}  (goal <= 1.2)")
print(f"    (notified by RPC / un-notified        {ratio('remote_notify_rpc', 'remote'):5.2f})")
print(f"  Python / C++ Write+Wait cross-agent     {ratio('py_remote', 'remote'):5.2f}  (goal <= 1.5)")
print(f"    (grpcio / C++ bare echo               {ratio('py_echo', 'echo'):5.2f})")
print(f"  the same through libferry_rpc:")
print(f"    Write+Wait cross-agent                {ratio('py_native_remote', 'remote'):5.2f}  (goal <= 1.5)")
print(f"    Write+Wait node-local                 {ratio('py_native_local', 'local'):5.2f}  (goal <= 1.5)")
print(f"    Write+Wait cross-agent, notify        {ratio('py_native_remote_notify', 'remote_notify'):5.2f}  (goal <= 1.5)")
print(f"    GetStatus                             {ratio('py_native_getstatus', 'getstatus'):5.2f}  (goal <= 1.5)")
print(f"    (grpcio: GetStatus                    {ratio('py_getstatus', 'getstatus'):5.2f})")
print(f"  Python / C++ write queue cross-agent    {ratio('py_queue_remote', 'queue_remote'):5.2f}  (goal <= 1.5)")
PY
