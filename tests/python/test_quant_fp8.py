"""The FP8 layers at TP 2 over gloo against a torch reference built from the same
checkpoint (fp8_checks.py makes it in Python, independently of tp.quantize_weight)."""

import pytest

import fp8_checks
import launcher

# Column layers see exactly the reference's activations and weights: float32
# accumulation only (bfloat16: the output's rounding, 2^-9 of the largest output).
# fp8_channel's row layer quantizes each rank's slice of x per token with the
# slice's own amax, the reference the whole row: up to one E4M3 step (2^-3) per
# element, a random sum over K, measured up to ~5% of max |y| (see
# tests/quant/fp8_test.cpp for the derivation).
TOL = {"column": 1e-4, "row": 1e-4, "column_bf16": 1e-2}
TOL_CHANNEL_ROW = 0.1


@pytest.mark.parametrize("fmt", ["fp8_tensor", "fp8_channel", "fp8_block"])
def test_fp8_layer_matches_torch_reference_tp2(fmt):
    for rank, res in enumerate(launcher.run(2, fp8_checks.check_fp8, fmt)):
        assert res.pop("column_bf16_dtype") == "torch.bfloat16", res
        for layer, err in res.items():
            tol = TOL_CHANNEL_ROW if (fmt == "fp8_channel" and layer == "row") else TOL[layer]
            assert err <= tol, f"{fmt} {layer} rank {rank}: relative error {err:.3g} > {tol:.1g}"
