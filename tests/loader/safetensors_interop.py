"""The Python side of the safetensors interop tests (tests/loader/python_interop_test.cpp).

  safetensors_interop.py write DIR   # safetensors.torch.save_file -> DIR/python.safetensors,
                                     # plus each tensor's raw bytes and a manifest for C++ to compare
  safetensors_interop.py check DIR   # loads DIR/cpp.safetensors (written by tp's writer) with
                                     # safetensors.torch.load_file and safe_open, and compares it
                                     # with the raw bytes and manifest C++ wrote beside it
  safetensors_interop.py refuse DIR  # opens every DIR/*.safetensors with safe_open and load_file
                                     # and prints, per file, "accepted NAME" or "refused NAME: why"

Exits 0 when everything matches; otherwise prints what differs and exits 1 (3 when
the safetensors package is missing).
"""
import os
import sys

try:
    import torch
    import safetensors
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the C++ test shows this message
    print(f"safetensors_interop.py: cannot import torch/safetensors ({e}); "
          f"install requirements.txt into {sys.prefix} (tools/setup.sh does)")
    sys.exit(3)

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64,
    "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


def raw(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write(d):
    g = torch.Generator().manual_seed(1234)
    tensors, lines = {}, []
    for i, (name, dtype) in enumerate(DTYPES.items()):
        for shape in [(7, 5), (3, 2, 4), (), (0, 3)]:
            n = 1
            for s in shape:
                n *= s
            if dtype == torch.bool:
                t = torch.randint(0, 2, shape, generator=g).bool()
            else:
                size = torch.empty((), dtype=dtype).element_size()
                t = torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8).view(dtype).reshape(shape)
            key = f"py.{name}.{len(shape)}d" + (".empty" if n == 0 else "")
            tensors[key] = t
            with open(os.path.join(d, key + ".bin"), "wb") as f:
                f.write(raw(t))
            lines.append(f"{key} {name} {','.join(map(str, shape))}")
    save_file(tensors, os.path.join(d, "python.safetensors"), metadata={"writer": "python", "version": safetensors.__version__})
    with open(os.path.join(d, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


def check(d):
    path = os.path.join(d, "cpp.safetensors")
    failures = []
    loaded = load_file(path)
    with open(os.path.join(d, "manifest.txt")) as f:
        manifest = [line.split(" ") for line in f.read().splitlines() if line]
    if sorted(loaded) != sorted(m[0] for m in manifest):
        failures.append(f"names differ: {sorted(loaded)} vs {sorted(m[0] for m in manifest)}")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        if meta != {"writer": "tp", "note": "from C++"}:
            failures.append(f"metadata {meta}")
        for key, dtype_name, shape_text in manifest:
            shape = tuple(int(s) for s in shape_text.split(",") if s)
            with open(os.path.join(d, key + ".bin"), "rb") as b:
                expected = b.read()
            for how, t in (("load_file", loaded.get(key)), ("safe_open", f.get_tensor(key))):
                if t is None or t.dtype != DTYPES[dtype_name] or tuple(t.shape) != shape or raw(t) != expected:
                    failures.append(f"{how}: {key}: got {None if t is None else (t.dtype, tuple(t.shape))}, "
                                    f"expected {DTYPES[dtype_name]} {shape}")
            if len(shape) >= 1 and shape[0] >= 3:  # a slice, as a rank would read it
                sl = f.get_slice(key)[1:3]
                if raw(sl) != raw(f.get_tensor(key)[1:3]):
                    failures.append(f"get_slice: {key}[1:3] differs")
    for line in failures:
        print("MISMATCH", line)
    print(f"safetensors_interop.py check: {len(manifest)} tensors, {len(failures)} mismatches "
          f"(safetensors {safetensors.__version__}, torch {torch.__version__})")
    return 1 if failures else 0


def refuse(d):
    for name in sorted(os.listdir(d)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(d, name)
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    f.get_tensor(key)
                f.metadata()
            load_file(path)
        except Exception as e:  # noqa: BLE001 - any refusal counts; its text is shown
            print(f"refused {name}: {type(e).__name__}: {e}")
        else:
            print(f"accepted {name}")
    print(f"safetensors_interop.py refuse: done (safetensors {safetensors.__version__})")
    return 0


if __name__ == "__main__":
    modes = {"write": write, "check": check, "refuse": refuse}
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        print(__doc__)
        sys.exit(2)
    sys.exit(modes[sys.argv[1]](sys.argv[2]))
