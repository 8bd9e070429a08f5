# Sourced by the scripts that run Go: puts the toolchain tools/setup.sh fetched (only
# where the machine's Go is older than 1.24) first on PATH.
_ferry_go=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/go/toolchain/bin
[ -x "$_ferry_go/go" ] && export PATH="$_ferry_go:$PATH"
unset _ferry_go
go_is_new_enough() {
  local v
  v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  [ -n "$v" ] && [ "$(printf '%s\n' 1.24 "$v" | sort -V | head -n 1)" = 1.24 ]
}
