#!/usr/bin/env bash
# Soak: three agents, pods on each moving random checksummed data among themselves
# (Write RPCs, paged writes and queue entries, same agent and across agents), for a
# bounded time. Samples each agent's RSS and open fds every 10 s and prints a summary.
#
#   tools/soak.sh --minutes N     (default 1; the run is always bounded)
#
# Agents listen on 127.0.0.1, .2 and .3 (tcp;ofi_rxm). Exit status 1 on any failed or
# corrupt transfer, or an agent that died.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=1
for a in "$@"; do case $a in --minutes=*) minutes=${a#--minutes=} ;; esac; done
case $minutes in ''|*[!0-9]*) echo "usage: tools/soak.sh --minutes=N" >&2; exit 2 ;; esac

bash tools/setup.sh
bazel build -c opt //agent/main:ferryd //tools/soak:soak_pod 2>&1 | tail -n 1
bin=bazel-bin
source tools/lib.sh

agent_pids=()
for i in 1 2 3; do
  start_bg "$bin/agent/main/ferryd" --socket="$work/$i.sock" --metrics_address=127.0.0.1:0 \
    --peer_address=127.0.0.$i:0 --fabric_iface=127.0.0.$i --fabric_provider='tcp;ofi_rxm' \
    --ready_file="$work/$i.ready" --log_level=warning 2>"$work/$i.log"
  agent_pids+=($!)
done
for i in 1 2 3; do wait_for "$work/$i.ready" 20; done

sample() {  # sample LABEL: one line per agent
  for i in 1 2 3; do
    p=${agent_pids[$((i - 1))]}
    if [ -d /proc/$p ]; then
      rss=$(awk '/^VmRSS:/ {print $2}' /proc/$p/status)
      fds=$(ls /proc/$p/fd | wc -l)
      echo "$1 agent$i rss_kB=$rss fds=$fds" >> "$work/samples"
    else
      echo "$1 agent$i DEAD" >> "$work/samples"
    fi
  done
}

echo "# ferry soak  $(date -u +%Y-%m-%dT%H:%MZ)  $minutes min, 3 agents x 2 pods, $(nproc) CPUs"
seconds=$((minutes * 60))
"$bin/tools/soak/soak_pod" --sockets="$work/1.sock,$work/2.sock,$work/3.sock" --seconds=$seconds \
  --pods_per_agent=2 > "$work/pod.out" 2> "$work/pod.err" &
pod=$!
t=0
sample "t=0"
while kill -0 $pod 2>/dev/null && [ $t -lt $((seconds + 60)) ]; do
  sleep 10; t=$((t + 10))
  sample "t=$t"
done
status=0
wait $pod || status=1
cat "$work/pod.out"
head -n 20 "$work/pod.err"
for i in 1 2 3; do
  if ! kill -0 "${agent_pids[$((i - 1))]}" 2>/dev/null; then
    echo "agent$i died; the end of its log:"
    tail -n 20 "$work/$i.log"
  fi
done

python3 - "$work/samples" <<'PY'
import re, sys
rows = {}
for line in open(sys.argv[1]):
    t, agent, *rest = line.split()
    if rest == ["DEAD"]:
        rows.setdefault(agent, []).append((t, None, None))
        continue
    kv = dict(x.split("=") for x in rest)
    rows.setdefault(agent, []).append((t, int(kv["rss_kB"]), int(kv["fds"])))
print(f"\n{'agent':>7} {'rss_first_MiB':>14} {'rss_after_1min':>15} {'rss_last_MiB':>13} {'rss_max_MiB':>12} {'fds_first':>10} {'fds_last':>9} {'fds_max':>8}")
dead = False
for agent, s in sorted(rows.items()):
    live = [x for x in s if x[1] is not None]
    dead |= len(live) != len(s)
    after = [x for x in live if int(x[0][2:].rstrip("s") or 0) >= 60] or live
    print(f"{agent:>7} {live[0][1]/1024:>14.1f} {after[0][1]/1024:>15.1f} {live[-1][1]/1024:>13.1f} "
          f"{max(x[1] for x in live)/1024:>12.1f} {live[0][2]:>10} {live[-1][2]:>9} {max(x[2] for x in live):>8}")
print("agents: " + ("one DIED" if dead else "all alive"))
sys.exit(1 if dead else 0)
PY
[ $? -eq 0 ] || status=1
exit $status
