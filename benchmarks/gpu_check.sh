#!/usr/bin/env bash
# The GPU check: on a GPU machine whose python3 has torch (2.11, CUDA 13), nvcc and
# CMake, but no network and no Debian -dev packages, build tp against that torch,
# run every test (the [cuda] ones included) and tp-bench on the GPU, and print one
# short table last. Header-only dependencies come from .deps/ (tools/pack_deps.sh).
#
#   benchmarks/gpu_check.sh LOG_DIR
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
logs=$(mkdir -p "${1:-gpu_logs}" && cd "${1:-gpu_logs}" && pwd)
cd "$root"
build=build-gpu
start=$(date +%s)
status=()
step() {  # step NAME LOG command...: runs, records ok/FAILED and the seconds taken
  local name=$1 log=$2 t0=$SECONDS rc
  shift 2
  "$@" >"$logs/$log" 2>&1
  rc=$?
  status+=("$(printf '%-28s %-7s %5ss  %s' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAILED)" $((SECONDS - t0)) "$log")")
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

step "configure (TP_WITH_CUDA=ON)" configure.log \
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_cmake" \
        -DTP_DEPS_DIR="$root/.deps" -DTP_WITH_CUDA=ON -DTP_PYTHON="$(command -v python3)" &&
step "build" build.log cmake --build "$build" --parallel "$(nproc)" &&
{
  step "ctest (all, GPU included)" ctest.log \
    ctest --test-dir "$build" --output-on-failure --timeout 600 -j 8
  step "tp_tests [cuda]" cuda_tests.log "$build/tests/tp_tests" "[cuda]" --durations yes
  step "tp-bench cuda bf16" bench_cuda.log \
    "$build/benchmarks/tp-bench" --device cuda --dtype bfloat16 --tp 1,2 --m 1,16,256,4096 --seconds 0.3
}

echo "== machine"; cat "$logs/machine.txt"
echo "== tests";  grep -hE "tests passed|tests failed|assertions|test cases" "$logs/ctest.log" "$logs/cuda_tests.log" 2>/dev/null | tail -n 4
echo "== tp-bench (cuda, bf16)"; sed -n '/^== /,$p' "$logs/bench_cuda.log" 2>/dev/null
echo "== steps ($(( $(date +%s) - start )) s in all; logs in $logs)"
printf '%s\n' "${status[@]}"
! printf '%s\n' "${status[@]}" | grep -q FAILED
