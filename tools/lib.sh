# Shared by tools/demo.sh and tools/bench.sh (source it): a scratch directory, background
# processes that are always stopped, and bounded waits.
#
#   source tools/lib.sh
#   start_bg some-daemon --flag     # remembered in $pids, stopped on exit
#   wait_for "$work/ready" 20       # seconds; fails loudly on timeout
#
# KEEP_WORK=1 keeps the scratch directory (agent logs, per-run rows) after the script.

work=$(mktemp -d /tmp/ferry-run.XXXXXX)
pids=()
on_exit_extra() { :; }   # scripts may redefine it (e.g. to delete network namespaces)
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
  on_exit_extra
}
trap stop_all EXIT

start_bg() { "$@" & pids+=($!); }

wait_for() {  # wait_for FILE SECONDS
  local i
  for i in $(seq 1 $(( ${2:-20} * 20 ))); do [ -e "$1" ] && return 0; sleep 0.05; done
  echo "timed out waiting for $1" >&2
  return 1
}
