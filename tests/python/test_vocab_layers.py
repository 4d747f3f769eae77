"""tp.VocabParallelEmbedding, tp.ParallelLMHead and the vocab-parallel cross entropy at
TP 1-4 (one process per rank, gloo) against F.embedding, F.linear and F.cross_entropy on
the full tables, float64: outputs, every gradient, padding, uneven and empty slices, and
out-of-vocabulary ids as errors on every rank."""

import pytest
import torch

import launcher
import tp
import vocab_checks


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_vocab_layers_match_torch(world):
    results = launcher.run(world, vocab_checks.check_all) if world > 1 else [vocab_checks.check_all(0, 1)]
    for rank, (errs, messages) in enumerate(results):
        where = f"rank {rank} of {world}"
        assert len(errs) == len(vocab_checks.CASES) * 18, sorted(errs)
        bad = {k: v for k, v in errs.items() if not v <= 1e-12}
        assert not bad, f"{where}: {bad}"
        assert "token id 10" in (messages["embed out of range"] or ""), (where, messages)
        assert "outside the vocabulary [0, 10)" in (messages["embed out of range"] or ""), (where, messages)
        assert "token id 12" in (messages["target out of range"] or ""), (where, messages)


def test_partition_and_repr():
    p = tp.partition_vocab(500, 3, 64)
    assert p.padded_size == 512
    assert [tuple(r) for r in p.ranges] == [(0, 192), (192, 384), (384, 512)]
    assert tuple(p.real(2)) == (384, 500)
    embed = tp.VocabParallelEmbedding(10, 4, pad_to_multiple_of=8)
    assert embed.weight.shape == (16, 4)
    assert torch.all(embed.weight[10:] == 0)
    assert "num_embeddings=10" in repr(embed)
    head = tp.ParallelLMHead.tied(embed)
    assert head.is_tied and head.weight is embed.weight
    with pytest.raises(ValueError, match="tied to an embedding"):
        head.load_weights({"lm_head.weight": torch.randn(10, 4)}, "lm_head")
    with pytest.raises(TypeError, match="int64 or int32"):
        embed(torch.zeros(2))
