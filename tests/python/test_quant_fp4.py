"""NVFP4 layers at TP 1-4 in ModelOpt's dialect, against compressed-tensors' own reading.

ModelOpt stores `weight` (two E2M1 codes a byte), `weight_scale` (E4M3 per 16) and
`weight_scale_2`, a global scale that multiplies; compressed-tensors stores the inverse,
which divides (docs/checkpoint_formats.md, 6b). The ModelOpt tensors here are made in
plain torch; compressed-tensors' own converter (ModelOptNvfp4Converter) turns them into its
dialect and its own compressor decompresses them: tp reading either dialect must give
that weight (to compressed-tensors' bfloat16 rounding), where reading one dialect's global
scale with the other's rule would be off by the global scale squared.
"""

import torch
import torch.nn.functional as F

import launcher
import tp
from checkpoints import E2M1_VALUES, nvfp4_dequantize

N, K = 80, 96  # K: 6 groups of 16, uneven over 4 ranks


def _modelopt(n, k, seed):
    """A ModelOpt NVFP4 layer {suffix: tensor} for a random weight: weight_scale_2 = amax /
    (448 * 6), each group's scale amax_group / 6 / weight_scale_2 as E4M3, the nearest code."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-1, 1, n).unsqueeze(1) / k**0.5
    scale_2 = (w.abs().amax() / (448 * 6)).reshape(())
    groups = w.reshape(n, k // 16, 16)
    scale = (groups.abs().amax(-1) / 6 / scale_2).to(torch.float8_e4m3fn)
    group = (scale.float() * scale_2).unsqueeze(-1)
    table = torch.tensor(E2M1_VALUES[:8])
    codes = ((groups / group).abs().unsqueeze(-1) - table).abs().argmin(-1)
    codes = torch.where(groups < 0, codes + 8, codes).reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return {"weight": packed, "weight_scale": scale, "weight_scale_2": scale_2}


def _compressed_tensors_reading(modelopt):
    """compressed-tensors' converter, then its NVFP4 decompression: (its tensors, its weight)."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    from compressed_tensors.quantization import preset_name_to_scheme

    tensors = ModelOptNvfp4Converter(targets=["re:.*fc$"]).process({f"fc.{s}": t for s, t in modelopt.items()})
    ct = {name.removeprefix("fc."): t for name, t in tensors.items()}
    assert set(ct) == {"weight_packed", "weight_scale", "weight_global_scale"}, sorted(ct)
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    weight = NVFP4PackedCompressor.decompress(dict(ct), scheme)["weight"]
    return ct, weight


def _rank_checks(rank, world):
    modelopt = _modelopt(N, K, 3)
    ct, ct_weight = _compressed_tensors_reading(modelopt)
    exact = {"nvfp4:modelopt": nvfp4_dequantize(modelopt["weight"], modelopt["weight_scale"],
                                                modelopt["weight_scale_2"], divide=False),
             "nvfp4": nvfp4_dequantize(ct["weight_packed"], ct["weight_scale"], ct["weight_global_scale"], divide=True)}
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(4))
    out = {}
    for quant, tensors in (("nvfp4:modelopt", modelopt), ("nvfp4", ct)):
        ckpt = {f"fc.{s}": t for s, t in tensors.items()}
        col = tp.ColumnParallelLinear(K, N, bias=False, gather_output=True, quant=quant)
        col.load_weights(ckpt, "fc")
        row = tp.RowParallelLinear(K, N, bias=False, input_is_parallel=False, quant=quant)
        row.load_weights(ckpt, "fc")
        for layer, y in (("column", col(x)), ("row", row(x))):
            ref = F.linear(x.double(), exact[quant].double())
            size = ref.abs().max().item()
            # float32 GEMM of the exact weight; and compressed-tensors' bf16 weight within its rounding
            err = (y.double() - ref).abs().max().item() / size
            ct_err = (y.double() - F.linear(x.double(), ct_weight.double())).abs().max().item() / size
            ok = err <= 1e-5 and ct_err <= 2**-7
            out[f"{quant} {layer}"] = None if ok else f"error {err:.3g} (vs compressed-tensors' weight {ct_err:.3g})"
    return out


def test_nvfp4_both_dialects_equal_compressed_tensors_reading_at_tp_1_to_4():
    for world in (1, 2, 3, 4):
        results = launcher.run(world, _rank_checks)
        failures = [f"world {world} rank {r}: {case}: {msg}" for r, res in enumerate(results)
                    for case, msg in res.items() if msg]
        assert not failures, "\n".join(failures)
        assert all(len(res) == 4 for res in results)
