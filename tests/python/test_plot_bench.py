"""benchmarks/plot_bench.py: tp-bench's JSON -> a PNG of time vs M per TP size."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "plot_bench.py")


def _results():
    out = []
    for row in ("qkv", "o", "gate_up", "down", "block"):
        for tp in (1, 2, 4):
            for m in (1, 16, 256):
                out.append(dict(row=row, format="none", dtype="float32", allreduce="auto", tp=tp, m=m,
                                tp_ms=m * 0.1 / tp + 1.0, ref_ms=m * 0.1 + 1.0))
    out.append(dict(out[0], format="int4_gptq:g128:sym"))  # another setting: not plotted by default
    return out


def test_plot_bench_writes_a_png(tmp_path):
    data = {"settings": dict(machine="test machine", preset="default", hidden=2048, intermediate=5632,
                             device="cpu"), "loads": [], "results": _results()}
    src, png = tmp_path / "bench.json", tmp_path / "bench.png"
    src.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, SCRIPT, str(src), str(png)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 0 < png.stat().st_size < 200_000


def test_plot_bench_refuses_a_setting_that_is_not_there(tmp_path):
    data = {"settings": {}, "loads": [], "results": _results()}
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, SCRIPT, str(src), str(tmp_path / "x.png"), "--format", "fp8_block"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "no results for" in proc.stderr
