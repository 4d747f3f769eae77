"""Sharded saving through torch.distributed.checkpoint (tp.dcp_state_dict): saved at TP 4,
loaded at TP 1, 2, 3, every tensor bitwise the saved one; quantized layers refused."""

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


def test_dcp_state_dict_describes_the_shards_and_refuses_quantized_layers():
    layer = tp.QKVParallelLinear(16, 4, 6, 2, bias=True, dtype=torch.float64)
    sd = tp.dcp_state_dict(layer)
    assert set(sd) == {"weight", "bias"}
    assert tuple(sd["weight"].shape) == ((6 + 2 * 2) * 4, 16)  # the fused [q | k | v] of all heads
    with pytest.raises(TypeError, match="describes shards"):
        sd["weight"].sum()
    with pytest.raises(NotImplementedError, match="w8a8"):
        tp.dcp_state_dict(torch.nn.Sequential(tp.ColumnParallelLinear(16, 8, quant="int8_w8a8")))
