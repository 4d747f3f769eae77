"""The fused layer boundary from Python: Communicator.all_reduce_fusion and the column
layers' forward_quantized (the boundary's per-token codes instead of the activations),
at world 1 and 2 (processes over gloo, launcher.py)."""

import pytest
import torch

import boundary_checks
import launcher
import tp


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("fmt", ["int8_w8a8", "fp8_channel"])
def test_the_boundarys_codes_give_forwards_bits(world, fmt):
    results = launcher.run(world, boundary_checks.quantized_handoff, fmt, "bfloat16")
    token = {"int8_w8a8": "TokenQuant.int8", "fp8_channel": "TokenQuant.fp8_e4m3"}[fmt]
    codes = {"int8_w8a8": "torch.int8", "fp8_channel": "torch.float8_e4m3fn"}[fmt]
    for rank, res in enumerate(results):
        assert res["residual"], f"rank {rank}: residual_out is not the sum over ranks"
        assert res["input_quant"] == [token] * 3, (rank, res["input_quant"])
        assert res["codes_dtype"] == codes and res["scales_shape"] == [2, 7, 1], (rank, res)
        assert res["equal"] == [True] * 3, f"rank {rank}: forward_quantized differs from forward: {res['equal']}"


def test_a_layer_without_per_token_quantization_takes_no_codes():
    layer = tp.ColumnParallelLinear(64, 32, dtype=torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert layer.input_quant(x) == tp.TokenQuant.none
    with torch.no_grad(), pytest.raises(ValueError, match="pre-quantized"):
        layer.forward_quantized(torch.zeros(3, 64, dtype=torch.int8), torch.ones(3, 1))
    comm = tp.Communicator()
    with pytest.raises(ValueError, match="quant_out"):  # a quantization needs a norm to quantize
        comm.all_reduce_fusion(x, quant_out=tp.AllReduceFusionQuant.int8_per_token)
