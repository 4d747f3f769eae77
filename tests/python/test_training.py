"""Training through the tp layers (one process per rank, gloo): gradcheck on the
differentiable collectives, and a Llama-style block trained 5 SGD steps at TP 2 and 3
ending with the single-process model's losses and weights (float64, 1e-10)."""

import pytest
import torch

import launcher
import tp
import training_checks as tc


@pytest.mark.parametrize("world", [2, 3])
def test_gradcheck_collectives(world):
    for rank, res in enumerate(launcher.run(world, tc.gradcheck_collectives)):
        failed = {name: err for name, err in res.items() if err}
        assert not failed, f"rank {rank} of {world}:\n" + "\n".join(f"{n}:\n{e}" for n, e in failed.items())
        assert len(res) == 6, res


def test_collectives_are_identities_at_world_1():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    for f in (tp.copy_to_parallel, tp.reduce_from_parallel, tp.gather_from_parallel, tp.scatter_to_parallel,
              tp.gather_from_sequence_parallel, tp.reduce_scatter_to_sequence_parallel):
        assert torch.equal(f(x), x), f
    assert torch.autograd.gradcheck(lambda t: tp.gather_from_parallel(tp.copy_to_parallel(t) * 2), (x,))
    assert tp.sequence_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert tp.sequence_sizes(2, 3) == [1, 1, 0]


_reference = {}


@pytest.mark.parametrize(
    "world,kv_heads,sequence_parallel",
    [(2, 3, False), (3, 3, False), (2, 1, True), (3, 1, False)],
    ids=["tp2-gqa", "tp3-gqa", "tp2-mqa-replicated-sp", "tp3-mqa-replicated"],
)
def test_block_training_matches_one_process(world, kv_heads, sequence_parallel):
    if kv_heads not in _reference:
        _reference[kv_heads] = tc.reference_training(tc.CONFIG, kv_heads)
    ref_losses, ref_weights = _reference[kv_heads]
    results = [(losses, tc.from_bytes(weights)) for losses, weights in
               launcher.run(world, tc.train_block, kv_heads, sequence_parallel)]
    for rank, (losses, weights) in enumerate(results):
        where = f"rank {rank} of {world}"
        assert losses[-1] < losses[0], f"{where}: the loss did not go down: {losses}"
        for step, (got, want) in enumerate(zip(losses, ref_losses)):
            assert abs(got - want) <= 1e-10, f"{where}, step {step}: loss {got!r} vs {want!r}"
        assert sorted(weights) == sorted(ref_weights), f"{where}: names {sorted(weights)}"
        for name, want in ref_weights.items():
            err = (weights[name] - want).abs().max().item()
            assert err <= 1e-10, f"{where}: {name} differs from the single-process weight by {err:.3g}"
    # What was gathered loads back at TP 1 and gives the reference model's output.
    block = tc.TPBlock(tc.CONFIG, kv_heads)
    block.load_hf(results[0][1])
    x, _ = tc.batch(tc.CONFIG, 99)
    with torch.no_grad():
        got = block(x)
        reloaded = tc.TPBlock(tc.CONFIG, kv_heads)
        reloaded.load_hf(ref_weights)
        assert (got - reloaded(x)).abs().max().item() <= 1e-12
