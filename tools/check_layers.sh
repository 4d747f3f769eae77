#!/usr/bin/env bash
# The layering check: every #include in src/ and include/tp/ stays on an edge that
# docs/DESIGN.md §2 allows, src/CMakeLists.txt declares exactly those edges, public
# headers include no CUDA / cuBLASLt / NCCL header, and the shard area no torch.
#
#   tools/check_layers.sh        # exit 0 and one line when clean; else every violation, exit 1
#
# The build enforces the same edges (an area sees only the headers of the areas it
# declares); this check also covers headers no build compiles (CUDA-only files on a
# machine without CUDA) and says which rule an include breaks.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec python3 - "$root" <<'PY'
import os, re, sys

root = sys.argv[1]
errors = []

def read(path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()

# 1. The edges, from the block in docs/DESIGN.md between the layering markers.
design = read("docs/DESIGN.md")
m = re.search(r"<!-- layering:begin -->(.*?)<!-- layering:end -->", design, re.S)
if not m:
    sys.exit("check_layers: docs/DESIGN.md has no <!-- layering:begin --> ... <!-- layering:end --> block")
edges = {}
for line in m.group(1).splitlines():
    line = line.strip().strip("`")
    mm = re.match(r"^([a-z_]+)\s*->\s*(.*)$", line)
    if mm:
        deps = mm.group(2).split()
        edges[mm.group(1)] = [] if deps == ["(nothing)"] else deps
if not edges:
    sys.exit("check_layers: the layering block of docs/DESIGN.md lists no edges")
areas = set(edges)

# 2. src/CMakeLists.txt declares the same edges.
cmake = read("src/CMakeLists.txt")
declared = {}
for mm in re.finditer(r"^tp_area\((\w+)([^)]*)\)", cmake, re.M):
    args = mm.group(2).split()
    declared[mm.group(1)] = args[args.index("DEPS") + 1:] if "DEPS" in args else []
for a in sorted(areas | set(declared)):
    if a not in declared:
        errors.append(f"src/CMakeLists.txt: no tp_area({a} ...) for DESIGN.md's area '{a}'")
    elif a not in edges:
        errors.append(f"src/CMakeLists.txt: tp_area({a}) is not an area of DESIGN.md's layering block")
    elif sorted(declared[a]) != sorted(edges[a]):
        errors.append(f"src/CMakeLists.txt: tp_area({a}) DEPS {' '.join(declared[a]) or '(none)'}, "
                      f"but docs/DESIGN.md allows {' '.join(edges[a]) or '(nothing)'}")

# 3. Every include of src/<area>/** and include/tp/<area>/** on an allowed edge.
public_forbidden = re.compile(r"^(cuda|cublas|nccl|cudnn|curand|cusparse|thrust/|cub/|c10/cuda/|ATen/cuda/)")
torch_headers = re.compile(r"^(ATen/|torch/|c10/|caffe2/)")
include_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
sources = []
for top, prefix in (("src", ""), ("include/tp", "tp/")):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for name in files:
            if not re.search(r"\.(h|cpp|cu|cuh)$", name):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            parts = os.path.relpath(rel, top).split(os.sep)
            if len(parts) < 2:
                if rel != "include/tp/tp.h":
                    errors.append(f"{rel}: outside every area (put it in src/<area>/ or include/tp/<area>/)")
                continue
            sources.append((rel, parts[0], top == "include/tp"))
for rel, area, public in sorted(sources):
    if area not in areas:
        errors.append(f"{rel}: '{area}' is not an area of docs/DESIGN.md's layering block")
        continue
    allowed = [area] + edges[area]
    for lineno, line in enumerate(read(rel).splitlines(), 1):
        mm = include_re.match(line)
        if not mm:
            continue
        quote, path = mm.groups()
        where = f"{rel}:{lineno}: #include {quote}{path}{'>' if quote == '<' else quote}"
        if quote == "<":
            if public and public_forbidden.match(path):
                errors.append(f"{where}: a public header includes a CUDA/NCCL/cuBLASLt header (keep those in src/)")
            if area == "shard" and torch_headers.match(path):
                errors.append(f"{where}: the shard area has no torch (docs/DESIGN.md §2)")
            continue
        if path == "tp/tp.h":
            errors.append(f"{where}: the umbrella header is for users; include the concept's header")
            continue
        target = path.split("/")[1] if path.startswith("tp/") else path.split("/")[0]
        if target not in areas:
            continue  # a sibling file included without a path (none today), or a generated header
        if public and not path.startswith("tp/"):
            errors.append(f"{where}: a public header includes a private one")
        elif target not in allowed:
            errors.append(f"{where}: {area} may include only {', '.join(allowed)} (docs/DESIGN.md §2)")

# 4. The rooms inside an area (docs/DESIGN.md's rooms block): a file in room R (its folder
#    below src/ or include/tp/, e.g. layers/moe) includes from another room of the same area
#    only those R lists; a line naming one file gives that file its own list.
m = re.search(r"<!-- rooms:begin -->(.*?)<!-- rooms:end -->", design, re.S)
rooms = {}
if m:
    for line in m.group(1).splitlines():
        mm = re.match(r"^\s*`?([a-z_/.]+)\s*->\s*([^`(]*)", line)
        if mm:
            rooms[mm.group(1)] = mm.group(2).split()
room_names = {r for r in rooms if not r.endswith((".cpp", ".h"))}
def room_of(path):  # "layers/moe/router.h" -> "layers/moe"; "layers/row_parallel_linear.h" -> "layers"
    parts = path.split("/")[:-1]
    while parts and "/".join(parts) not in room_names:
        parts.pop()
    return "/".join(parts)
for rel, area, public in sorted(sources):
    inner = os.path.relpath(rel, "include/tp" if public else "src")
    mine = room_of(inner)
    if not mine:
        continue
    allowed = rooms.get(inner, rooms[mine])
    for lineno, line in enumerate(read(rel).splitlines(), 1):
        mm = include_re.match(line)
        if not mm or mm.group(1) == "<":
            continue
        path = mm.group(2)[3:] if mm.group(2).startswith("tp/") else mm.group(2)
        theirs = room_of(path)
        if theirs and theirs != mine and theirs.split("/")[0] == mine.split("/")[0] and theirs not in allowed:
            errors.append(f"{rel}:{lineno}: #include \"{mm.group(2)}\": room {mine} may include only "
                          f"{', '.join(allowed) or '(no other room)'} of {mine.split('/')[0]} (docs/DESIGN.md §2, rooms)")

# 5. Areas that may include only another area's PUBLIC headers (docs/DESIGN.md's public-only block).
m = re.search(r"<!-- public-only:begin -->(.*?)<!-- public-only:end -->", design, re.S)
for line in (m.group(1).splitlines() if m else []):
    mm = re.match(r"^\s*`?([a-z_]+)\s*->\s*([^`]*)", line)
    if not mm:
        continue
    for rel, area, public in sorted(sources):
        if area != mm.group(1):
            continue
        for lineno, line2 in enumerate(read(rel).splitlines(), 1):
            inc = include_re.match(line2)
            if inc and inc.group(1) == '"' and inc.group(2).split("/")[0] in mm.group(2).split():
                errors.append(f"{rel}:{lineno}: #include \"{inc.group(2)}\": {area} includes only the public headers "
                              f"(tp/...) of {inc.group(2).split('/')[0]} (docs/DESIGN.md §2, public-only)")

if errors:
    print(f"check_layers: {len(errors)} violation(s) of docs/DESIGN.md §2:")
    for e in errors:
        print("  " + e)
    sys.exit(1)
print(f"check_layers: {len(sources)} files in {len(areas)} areas follow docs/DESIGN.md's edges")
PY
