#!/usr/bin/env bash
# Scale and churn: N agents in network namespaces on this machine, one bridge,
# a pod on each writing checksummed blocks to every other agent's pod, and churn — every
# few seconds an agent SIGKILLed and restarted, a pod SIGKILLed and started again, or a
# new agent joining. Reports writes lost, corrupted and hung (all must be 0), the first
# write to a new pod (p50 / p99), time to heal after a restart, and each agent's RSS,
# fds, threads, peers and metric series over time (tools/scale/scale.py).
#
#   tools/scale.sh [--agents=64] [--minutes=10] [--churn_s=5] [--interval_ms=500]
#   bazel test //tools/scale:scale_short      16 agents for a minute, as tools/test.sh runs it
#
# Needs root (network namespaces). Exit status 1 on a lost, corrupt or hung write, or an
# agent that died on its own. KEEP_WORK=1 keeps the agents' and pods' logs.
set -euo pipefail
args=()
for a in "$@"; do
  case $a in
    --agents=*|--minutes=*|--churn_s=*|--interval_ms=*|--sample_s=*) args+=("$a") ;;
    *) echo "usage: tools/scale.sh [--agents=N] [--minutes=M] [--churn_s=S] [--interval_ms=MS]" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" != 0 ]; then echo "tools/scale.sh: needs root (network namespaces)" >&2; exit 2; fi
if [ -n "${FERRYD:-}" ]; then  # `bazel test //tools/scale:scale_short`: the binaries are its data
  ferryd=$(realpath "$FERRYD")
  pod=$(realpath "$FERRY_SCALE_POD")
  cd "$(dirname "$(readlink -f "$0")")/.."
else
  cd "$(dirname "$0")/.."
  bash tools/setup.sh
  bazel build -c opt //agent/main:ferryd //tools/scale:scale_pod 2>&1 | tail -n 1
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  ferryd=$bin/agent/main/ferryd
  pod=$bin/tools/scale/scale_pod
fi
source tools/lib.sh
python3 tools/scale/scale.py "${args[@]}" --ferryd="$ferryd" --pod="$pod" --dir="$work"
