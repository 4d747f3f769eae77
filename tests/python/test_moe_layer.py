"""tp.MoEParallelMLP built by a user from global sizes (not through tp.CausalLM), at TP 1-4
over gloo (one process per rank), expert tensor parallelism, expert parallelism and both:
forward, the input's and every parameter's gradient, and gather_weights equal a
plain-torch reference of the same global weights (moe_checks.py)."""

import pytest
import torch

import launcher
import moe_checks
import tp

WORLDS = (1, 2, 3, 4)
_results = {}


def _results_for(world):
    # One launch per world size runs every case; each case is then its own test.
    if world not in _results:
        _results[world] = launcher.run(world, moe_checks.run)
    return _results[world]


@pytest.mark.parametrize("world,case,ep", [(w, c, ep) for w in WORLDS for c, ep in moe_checks.cases(w)],
                         ids=lambda v: str(v))
def test_moe_layer_matches_reference(world, case, ep):
    failures = [f"rank {r} of {world}:\n{res[(case, ep)]}" for r, res in enumerate(_results_for(world))
                if res[(case, ep)]]
    assert not failures, "\n".join(failures)


def test_moe_layer_is_exported_and_checks_its_arguments():
    assert "MoEParallelMLP" in tp.__all__ and tp.MoEParallelMLP is tp.moe.MoEParallelMLP
    moe = tp.MoEParallelMLP(16, 8, 4, 2, router=tp.MoERouterOptions(), dtype=torch.float64)
    assert moe.options.num_experts == 4 and moe.local_experts == (0, 4) and moe.world_size == 1
    names = {n for n, _ in moe.named_parameters()}
    assert {"router_weight", "experts.0.gate_up.weight", "experts.3.down.weight"} <= names, names
    assert "MoEParallelMLP" in repr(moe)
    with pytest.raises(TypeError, match="router has no field 'scorng'"):
        tp.MoEParallelMLP(16, 8, 4, 2, router=dict(scorng="sigmoid"))
    with pytest.raises(ValueError, match="router.scoring='sigmod'"):
        tp.MoEParallelMLP(16, 8, 4, 2, router=dict(scoring="sigmod"))
    with pytest.raises(ValueError, match="top_k"):
        tp.MoEParallelMLP(16, 8, 4, 5)  # more choices than experts: the C++ check names it
    with pytest.raises(ValueError, match="either group= or communicator="):
        tp.MoEParallelMLP(16, 8, 4, 2, group=object(), communicator=object())
