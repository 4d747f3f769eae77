"""Per-rank checks of the FP8 layers against a torch re-implementation of each format.

The checkpoint is made here, in Python, from the format's description (E4M3, scale =
amax / 448; DeepSeek-V3 128x128 weight_scale_inv blocks), independently of
tp.quantize_weight, so the test also checks that the library reads what other tools
write. ``check_fp8(rank, world, fmt)`` returns {layer: None or the error}.
"""

import torch
import torch.nn.functional as F

import tp

E4M3_MAX = 448.0
BLOCK = 128


def _randn(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def _scale(amax):
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def _fp8(v):
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _expand(blocks, n, k):
    return blocks.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]


def quantize(fmt, w):
    """w [N, K] float32 -> (checkpoint tensors by suffix, dequantized float32 weight)."""
    n, k = w.shape
    if fmt == "fp8_tensor":
        s = _scale(w.abs().max())
        q = _fp8(w / s)
        return {"weight": q, "weight_scale": s, "input_scale": torch.tensor(6.0 / E4M3_MAX)}, q.float() * s
    if fmt == "fp8_channel":
        s = _scale(w.abs().amax(1, keepdim=True))
        q = _fp8(w / s)
        return {"weight": q, "weight_scale": s}, q.float() * s
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    padded = F.pad(w, (0, kb * BLOCK - k, 0, nb * BLOCK - n))
    s = _scale(padded.abs().reshape(nb, BLOCK, kb, BLOCK).amax(dim=(1, 3)))
    q = _fp8(w / _expand(s, n, k))
    return {"weight": q, "weight_scale_inv": s}, q.float() * _expand(s, n, k)


def quantize_activation(fmt, x, tensors):
    if fmt == "fp8_tensor":
        s = tensors["input_scale"]
        return _fp8(x / s).float() * s
    if fmt == "fp8_channel":
        s = _scale(x.abs().amax(-1, keepdim=True))
        return _fp8(x / s).float() * s
    m, k = x.shape
    g = -(-k // BLOCK)
    groups = F.pad(x, (0, g * BLOCK - k)).reshape(m, g, BLOCK)
    s = _scale(groups.abs().amax(-1, keepdim=True))
    return (_fp8(groups / s).float() * s).reshape(m, g * BLOCK)[:, :k]


def _error(got, want):
    return ((got.double() - want.double()).abs().max() / max(1.0, want.abs().max().item())).item()


def check_fp8(rank, world, fmt):
    # 1000 rows / 520 columns: partial 128-blocks for fp8_block, uneven splits for all.
    n, k = 1000, 520
    w = _randn(1, n, k) * torch.exp(_randn(2, n, 1)) / k**0.5
    b = _randn(3, n)
    x = _randn(4, 6, k)
    tensors, w_deq = quantize(fmt, w)
    ckpt = {f"fc.{name}": t for name, t in tensors.items()}
    ckpt["fc.bias"] = b
    ref = F.linear(quantize_activation(fmt, x, tensors).double(), w_deq.double(), b.double())
    out = {}
    col = tp.ColumnParallelLinear(k, n, bias=True, gather_output=True, quant=fmt)
    col.load_weights(ckpt, "fc")
    out["column"] = _error(col(x), ref)
    row = tp.RowParallelLinear(k, n, bias=True, input_is_parallel=False, quant=fmt)
    row.load_weights(ckpt, "fc")
    out["row"] = _error(row(x), ref)
    bf16 = tp.ColumnParallelLinear(k, n, bias=True, gather_output=True, quant=fmt, dtype=torch.bfloat16)
    bf16.load_weights({name: (t.bfloat16() if name == "fc.bias" else t) for name, t in ckpt.items()}, "fc")
    y = bf16(x.bfloat16())
    out["column_bf16_dtype"] = str(y.dtype)
    ref_bf16 = F.linear(quantize_activation(fmt, x.bfloat16().float(), tensors).double(), w_deq.double(),
                        b.bfloat16().double())
    out["column_bf16"] = _error(y, ref_bf16)
    return out
