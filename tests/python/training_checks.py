"""Per-rank training checks (run through launcher.py): torch.autograd.gradcheck on the
differentiable collectives, and a small Llama-style block trained with SGD.

gradcheck on a collective: the numerical Jacobian perturbs one input element at a
time, so every rank must run the same number of forwards in lockstep. Each check is
therefore a function of one GLOBAL tensor X, the same on every rank, whose output is
global too (mirrored): X enters the parallel region, each rank computes its part,
and the result is put back together. Every pair of conjugate collectives is on the
path, so a wrong backward on any of them shows up as a wrong Jacobian.
"""

import io
import math
import traceback

import torch
import torch.nn.functional as F
from torch import nn

import tp

DTYPE = torch.float64


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)


def _uneven(total, world, rank_with_none=None):
    """Sizes adding up to total, uneven, one rank possibly holding nothing."""
    sizes = tp.sequence_sizes(total, world)
    if rank_with_none is not None and world > 1:
        moved = sizes[rank_with_none]
        sizes[rank_with_none] = 0
        sizes[(rank_with_none + 1) % world] += moved
    return sizes


def gradcheck_collectives(rank, world):
    """{check: None if gradcheck passed, else the error} for each pair of collectives."""
    r = rank
    coef = (r + 1) / sum(range(1, world + 1))  # rank weights summing to 1: partial sums
    cols = _uneven(7, world, rank_with_none=world - 1)  # [5, 7] split on dim 1, one rank empty
    rows = tp.sequence_sizes(5, world)  # tokens: 5 over 2 or 3
    few = tp.sequence_sizes(2, world)  # 2 tokens over 3: one rank has none
    off_c, off_r = sum(cols[:r]), sum(rows[:r])

    def copy_gather(X):  # f then a column-parallel piece, gathered (its backward splits)
        piece = torch.sin(tp.copy_to_parallel(X))[:, off_c : off_c + cols[r]] * (r + 1)
        return tp.gather_from_parallel(piece, dim=1, sizes=cols)

    def copy_gather_exchanged(X):  # the same with the sizes exchanged, not given
        piece = torch.sin(tp.copy_to_parallel(X))[:, off_c : off_c + cols[r]] * (r + 1)
        return tp.gather_from_parallel(piece, dim=1)

    def copy_reduce(X):  # f then g: every rank's partial sum of a mirrored input
        return tp.reduce_from_parallel(torch.sin(tp.copy_to_parallel(X)) * coef)

    def scatter_gather(X):
        piece = tp.scatter_to_parallel(X, dim=0, sizes=rows)
        return tp.gather_from_parallel(torch.sin(piece) * (r + 1), dim=0, sizes=rows)

    def sequence_pair(tokens):
        def f(X):  # SP region -> column (gather, backward reduce-scatter) -> row (reduce-scatter) -> out
            piece = tp.scatter_to_sequence_parallel(X, dim=0)
            full = tp.gather_from_sequence_parallel(piece, dim=0)
            partial = torch.sin(full) * coef
            mine = tp.reduce_scatter_to_sequence_parallel(partial, dim=0, sizes=tokens)
            return tp.gather_from_parallel(mine, dim=0, sizes=tokens)

        return f

    checks = {
        "copy_to_parallel+gather_from_parallel": (copy_gather, (5, 7)),
        "gather_from_parallel (sizes exchanged)": (copy_gather_exchanged, (5, 7)),
        "copy_to_parallel+reduce_from_parallel": (copy_reduce, (3, 4)),
        "scatter_to_parallel+gather_from_parallel": (scatter_gather, (5, 3)),
        "sequence parallel pair, 5 tokens": (sequence_pair(rows), (5, 3)),
        "sequence parallel pair, 2 tokens": (sequence_pair(few), (2, 3)),
    }
    out = {}
    for i, (name, (fn, shape)) in enumerate(checks.items()):
        X = _randn(100 + i, *shape).requires_grad_(True)
        try:
            torch.autograd.gradcheck(fn, (X,), eps=1e-6, atol=1e-8, rtol=1e-6)
            out[name] = None
        except Exception:  # noqa: BLE001 - reported per check
            out[name] = traceback.format_exc()
            break  # the other ranks may now be out of step: stop here
    return out


# ---- a Llama-style block --------------------------------------------------------------

CONFIG = dict(hidden=16, heads=6, head_dim=4, intermediate=20, batch=2, seq=5, eps=1e-6, lr=0.05, steps=5)
PREFIX = "model.layers.0"


def hf_state_dict(cfg, kv_heads, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, d, i = cfg["hidden"], cfg["head_dim"], cfg["intermediate"]
    q, kv = cfg["heads"] * d, kv_heads * d

    def w(*shape):
        return torch.randn(*shape, generator=g, dtype=DTYPE) / math.sqrt(shape[-1])

    p = PREFIX + "."
    return {
        p + "input_layernorm.weight": 1 + 0.1 * torch.randn(h, generator=g, dtype=DTYPE),
        p + "self_attn.q_proj.weight": w(q, h),
        p + "self_attn.k_proj.weight": w(kv, h),
        p + "self_attn.v_proj.weight": w(kv, h),
        p + "self_attn.q_proj.bias": 0.1 * torch.randn(q, generator=g, dtype=DTYPE),
        p + "self_attn.k_proj.bias": 0.1 * torch.randn(kv, generator=g, dtype=DTYPE),
        p + "self_attn.v_proj.bias": 0.1 * torch.randn(kv, generator=g, dtype=DTYPE),
        p + "self_attn.o_proj.weight": w(h, q),
        p + "post_attention_layernorm.weight": 1 + 0.1 * torch.randn(h, generator=g, dtype=DTYPE),
        p + "mlp.gate_proj.weight": w(i, h),
        p + "mlp.up_proj.weight": w(i, h),
        p + "mlp.down_proj.weight": w(h, i),
        p + "mlp.down_proj.bias": 0.1 * torch.randn(h, generator=g, dtype=DTYPE),
    }


def batch(cfg, step):
    x = _randn(1000 + step, cfg["batch"] * cfg["seq"], cfg["hidden"])
    target = _randn(2000 + step, cfg["batch"] * cfg["seq"], cfg["hidden"])
    return x, target


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class RMSNorm(nn.Module):
    """With sequence_parallel, x is this rank's tokens: the weight (mirrored) enters
    through copy_to_parallel, so its gradient is summed over the ranks' token pieces."""

    def __init__(self, size, eps, sequence_parallel=False):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size, dtype=DTYPE)), eps
        self.sequence_parallel = sequence_parallel

    def forward(self, x):
        weight = tp.copy_to_parallel(self.weight) if self.sequence_parallel else self.weight
        return rms_norm(x, weight, self.eps)


def attention(q, k, v, cfg, q_begin, kv_begin, group):
    """Causal attention per sequence over the local heads (GQA: head h reads KV head h // group).
    q: [tokens, nq*d], k, v: [tokens, nkv*d] with tokens = batch * seq."""
    d, b, s = cfg["head_dim"], cfg["batch"], cfg["seq"]
    nq = q.shape[-1] // d
    if nq == 0:
        return q  # [tokens, 0], still connected to the graph
    qh = q.view(b, s, nq, d).transpose(1, 2)
    kh = k.view(b, s, -1, d).transpose(1, 2)
    vh = v.view(b, s, -1, d).transpose(1, 2)
    index = torch.tensor([(q_begin + i) // group - kv_begin for i in range(nq)])
    out = F.scaled_dot_product_attention(qh, kh[:, index], vh[:, index], is_causal=True)
    return out.transpose(1, 2).reshape(b * s, nq * d)


class Container(nn.Module):
    pass


class TPBlock(nn.Module):
    """The block from tp layers, its tree shaped like Hugging Face's (tp.gather_weights names)."""

    def __init__(self, cfg, kv_heads, sequence_parallel=False):
        super().__init__()
        h, d, sp = cfg["hidden"], cfg["head_dim"], sequence_parallel
        self.cfg, self.kv_heads, self.sp = cfg, kv_heads, sp
        self.input_layernorm = RMSNorm(h, cfg["eps"], sp)
        self.self_attn = Container()
        self.self_attn.qkv_proj = tp.QKVParallelLinear(h, d, cfg["heads"], kv_heads, bias=True, dtype=DTYPE,
                                                       sequence_parallel=sp)
        self.self_attn.o_proj = tp.RowParallelLinear(cfg["heads"] * d, h, bias=False, dtype=DTYPE,
                                                     split=self.self_attn.qkv_proj.attention_output_split(),
                                                     sequence_parallel=sp)
        self.post_attention_layernorm = RMSNorm(h, cfg["eps"], sp)
        self.mlp = Container()
        self.mlp.gate_up_proj = tp.GateUpParallelLinear(h, cfg["intermediate"], dtype=DTYPE, sequence_parallel=sp)
        self.mlp.down_proj = tp.RowParallelLinear(cfg["intermediate"], h, bias=True, dtype=DTYPE,
                                                  sequence_parallel=sp)

    def load_hf(self, sd):
        ckpt = tp.Checkpoint(sd)
        self.self_attn.qkv_proj.load_weights(ckpt, PREFIX + ".self_attn")
        self.self_attn.o_proj.load_weights(ckpt, PREFIX + ".self_attn.o_proj")
        self.mlp.gate_up_proj.load_weights(ckpt, PREFIX + ".mlp")
        self.mlp.down_proj.load_weights(ckpt, PREFIX + ".mlp.down_proj")
        with torch.no_grad():
            self.input_layernorm.weight.copy_(sd[PREFIX + ".input_layernorm.weight"])
            self.post_attention_layernorm.weight.copy_(sd[PREFIX + ".post_attention_layernorm.weight"])

    def forward(self, x):
        """x: [tokens, hidden], or with sequence parallelism this rank's tokens of it."""
        qkv = self.self_attn.qkv_proj
        q, k, v = qkv.split(qkv(self.input_layernorm(x)))
        plan = qkv.head_plan
        a = attention(q, k, v, self.cfg, plan.q_heads.begin, plan.kv_heads.begin, self.cfg["heads"] // self.kv_heads)
        h = x + self.self_attn.o_proj(a)
        gate, up = self.mlp.gate_up_proj.split(self.mlp.gate_up_proj(self.post_attention_layernorm(h)))
        return h + self.mlp.down_proj(F.silu(gate) * up)


def reference_training(cfg, kv_heads):
    """The same block in plain torch on one process: (losses, final state dict)."""
    sd = hf_state_dict(cfg, kv_heads)
    params = {k: v.clone().requires_grad_(True) for k, v in sd.items()}
    p = lambda name: params[PREFIX + "." + name]  # noqa: E731
    losses = []
    for step in range(cfg["steps"]):
        x, target = batch(cfg, step)
        n1 = rms_norm(x, p("input_layernorm.weight"), cfg["eps"])
        q, k, v = (F.linear(n1, p(f"self_attn.{n}_proj.weight"), p(f"self_attn.{n}_proj.bias")) for n in "qkv")
        h = x + F.linear(attention(q, k, v, cfg, 0, 0, cfg["heads"] // kv_heads), p("self_attn.o_proj.weight"))
        n2 = rms_norm(h, p("post_attention_layernorm.weight"), cfg["eps"])
        gated = F.silu(F.linear(n2, p("mlp.gate_proj.weight"))) * F.linear(n2, p("mlp.up_proj.weight"))
        out = h + F.linear(gated, p("mlp.down_proj.weight"), p("mlp.down_proj.bias"))
        loss = ((out - target) ** 2).sum() / out.numel()
        for t in params.values():
            t.grad = None
        loss.backward()
        with torch.no_grad():
            for t in params.values():
                t -= cfg["lr"] * t.grad
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in params.items()}


def train_block(rank, world, kv_heads, sequence_parallel):
    """Trains the TP block for cfg['steps'] SGD steps; returns (losses, gathered weights)."""
    cfg = CONFIG
    torch.manual_seed(123)
    block = TPBlock(cfg, kv_heads, sequence_parallel)
    block.load_hf(hf_state_dict(cfg, kv_heads))
    opt = torch.optim.SGD(block.parameters(), lr=cfg["lr"])
    tokens = cfg["batch"] * cfg["seq"]
    begin, end = tp.sequence_ranges(tokens, world)[rank]
    losses = []
    for step in range(cfg["steps"]):
        x, target = batch(cfg, step)
        if sequence_parallel:  # this rank's tokens only; the loss pieces add up over ranks
            x, target = x[begin:end], target[begin:end]
        out = block(x)
        loss = ((out - target) ** 2).sum() / (tokens * cfg["hidden"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = tp.reduce_from_parallel(loss.detach()) if sequence_parallel else loss.detach()
        losses.append(total.item())
    return losses, to_bytes(tp.gather_weights(block, PREFIX))


def to_bytes(tensors):
    """Tensors as bytes for the trip to the parent process: a tensor sent as is shares its
    storage through this process, which may have exited by the time the parent reads it."""
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def from_bytes(data):
    return torch.load(io.BytesIO(data))
