"""Sharded saving through torch.distributed.checkpoint (tp.dcp_state_dict): saved at TP 4,
loaded at TP 1, 2, 3, every tensor bitwise the saved one (quantized codes and scales too);
mixtures of experts saved at one split of their experts (TP, EP, both) loaded at another."""

import pytest
import torch

import dcp_checks
import launcher
import tp


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import hf_fixtures

    return hf_fixtures.folder_for_tests(tmp_path_factory, ("llama", "qwen2", "qwen3"))


@pytest.mark.parametrize("kind", ["block", "llama", "qwen2", "qwen3"])
def test_dcp_save_at_tp4_loads_exactly_at_tp1_2_3(folder, tmp_path, kind):
    # Uneven shards, replicated KV heads (2 over 3 and 4 ranks; Qwen3's 2 KV heads refuse
    # TP 3), vocabulary padding, tied embeddings (Qwen2), mirrored norms and biases.
    path = str(tmp_path / "ckpt")
    saved = launcher.run(4, dcp_checks.save, kind, str(folder), path)[0]
    for world in (1, 2) + (() if kind == "qwen3" else (3,)):
        for rank, (loaded, _) in enumerate(launcher.run(world, dcp_checks.load, kind, str(folder), path)):
            assert loaded.keys() == saved.keys(), (world, sorted(set(loaded) ^ set(saved)))
            bad = [n for n in saved if not torch.equal(loaded[n], saved[n])]
            assert not bad, f"TP {world} rank {rank}: {bad} differ from the TP 4 save"


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    import family_fixtures

    return family_fixtures.folder_for_tests(tmp_path_factory, ("qwen2_moe", "glm4_moe"))


@pytest.mark.parametrize("kind", ["qwen2_moe", "glm4_moe"])
def test_dcp_mixture_of_experts_saved_at_one_split_loads_exactly_at_others(moe_folder, tmp_path, kind):
    """Qwen2-MoE (a gated shared expert) and GLM-4.5 (grouped routing, its correction bias a
    buffer, a shared expert): saved with every expert split over 4 ranks, loaded with the
    experts distributed over 3 ranks, split two ways (2 x 2) and at TP 2; saved with them
    distributed over 4, loaded at TP 3. Every tensor gathered whole equals the saved one."""
    for save_world, save_ep, loads in ((4, False, ((3, True), (4, 2), (2, False))), (4, True, ((3, False),))):
        path = str(tmp_path / f"ckpt_{save_ep}")
        saved = launcher.run(save_world, dcp_checks.save, kind, str(moe_folder), path, save_ep)[0]
        for world, ep in loads:
            for rank, (loaded, _) in enumerate(launcher.run(world, dcp_checks.load, kind, str(moe_folder), path, ep)):
                assert loaded.keys() == saved.keys(), (world, ep, sorted(set(loaded) ^ set(saved)))
                bad = [n for n in saved if not torch.equal(loaded[n], saved[n])]
                assert not bad, f"saved at {save_world} (ep {save_ep}), loaded at {world} (ep {ep}) rank {rank}: {bad}"


def _assemble(per_rank):
    """Global tensors from every rank's pieces (a replicated piece comes from each holder)."""
    out = {}
    for res in per_rank:
        for name, (shape, pieces) in res.items():
            for offsets, value in pieces:
                whole = out.setdefault(name, torch.zeros(shape, dtype=value.dtype))
                region = whole[tuple(slice(o, o + s) for o, s in zip(offsets, value.shape))]
                region.copy_(value)
    return out


@pytest.mark.parametrize("quant", ["int8_w8a8", "fp8_channel", "fp8_tensor", "fp8_block", "int4_gptq:g32:asym",
                                   "int4_awq:g32", "int4_pack_quantized:g32", "mxfp4", "nvfp4"])
def test_dcp_quantized_layers_saved_at_tp4_load_their_codes_and_scales_at_tp1_2_3(tmp_path, quant):
    path = str(tmp_path / "ckpt")
    saved = _assemble(launcher.run(4, dcp_checks.save_quantized, quant, path))
    for world in (1, 2, 3):
        for rank, (before, after) in enumerate(launcher.run(world, dcp_checks.load_quantized, quant, path)):
            assert after.keys() == saved.keys()
            changed = False
            for name, (shape, pieces) in after.items():
                assert shape == tuple(saved[name].shape), (name, shape)
                for (offsets, value), (_, old) in zip(pieces, before[name][1]):
                    want = saved[name][tuple(slice(o, o + s) for o, s in zip(offsets, value.shape))]
                    assert torch.equal(value.view(torch.uint8) if value.dtype.itemsize == 1 else value,
                                       want.view(torch.uint8) if want.dtype.itemsize == 1 else want), \
                        f"{quant} TP {world} rank {rank}: {name} at {offsets}"
                    changed |= not torch.equal(value.view(torch.uint8) if value.dtype.itemsize == 1 else value,
                                               old.view(torch.uint8) if old.dtype.itemsize == 1 else old)
            assert changed, f"{quant} TP {world} rank {rank}: the load changed nothing"


def test_dcp_state_dict_describes_the_shards():
    layer = tp.QKVParallelLinear(16, 4, 6, 2, bias=True, dtype=torch.float64)
    sd = tp.dcp_state_dict(layer)
    assert set(sd) == {"weight", "bias"}
    assert tuple(sd["weight"].shape) == ((6 + 2 * 2) * 4, 16)  # the fused [q | k | v] of all heads
    with pytest.raises(TypeError, match="describes shards"):
        sd["weight"].sum()
    gptq = tp.dcp_state_dict(tp.ColumnParallelLinear(64, 24, quant="int4_gptq:g32:asym"))
    assert {n: tuple(p.shape) for n, p in gptq.items()} == {"qweight": (8, 24), "qzeros": (2, 3), "scales": (2, 24),
                                                            "bias": (24,)}
