#!/usr/bin/env bash
# Sets up everything tp needs on a Debian 12 machine and builds it.
#
#   tools/setup.sh            # idempotent: installs what is missing, builds incrementally
#
# What it does, and why each step is cheap the second time:
#   1. Debian packages (compiler tools, Catch2, gloo headers, clang-format): installed only if missing.
#   2. LibTorch from PyPI's torch wheel, in a virtual environment kept OUTSIDE the clone
#      (default ~/.cache/tp/venv-torch-<version>-py<X.Y>), so a fresh clone (CI) reuses
#      it instead of downloading several GB again; `.venv` in the clone links to it.
#      The torch version comes from requirements.txt, the only place it is pinned.
#   3. CMake configure (once) and an incremental Ninja build in build/, with ccache,
#      including the Python extension (build/python/tp).
#
# Environment: TP_VENV (where the environment lives), TP_BUILD_DIR (default build),
# TP_BUILD_TYPE (default Release), TP_WITH_CUDA (AUTO|ON|OFF), TP_CMAKE_ARGS (extra).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
log() { printf '[setup] %s\n' "$*" >&2; }

# ---- 1. Debian packages -------------------------------------------------------------
debian_packages=(cmake ninja-build ccache g++ lld catch2 libgloo-dev python3-venv python3-dev clang-format)
missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- 2. Python environment with torch -------------------------------------------------
torch_version=$(sed -n 's/^torch==\([^ ;#]*\).*/\1/p' requirements.txt)
[ -n "$torch_version" ] || { log "requirements.txt pins no torch version"; exit 1; }
py_version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
venv=${TP_VENV:-$HOME/.cache/tp/venv-torch-$torch_version-py$py_version}
stamp="$venv/.tp-requirements.sha256"
req_hash=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  log "creating the environment $venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$req_hash" ]; then
  log "installing requirements.txt into $venv (torch $torch_version; pip's cache is reused)"
  "$venv/bin/python" -m pip install -q -r requirements.txt
  echo "$req_hash" > "$stamp"
fi
if [ "$(readlink .venv 2>/dev/null)" != "$venv" ]; then
  rm -rf .venv
  ln -s "$venv" .venv
fi
torch_cmake=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')

# ---- 3. Configure and build ------------------------------------------------------------
build=${TP_BUILD_DIR:-build}
# The Python extension (tp._C) builds with everything else, against the venv's Python
# and torch; tools/test.sh imports it from $build/python.
python_args=(-DTP_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$venv/bin/python")
if [ ! -f "$build/build.ninja" ]; then
  log "configuring $build"
  # shellcheck disable=SC2086
  cmake -S . -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE="${TP_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$torch_cmake" \
    -DTP_WITH_CUDA="${TP_WITH_CUDA:-AUTO}" \
    "${python_args[@]}" \
    ${TP_CMAKE_ARGS:-} >/dev/null
elif ! grep -q '^TP_BUILD_PYTHON:BOOL=ON$' "$build/CMakeCache.txt"; then
  log "enabling the Python bindings in $build"
  cmake "${python_args[@]}" "$build" >/dev/null
fi
log "building $build"
# ccache keys on absolute paths unless told where the tree starts: with a base dir, a
# fresh clone elsewhere (CI) hits the cache that an earlier clone filled.
export CCACHE_BASEDIR="$root"
cmake --build "$build" --parallel "$(nproc)"
