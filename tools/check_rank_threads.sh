#!/usr/bin/env bash
# The rank-threads check: no file that runs ranks as threads (run_ranks_in_threads) holds a
# std::vector<bool>. Such a vector packs eight ranks' results into one byte, so ranks writing
# their own entries at once race on the byte and a result is lost now and then: a CHECK that
# passes on one machine fails on another (two CI failures on 2026-12-07). Collect into
# std::vector<int> (or char) instead.
#
#   tools/check_rank_threads.sh     # exit 0 and one line when clean; else every such line, exit 1
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
files=$(git ls-files --cached --others --exclude-standard -- tests benchmarks examples | grep -E '\.(cpp|h)$' |
  xargs grep -l 'run_ranks_in_threads' || true)
bad=$( [ -z "$files" ] || grep -n 'std::vector<bool>' $files || true)
if [ -n "$bad" ]; then
  echo "check_rank_threads: std::vector<bool> in a file whose ranks run as threads (ranks share its bytes):"
  echo "$bad" | sed 's/^/  /'
  exit 1
fi
echo "check_rank_threads: $(echo "$files" | grep -c .) files run ranks as threads, none holds a std::vector<bool>"
