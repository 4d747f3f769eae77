#!/usr/bin/env bash
# Copies the header-only build dependencies (Catch2 and its CMake files, gloo's
# headers) from this machine's Debian packages into .header-deps/ (git-ignored), so
# that the tree builds on a machine without Debian's -dev packages (a GPU machine with
# only torch, nvcc and CMake): copy the folder along, and CMake looks there first
# (TP_HEADER_DEPS_DIR).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps="$root/.header-deps"
for p in catch2 libgloo-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { echo "pack_deps: Debian package $p is missing (tools/setup.sh installs it)" >&2; exit 1; }
done
rm -rf "$deps"
mkdir -p "$deps/include" "$deps/lib/cmake"
cp -r /usr/include/catch2 "$deps/include/"
cp -r /usr/lib/cmake/Catch2 "$deps/lib/cmake/"
# Catch2Targets.cmake checks that the library it declares exists (we use only the header).
cp /usr/lib/libCatch2WithMain.a "$deps/lib/"
cp -r /usr/include/gloo "$deps/include/"
du -sh "$deps"
