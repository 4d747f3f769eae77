#!/usr/bin/env bash
# The stale-name check: every repository file that a comment, a doc or a script names
# (`comm/communicator.cpp`, `src/quant/fp8/cpu_kernels.h`, `tools/setup.sh`, or a bare
# `shared_memory.cpp`) still exists. A file moved or renamed leaves such mentions
# behind, and nothing else notices: they are in comments, which no compiler reads.
#
#   tools/check_stale_names.sh     # exit 0 and one line when clean; else every stale mention, exit 1
#
# Scanned: the tracked (and new, unignored) files under src/ include/ tests/ benchmarks/
# python/ python_bindings/ examples/ tools/ docs/ cmake/, README.md and CMakeLists.txt;
# not benchmarks/RESULTS.md, a dated log whose entries name the files of their day.
# A name with a directory is found if it is a repository file relative to the root, to
# src/, include/, include/tp/ or tests/ (how includes and comments name files), to the
# mentioning file's folder, or as the tail of some repository path (`all_reduce/table.cpp`);
# a bare name if some repository file has it.
# Not checked: URLs, absolute and home paths, names with a placeholder (`quant/<family>/`,
# `*_avx2.cpp`, `_avx512.cpp` after a slash), #include <...>, names under another
# project's folders (torch/, c10/, vllm/, site-packages/, ...) and the few other projects'
# bare names listed below (`not_ours`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
exec python3 - <<'PY'
import os, re, subprocess, sys

out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                     check=True, capture_output=True).stdout.decode()
files = sorted({f for f in out.split("\0") if f and os.path.isfile(f)})
known = set(files)
tails = set()  # every path suffix that starts at a '/' boundary
for f in files:
    parts = f.split("/")
    for i in range(1, len(parts)):
        tails.add("/".join(parts[i:]))

scan_dirs = ("src/", "include/", "tests/", "benchmarks/", "python/", "python_bindings/", "examples/",
             "tools/", "docs/", "cmake/")
skip = {"benchmarks/RESULTS.md"}
scanned = [f for f in files
           if (f.startswith(scan_dirs) or f in ("README.md", "CMakeLists.txt"))
           and f not in skip and not f.startswith("tests/fuzz/corpus/")]

exts = "h|hpp|cpp|cu|cuh|py|sh|cmake|md"
# A path with at least one directory, not glued to a longer path or word on either side
# (so /usr/..., ~/..., https://... and <placeholder>/... never start a match).
path_re = re.compile(r"(?<![\w./<>*{}~$@%-])((?:[\w+-][\w.+-]*/)+[\w.+-]+\.(?:" + exts + r"))(?![\w/*{}-]|\.\w)")
# Bare names: not .cmake (CMake's package files are generated: tpConfig.cmake), and not
# `_avx512.cpp`, the tail of a name shortened after a slash.
bare_re = re.compile(r"(?<![\w./<>*{}~$@%-])([^\W_][\w+-]*\.(?:" + exts.replace("|cmake", "") + r"))(?![\w/*{}-]|\.\w)")
url_re = re.compile(r"\b[a-z][\w+.-]*://\S+")
var_re = re.compile(r"\$\{?\w+\}?/")   # ${PROJECT_SOURCE_DIR}/tools/check_layers.sh, "$root"/tools/...
include_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]*)[>"]')
# Other projects' trees: a name under one of them that is no file here is theirs.
external = re.compile(r"^(ATen|c10|c10d|caffe2|torch|pybind11|catch2|gloo|cuda|cub|thrust|cutlass|nccl|cublas"
                      r"|options|aten|Caffe2|vllm|transformers|safetensors|compressed_tensors|llmcompressor"
                      r"|auto_gptq|gptqmodel|awq|site-packages|dist-packages|usr|lib)(/|$)")
# Bare names that are other projects' (or a project's name, or the user's own script).
not_ours = {"llama.cpp", "nccl.h", "mkl_cblas.h", "catch.hpp", "Logging.h",
            "snake_case.h", "mlp.py"}
basenames = {os.path.basename(f) for f in files}

def found(name, mentioned_in):
    here = os.path.dirname(mentioned_in)
    for base in ("", "src/", "include/", "include/tp/", "tests/"):
        if os.path.normpath(base + name) in known:
            return True
    if os.path.normpath(os.path.join(here, name)) in known:
        return True
    return name.lstrip("./") in tails

stale, checked = [], 0
for f in scanned:
    try:
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
    except (UnicodeDecodeError, OSError):
        continue  # binary
    for n, line in enumerate(text.splitlines(), 1):
        inc = include_re.match(line)
        if inc and inc.group(1) == "<":
            continue
        line = var_re.sub(" ", url_re.sub(" ", line))
        for m in path_re.finditer(line):
            name = m.group(1)
            if "site-packages/" in name or "dist-packages/" in name:
                continue
            checked += 1
            if found(name, f) or external.match(name):
                continue
            stale.append(f"{f}:{n}: names missing {name}")
        for m in bare_re.finditer(line):
            name = m.group(1)
            checked += 1
            if name not in basenames and name not in not_ours:
                stale.append(f"{f}:{n}: names missing {name}")

if stale:
    print("\n".join(stale), flush=True)
    print(f"check_stale_names: {len(stale)} of {checked} file names in {len(scanned)} files name no repository file",
          file=sys.stderr)
    sys.exit(1)
print(f"check_stale_names: {checked} file names in {len(scanned)} files, every one a repository file")
PY
