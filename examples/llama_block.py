#!/usr/bin/env python3
"""A Llama-style decoder block from the tp layers, checked against plain PyTorch.

    PYTHONPATH=build/python python examples/llama_block.py --tp 1 2 3 4

For each TP size, starts that many processes (gloo over 127.0.0.1), builds the block
on every rank from one Hugging Face-style state dict (each rank loads only its
shard), runs it, and compares with the same block written in plain PyTorch on the
full weights. The block:

    h   = x + O(attention(RoPE(Q), RoPE(K), V))      Q, K, V = QKV(RMSNorm(x))
    out = h + down(SiLU(gate) * up)                  gate, up = gate_up(RMSNorm(h))

Split states: x and h are mirrored on every rank; Q/K/V and gate/up are split by
heads / intermediate columns; O and down produce partial sums reduced over ranks.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import tp

CONFIG = dict(hidden=64, heads=8, kv_heads=4, head_dim=8, intermediate=96, seq=7, batch=2, eps=1e-6, theta=10000.0)


def hf_state_dict(cfg, seed=0):
    """Global weights under Llama's Hugging Face names."""
    g = torch.Generator().manual_seed(seed)
    h, q, kv, i = cfg["hidden"], cfg["heads"] * cfg["head_dim"], cfg["kv_heads"] * cfg["head_dim"], cfg["intermediate"]

    def w(*shape):
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    p = "model.layers.0."
    return {
        p + "input_layernorm.weight": 1 + 0.1 * torch.randn(h, generator=g),
        p + "self_attn.q_proj.weight": w(q, h),
        p + "self_attn.k_proj.weight": w(kv, h),
        p + "self_attn.v_proj.weight": w(kv, h),
        p + "self_attn.o_proj.weight": w(h, q),
        p + "post_attention_layernorm.weight": 1 + 0.1 * torch.randn(h, generator=g),
        p + "mlp.gate_proj.weight": w(i, h),
        p + "mlp.up_proj.weight": w(i, h),
        p + "mlp.down_proj.weight": w(h, i),
    }


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x, theta):
    """Rotary embedding on [batch, heads, seq, head_dim] (the rotate-half form)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    cos, sin = (f(torch.cat([angles, angles], -1)).to(x.dtype) for f in (torch.cos, torch.sin))
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(q, k, v, batch, seq, n_q, n_kv, head_dim, theta):
    """[b, s, n*d] projections -> causal GQA attention output [b, s, n_q*d]."""
    q = rope(q.view(batch, seq, n_q, head_dim).transpose(1, 2), theta)
    k = rope(k.view(batch, seq, n_kv, head_dim).transpose(1, 2), theta)
    v = v.view(batch, seq, n_kv, head_dim).transpose(1, 2)
    k, v = k.repeat_interleave(n_q // n_kv, 1), v.repeat_interleave(n_q // n_kv, 1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(batch, seq, n_q * head_dim)


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class TPDecoderBlock(nn.Module):
    """The decoder block, tensor-parallel over `group` (None: the default group)."""

    def __init__(self, cfg, group=None, quant=None):
        """``quant``: a format name for the four projections (e.g. "int8_w8a8"), or None."""
        super().__init__()
        self.cfg = cfg
        h, d = cfg["hidden"], cfg["head_dim"]
        self.input_layernorm = RMSNorm(h, cfg["eps"])
        self.qkv = tp.QKVParallelLinear(h, d, cfg["heads"], cfg["kv_heads"], group=group, quant=quant)
        # O owns exactly this rank's query heads, even when heads split unevenly.
        self.o_proj = tp.RowParallelLinear(cfg["heads"] * d, h, bias=False, split=self.qkv.attention_output_split(),
                                           group=group, quant=quant)
        self.post_attention_layernorm = RMSNorm(h, cfg["eps"])
        self.gate_up = tp.GateUpParallelLinear(h, cfg["intermediate"], group=group, quant=quant)
        self.down_proj = tp.RowParallelLinear(cfg["intermediate"], h, bias=False, group=group, quant=quant)

    def load_hf(self, state_dict, prefix):
        """Each rank reads only its shard of the projections; the norms are whole."""
        ckpt = tp.Checkpoint(state_dict)
        self.qkv.load_weights(ckpt, prefix + "self_attn")
        self.o_proj.load_weights(ckpt, prefix + "self_attn.o_proj")
        self.gate_up.load_weights(ckpt, prefix + "mlp")
        self.down_proj.load_weights(ckpt, prefix + "mlp.down_proj")
        with torch.no_grad():
            self.input_layernorm.weight.copy_(state_dict[prefix + "input_layernorm.weight"])
            self.post_attention_layernorm.weight.copy_(state_dict[prefix + "post_attention_layernorm.weight"])

    def forward(self, x):
        cfg, (b, s, _) = self.cfg, x.shape
        q, k, v = self.qkv.split(self.qkv(self.input_layernorm(x)))
        a = attention(q, k, v, b, s, self.qkv.local_q_heads, self.qkv.local_kv_heads, cfg["head_dim"], cfg["theta"])
        h = x + self.o_proj(a)
        gate, up = self.gate_up.split(self.gate_up(self.post_attention_layernorm(h)))
        return h + self.down_proj(F.silu(gate) * up)


def reference_block(x, sd, prefix, cfg):
    """The same block in plain PyTorch on the full weights."""
    w = lambda name: sd[prefix + name]  # noqa: E731
    b, s, _ = x.shape
    hx = rms_norm(x, w("input_layernorm.weight"), cfg["eps"])
    q, k, v = (F.linear(hx, w(f"self_attn.{n}_proj.weight")) for n in "qkv")
    a = attention(q, k, v, b, s, cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["theta"])
    h = x + F.linear(a, w("self_attn.o_proj.weight"))
    hm = rms_norm(h, w("post_attention_layernorm.weight"), cfg["eps"])
    gated = F.silu(F.linear(hm, w("mlp.gate_proj.weight"))) * F.linear(hm, w("mlp.up_proj.weight"))
    return h + F.linear(gated, w("mlp.down_proj.weight"))


def run_rank(rank, world, port, cfg, tol):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sd = hf_state_dict(cfg)
        x = torch.randn(cfg["batch"], cfg["seq"], cfg["hidden"], generator=torch.Generator().manual_seed(1))
        block = TPDecoderBlock(cfg)
        block.load_hf(sd, "model.layers.0.")
        with torch.no_grad():
            y = block(x)
        err = (y - reference_block(x, sd, "model.layers.0.", cfg)).abs().max().item()
        errs = [None] * world
        dist.all_gather_object(errs, err)
        if rank == 0:
            print(f"TP={world}: max |tp block - plain PyTorch block| = {max(errs):.2e} over ranks "
                  f"(local q/kv heads on rank 0: {block.qkv.local_q_heads}/{block.qkv.local_kv_heads})", flush=True)
        if max(errs) > tol:
            raise AssertionError(f"TP={world} rank {rank}: error {err:.3g} exceeds {tol:g}")
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 3, 4], help="TP sizes to run (default 1 2 3 4)")
    parser.add_argument("--kv-heads", type=int, default=CONFIG["kv_heads"], help="KV heads (GQA), default 4")
    parser.add_argument("--tol", type=float, default=1e-4, help="max abs error allowed (float32)")
    args = parser.parse_args(argv)
    cfg = dict(CONFIG, kv_heads=args.kv_heads)
    for world in args.tp:
        mp.start_processes(run_rank, args=(world, free_port(), cfg, args.tol), nprocs=world, start_method="spawn")
    print("ok: the tp block matches the plain PyTorch block at TP " + ", ".join(map(str, args.tp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
