#!/usr/bin/env bash
# Fuzzes the safetensors header and index parser for a bounded time.
#
#   tools/fuzz.sh [SECONDS]     # default 60; builds with clang (libFuzzer, ASan, UBSan)
#
# The parser (src/loader/safetensors_format.cpp) needs no torch, so it is built on
# its own here. The seed corpus tests/fuzz/corpus is read-only input; new inputs go
# to $TP_FUZZ_DIR/corpus (default build-fuzz/), crashes to $TP_FUZZ_DIR/artifacts.
# A finding makes the script fail; reproduce it with
#   build-fuzz/safetensors_header_fuzz build-fuzz/artifacts/crash-...
# and, once fixed, add the input to tests/fuzz/corpus so the CTest replays it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-60}
out=${TP_FUZZ_DIR:-$root/build-fuzz}
cxx=${TP_FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [[ -z "$cxx" ]]; then
  echo "fuzz.sh: clang++ not found (Debian: apt-get install clang)" >&2
  exit 1
fi
mkdir -p "$out/corpus" "$out/artifacts"
bin="$out/safetensors_header_fuzz"
"$cxx" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -I"$root/src" \
  "$root/src/loader/safetensors_format.cpp" "$root/tests/fuzz/safetensors_header_fuzz.cpp" -o "$bin"
echo "[fuzz] $bin for ${seconds}s; corpus $out/corpus (seeds: tests/fuzz/corpus)"
# -max_len: headers of a few KiB exercise every branch; longer inputs only slow it down.
"$bin" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$out/artifacts/" "$out/corpus" "$root/tests/fuzz/corpus"
