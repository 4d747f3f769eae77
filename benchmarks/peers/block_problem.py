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
# tp-bench's bounds on rel_err (benchmarks/layer_bench.cpp, error_bound): unquantized float32 / bfloat16, and quantized
# formats (the activation-quantized ones are checked against unquantized activations).
REL_ERR_BOUNDS = {("none", "float32"): 1e-4, ("none", "bfloat16"): 3e-2, ("quantized", "float32"): 1.5e-2,
                  ("quantized", "bfloat16"): 3e-2}


def rel_err_bound(fmt: str, dtype: str) -> float:
    return REL_ERR_BOUNDS[("none" if fmt == "none" else "quantized", dtype)]


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


def compute_reference(s: Shape, tokens: list[int], seed: int, fmt: str = "none", dtype: str = "float32",
                      act_quant: bool = False, tp: int = 1) -> dict:
    """The block's chain per M in float64 from the same global weights (for a quantized format, the
    float64 weights its checkpoint tensors stand for: quant_formats.dequantized_weight), rounded to
    the run's dtype between the layers (as the layers' own outputs are; the inputs too). With
    act_quant, each layer's input is quantized as the format's kernels do at run time
    (quant_formats.quantize_activation; the row layers o and down per rank slice of TP equal ones),
    so that a chain of activation-quantized layers is held to its own model. The rows'
    inputs are the chain's intermediates:
    qkv reads x, o reads Q, gate_up reads o's output, down reads SiLU(gate)*up; so every row's
    expected output is one step of the chain and the block's is its end, for the cost of one chain.
    Returns {"inputs": {M: {hidden, attn, h, inter}} (in dtype), "expected": {(row, M): float64}},
    qkv = [Q|K|V] over all heads, gate_up = [gate|up] over the whole intermediate dim."""
    import torch

    from quant_formats import dequantized_weight, quantize_activation

    torch.set_grad_enabled(False)
    F = torch.nn.functional
    dt = getattr(torch, dtype)

    def inp(x, parts=1):  # what a layer multiplies: its input, activation-quantized where the kernel does
        return quantize_activation(torch, fmt, x, parts) if act_quant else x.double()
    inputs = {m: {"hidden": make_hidden(torch, s, m, seed).to(dt)} for m in tokens}
    acts: dict = {m: {} for m in tokens}
    # One weight at a time in float64 (Llama-3-8B's gate is 470 MB in float64), in chain order.
    for name in WEIGHTS:
        w = dequantized_weight(torch, fmt, make_weight(torch, s, name, seed), dt)
        for m in tokens:
            x, a = inputs[m], acts[m]
            if name in ("q", "k", "v"):
                a[name] = F.linear(inp(x["hidden"]), w)
                if name == "q":
                    x["attn"] = a["q"].to(dt)  # o's input: Q, the attention stand-in
            elif name == "o":
                a["o"] = F.linear(inp(x["attn"], tp), w)
                x["h"] = a["o"].to(dt)  # gate_up's input in the block
            elif name in ("gate", "up"):
                a[name] = F.linear(inp(x["h"]), w)
                if name == "up":
                    x["inter"] = (F.silu(a["gate"]) * a["up"]).to(dt)  # down's input
            else:
                a["down"] = F.linear(inp(x["inter"], tp), w)
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


def layerwise_errors(s: Shape, seed: int, fmt: str, dtype: str, dumps: list[dict]) -> list[dict]:
    """Per block forward (a dict of its input `hidden`, the global Q `q`, o's output `h`, the global
    SiLU(gate)*up `inter`, the output `y`, and its `tp`), each layer's (rel_err, max_abs_err) against
    the float64 model of that layer applied to the input it got, activation-quantized as the format's
    kernels do (the row layers per rank slice). One weight at a time, as compute_reference."""
    import torch

    from quant_formats import dequantized_weight, quantize_activation

    torch.set_grad_enabled(False)
    F = torch.nn.functional
    dt = getattr(torch, dtype)

    def inp(x, parts=1):
        return quantize_activation(torch, fmt, x.to(dt), parts)

    def err(got, want):
        d = got.double() - want
        return (d.norm().item() / max(want.norm().item(), 1e-300), d.abs().max().item())

    out: list[dict] = [{} for _ in dumps]
    gate: list = [None] * len(dumps)
    for name in ("q", "o", "gate", "up", "down"):
        w = dequantized_weight(torch, fmt, make_weight(torch, s, name, seed), dt)
        for i, d in enumerate(dumps):
            if name == "q":
                out[i]["qkv"] = err(d["q"], F.linear(inp(d["hidden"]), w))
            elif name == "o":
                out[i]["o"] = err(d["h"], F.linear(inp(d["q"], d["tp"]), w))
            elif name == "gate":
                gate[i] = F.linear(inp(d["h"]), w)
            elif name == "up":
                out[i]["gate_up"] = err(d["inter"], F.silu(gate[i]) * F.linear(inp(d["h"]), w))
            else:
                out[i]["down"] = err(d["y"], F.linear(inp(d["inter"], d["tp"]), w))
        del w
    return out
