"""examples/llama_block.py: the tp decoder block vs plain PyTorch at TP 1-4 over gloo."""

import os
import subprocess
import sys

import tp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_llama_block_example_matches_plain_pytorch():
    env = dict(os.environ)
    # The example's processes import the same tp as this test.
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(tp.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "llama_block.py"), "--tp", "1", "2", "3", "4"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for world in (1, 2, 3, 4):
        assert f"TP={world}: max |tp block - plain PyTorch block|" in proc.stdout, proc.stdout
    assert "ok: the tp block matches the plain PyTorch block at TP 1, 2, 3, 4" in proc.stdout
