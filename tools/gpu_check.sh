#!/usr/bin/env bash
# The GPU check: on a GPU machine whose python3 has torch (2.11, CUDA 13), nvcc and
# CMake, but no network and no Debian -dev packages, build tp against that torch,
# run every test (the [cuda] ones included), tp-gpu-bench (the GEMM formats against
# at::linear / at::_scaled_mm and the machine's ceilings) and tp-bench on the GPU,
# and print one short table last. Header-only dependencies come from .header-deps/
# (made by tools/pack_deps.sh on a machine with Debian's packages, copied along).
# Every step has a time limit, so the whole check stays under 8 minutes.
#
#   tools/gpu_check.sh LOG_DIR
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
logs=$(mkdir -p "${1:-gpu_logs}" && cd "${1:-gpu_logs}" && pwd)
cd "$root"
build=build-gpu
start=$(date +%s)
status=()
step() {  # step NAME LOG LIMIT_S command...: runs, records ok/FAILED/TIMEOUT and the seconds taken
  local name=$1 log=$2 limit=$3 t0=$SECONDS rc verdict
  shift 3
  timeout --kill-after=10 "$limit" "$@" >"$logs/$log" 2>&1
  rc=$?
  verdict=$([ $rc -eq 0 ] && echo ok || { [ $rc -eq 124 ] && echo TIMEOUT || echo FAILED; })
  status+=("$(printf '%-30s %-7s %5ss  %s' "$name" "$verdict" $((SECONDS - t0)) "$log")")
  return $rc
}

python3 - >"$logs/machine.txt" 2>&1 <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$logs/machine.txt" 2>&1
torch_cmake=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
generator=("-G" "Unix Makefiles"); command -v ninja >/dev/null && generator=("-G" "Ninja")
jobs=$(nproc)

# The Python bindings are left out (pybind11 comes from torch, but the GPU machine
# need not have Python headers); everything else, CUDA included, is built.
step "configure (TP_WITH_CUDA=ON)" configure.log 120 \
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_cmake" \
        -DTP_HEADER_DEPS_DIR="$root/.header-deps" -DTP_WITH_CUDA=ON -DTP_BUILD_PYTHON=OFF -DTP_PYTHON="$(command -v python3)" &&
step "build" build.log 300 cmake --build "$build" --parallel "$jobs" &&
{
  step "tp_tests [cuda]" cuda_tests.log 150 "$build/tests/tp_tests" "[cuda]" --durations yes
  step "tp-gpu-bench" gpu_bench.log 120 "$build/benchmarks/tp-gpu-bench" --seconds 0.15
  step "ctest (CPU tests)" ctest.log 120 ctest --test-dir "$build" --output-on-failure --timeout 100 -j 8 -LE cuda
  step "tp-bench cuda bf16" bench_cuda.log 60 \
    "$build/benchmarks/tp-bench" --device cuda --dtype bfloat16 --tp 1,2 --m 1,16,4096 --seconds 0.2
}

echo "== machine"; cat "$logs/machine.txt"
echo "== tests"
grep -hE "^(All tests passed|test cases:)|tests passed|tests failed" "$logs/cuda_tests.log" "$logs/ctest.log" 2>/dev/null | tail -n 4
echo "== tp-bench (cuda, bf16; TP layers vs at::linear)"; sed -n '/^== /,$p' "$logs/bench_cuda.log" 2>/dev/null | head -n 40
echo "== tp-gpu-bench (GEMM formats; full log: $logs/gpu_bench.log)"
grep -E "^ceilings|^shape|^---|^[0-9]+x[0-9]+|^vs ref" "$logs/gpu_bench.log" 2>/dev/null
echo "== steps ($(( $(date +%s) - start )) s in all; logs in $logs)"
printf '%s\n' "${status[@]}"
! printf '%s\n' "${status[@]}" | grep -qE "FAILED|TIMEOUT"
