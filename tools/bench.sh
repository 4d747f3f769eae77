#!/usr/bin/env bash
# Sets up everything (tools/setup.sh), builds, and runs tp-bench on its built-in
# default block. Extra arguments go to tp-bench (see `tools/bench.sh --help`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
"$root/tools/setup.sh"
exec "${TP_BUILD_DIR:-build}/benchmarks/tp-bench" "$@"
