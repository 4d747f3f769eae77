"""Per-rank steps of test_boundary.py, run in each rank's process by launcher.run."""

import torch

import tp


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def quantized_handoff(rank, world, fmt, dtype_name):
    """The fused boundary's codes handed to column layers: forward_quantized equals forward
    on the boundary's norm_out, bit for bit; residual_out is the sum over ranks."""
    dtype = getattr(torch, dtype_name)
    comm = tp.communicator()
    hidden = 200
    gen = torch.Generator().manual_seed(5)  # the same x on every rank
    x = (torch.randn(2, 7, hidden, generator=gen, dtype=torch.float64) * 3).to(dtype)
    weight = (torch.rand(hidden, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    quant = {"int8_w8a8": tp.AllReduceFusionQuant.int8_per_token,
             "fp8_channel": tp.AllReduceFusionQuant.fp8_per_token}[fmt]
    r = comm.all_reduce_fusion(x if rank == 0 else torch.zeros_like(x), norm=tp.AllReduceFusionNorm.rms,
                               norm_weight=weight, eps=1e-5, quant_out=quant)
    layers = [tp.ColumnParallelLinear(hidden, 90, quant=fmt, dtype=dtype, communicator=comm),
              tp.GateUpParallelLinear(hidden, 130, quant=fmt, dtype=dtype, communicator=comm),
              tp.QKVParallelLinear(hidden, 8, 12, 1, quant=fmt, dtype=dtype, communicator=comm)]
    out = {"residual": torch.equal(r.residual_out, x), "equal": [], "input_quant": [],
           "codes_dtype": str(r.quant_out.dtype), "scales_shape": list(r.scale_out.shape)}
    with torch.no_grad():
        for layer in layers:
            out["input_quant"].append(str(layer.input_quant(r.norm_out)))
            a = layer.forward_quantized(r.quant_out, r.scale_out)
            b = layer(r.norm_out)
            out["equal"].append(_same_bits(a, b))
    return out
