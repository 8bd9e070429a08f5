#!/usr/bin/env bash
# Checks that every C++ and CUDA file of the tree is formatted as .clang-format says
# (clang-format 14, Debian 12's). Ends PASSED or FAILED.
#   tools/check_format.sh           check, listing the files that differ (also as
#                                   `bazel test //tools:check_format`, which tools/test.sh runs)
#   tools/check_format.sh --fix     rewrite them in place
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the checkout, also from Bazel's runfiles
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' | grep -v '^tools/cuda/include/')
if [ "${1:-}" = "--fix" ]; then
  clang-format-14 -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format-14 --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -eq 0 ]; then
  echo "format: ${#files[@]} files as .clang-format says"
  echo "format check: PASSED"
  exit 0
fi
echo "format: ${#bad[@]} of ${#files[@]} files differ from .clang-format (fix: tools/check_format.sh --fix):"
printf '  %s\n' "${bad[@]}"
clang-format-14 --dry-run "${bad[0]}" 2>&1 | head -n 20
echo "format check: FAILED"
exit 1
