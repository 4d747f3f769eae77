"""The problem both sides of the vLLM-CPU comparison measure, without vLLM: tp-bench's shapes and
rows, the same global random weights and inputs in every process (one seed per tensor), and the
float64 reference of the block's chain. Imported by vllm_cpu_bench.py (the driver and each of its
worker processes); torch is passed in or imported late, so the driver can read the shapes before
it starts torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRESETS = {
    # From each model's config.json, as tp-bench's presets (benchmarks/layer_bench.cpp).
    "default": (2048, 5632, 16, 4, 128),
    "llama3-8b": (4096, 14336, 32, 8, 128),
    "llama3-70b": (8192, 28672, 64, 8, 128),
    "qwen3-32b": (5120, 25600, 64, 8, 128),
}
ROWS = ("qkv", "o", "gate_up", "down", "block")
BLOCK_DESCRIPTION = (
    "qkv -> Q (standing in for the attention output: no attention math, norms or residuals) -> o -> "
    "AllReduce -> gate_up -> SiLU(gate)*up -> down -> AllReduce"
)
REL_ERR_BOUND = 1e-4  # float32, as tp-bench's bound


@dataclass
class Shape:
    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


# ---- the same global weights and inputs in every process ---------------------------------------

# Each tensor has its own seed, so a process can make one weight at a time and drop it.
WEIGHTS = ("q", "k", "v", "o", "gate", "up", "down")


def weight_shape(s: Shape, name: str) -> tuple[int, int]:
    return {
        "q": (s.q, s.hidden),
        "k": (s.kv, s.hidden),
        "v": (s.kv, s.hidden),
        "o": (s.hidden, s.q),
        "gate": (s.intermediate, s.hidden),
        "up": (s.intermediate, s.hidden),
        "down": (s.hidden, s.intermediate),
    }[name]


def make_weight(torch, s: Shape, name: str, seed: int):
    out, inp = weight_shape(s, name)
    g = torch.Generator().manual_seed(seed * 1000 + WEIGHTS.index(name))
    return torch.randn(out, inp, generator=g, dtype=torch.float32) / math.sqrt(inp)


def make_hidden(torch, s: Shape, m: int, seed: int):
    g = torch.Generator().manual_seed(seed * 1000 + 500 + m)
    return torch.randn(m, s.hidden, generator=g, dtype=torch.float32)


# ---- the float64 reference (one process, all threads, torch only) ------------------------------


def compute_reference(s: Shape, tokens: list[int], seed: int) -> dict:
    """The block's chain per M in float64 from the same global weights, rounded to float32 between
    the layers (as the layers' own outputs are). The rows' inputs are the chain's intermediates:
    qkv reads x, o reads Q, gate_up reads o's output, down reads SiLU(gate)*up; so every row's
    expected output is one step of the chain and the block's is its end, for the cost of one chain.
    Returns {"inputs": {M: {hidden, attn, h, inter}} (float32), "expected": {(row, M): float64}},
    qkv = [Q|K|V] over all heads, gate_up = [gate|up] over the whole intermediate dim."""
    import torch

    torch.set_grad_enabled(False)
    F = torch.nn.functional
    inputs = {m: {"hidden": make_hidden(torch, s, m, seed)} for m in tokens}
    acts: dict = {m: {} for m in tokens}
    # One weight at a time in float64 (Llama-3-8B's gate is 470 MB in float64), in chain order.
    for name in WEIGHTS:
        w = make_weight(torch, s, name, seed).double()
        for m in tokens:
            x, a = inputs[m], acts[m]
            if name in ("q", "k", "v"):
                a[name] = F.linear(x["hidden"].double(), w)
                if name == "q":
                    x["attn"] = a["q"].float()  # o's input: Q, the attention stand-in
            elif name == "o":
                a["o"] = F.linear(x["attn"].double(), w)
                x["h"] = a["o"].float()  # gate_up's input in the block
            elif name in ("gate", "up"):
                a[name] = F.linear(x["h"].double(), w)
                if name == "up":
                    x["inter"] = (F.silu(a["gate"]) * a["up"]).float()  # down's input
            else:
                a["down"] = F.linear(x["inter"].double(), w)
        del w
    expected = {}
    for m in tokens:
        a = acts[m]
        expected[("qkv", m)] = torch.cat([a["q"], a["k"], a["v"]], -1)
        expected[("o", m)] = a["o"]
        expected[("gate_up", m)] = torch.cat([a["gate"], a["up"]], -1)
        expected[("down", m)] = a["down"]
        expected[("block", m)] = a["down"]
    return {"inputs": inputs, "expected": expected}
