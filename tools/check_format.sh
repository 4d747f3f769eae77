#!/usr/bin/env bash
# The format check: every tracked C++/CUDA file is as clang-format 14 (Debian 12's,
# tools/setup.sh installs it) formats it with the repository's .clang-format.
#
#   tools/check_format.sh          # lists the files that differ, exit 1 if any
#   tools/check_format.sh --fix    # formats them in place
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cf=$(command -v clang-format-14 || command -v clang-format || true)
[ -n "$cf" ] || { echo "check_format: clang-format not found (Debian: apt-get install clang-format)" >&2; exit 1; }
"$cf" --version | grep -q "version 14\." ||
  { echo "check_format: $("$cf" --version) is not clang-format 14, whose output .clang-format is kept to" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  "$cf" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$cf" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files are not clang-formatted (tools/check_format.sh --fix):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
