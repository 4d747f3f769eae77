"""INT4 layers (GPTQ, AWQ) at TP=2 over gloo against torch on the dequantized weights.

The checkpoints are packed here in plain torch, independently of tp's C++ packing
(quantize.h / src/quant/int4/packing.h), the way AutoGPTQ (v1: zero - 1) and AutoAWQ
(nibble order 0,2,4,6,1,3,5,7) write them; the reference is F.linear on the weight
those tensors represent.
"""

import torch
import torch.nn.functional as F

import launcher
import tp

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
N, K, G = 64, 256, 64


def _pack(codes, dim):
    """int 0..15 -> int32 words, eight along `dim`, nibble i = element 8j + i."""
    c = codes.to(torch.int64).movedim(dim, -1)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // 8, 8)
    words = (c << torch.arange(0, 32, 4)).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def _checkpoint(fmt):
    g = torch.Generator().manual_seed(7)
    q = torch.randint(0, 16, (N, K), generator=g)  # codes [N, K]
    zero = torch.randint(1, 16, (K // G, N), generator=g)  # [K/G, N]
    scale = (torch.rand(K // G, N, generator=g) / 50 + 0.001).half()
    w = (q - zero.repeat_interleave(G, 0).t()).float() * scale.float().repeat_interleave(G, 0).t()
    if fmt == "gptq":
        tensors = {"qweight": _pack(q.t(), 0), "qzeros": _pack(zero - 1, 1), "scales": scale}
    else:
        order = torch.tensor(AWQ_ORDER)
        awq = lambda t: t.reshape(t.shape[0], -1, 8)[:, :, order].reshape(t.shape[0], -1)  # noqa: E731
        tensors = {"qweight": _pack(awq(q.t()), 1), "qzeros": _pack(awq(zero), 1), "scales": scale}
    return {"fc." + k: v for k, v in tensors.items()}, w


def _rank_checks(rank, world):
    out = {}
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(3))
    for fmt in ("gptq", "awq"):
        ckpt, w = _checkpoint(fmt)
        # float32 layers run ATen's bfloat16 int4 kernel too (the only vectorized one on
        # the CPU), so both dtypes get the bfloat16 tolerance; a wrong packing is O(1).
        for dtype, tol in ((torch.float32, 3e-2), (torch.bfloat16, 3e-2)):
            name = f"int4_{fmt}:g{G}:asym {dtype}"
            col = tp.ColumnParallelLinear(K, N, bias=False, gather_output=True, quant=f"int4_{fmt}:g{G}:asym",
                                          dtype=dtype)
            col.load_weights(ckpt, "fc")
            row = tp.RowParallelLinear(K, N, bias=False, input_is_parallel=False, quant=f"int4_{fmt}:g{G}:asym",
                                       dtype=dtype)
            row.load_weights(ckpt, "fc")
            ref = F.linear(x.to(dtype).double(), w.double())
            for layer, y in (("column", col(x.to(dtype))), ("row", row(x.to(dtype)))):
                err = (y.double() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
                out[f"{name} {layer}"] = None if err <= tol else f"relative error {err:.3g} > {tol}"
    return out


def test_int4_layers_at_tp2_match_torch():
    results = launcher.run(2, _rank_checks)
    failures = [f"rank {r}: {case}: {msg}" for r, res in enumerate(results) for case, msg in res.items() if msg]
    assert not failures, "\n".join(failures)
    assert all(len(res) == 8 for res in results)


def test_load_state_dict_into_quantized_layers_is_what_the_next_forward_uses():
    # load_state_dict copies into the C++ layer's own tensors in place, after the kernels
    # derived their copies (INT4 panels, INT8 scales) from the random initialisation.
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(5))
    for quant in ("int4_gptq:g64", "int4_awq:g64:asym", "int4_pack_quantized:g32", "int8_weight_only", "int8_w8a8",
                  "fp8_block"):
        source = tp.ColumnParallelLinear(K, N, quant=quant)
        target = tp.ColumnParallelLinear(K, N, quant=quant)
        before = target(x)
        target.load_state_dict(source.state_dict())
        want = source(x)
        assert not torch.equal(before, want), quant
        assert torch.equal(target(x), want), quant
