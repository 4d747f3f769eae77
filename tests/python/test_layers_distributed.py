"""Every layer at TP 1-4 over gloo (one process per rank) vs F.linear on the full weights."""

import pytest

import launcher
import layer_checks

WORLDS = (1, 2, 3, 4)
_results = {}


def _results_for(world):
    # One launch per world size runs every case; each case is then its own test.
    if world not in _results:
        per_rank = launcher.run(world, layer_checks.all_checks)
        _results[world] = per_rank
    return _results[world]


@pytest.mark.parametrize(
    "world,case", [(w, c) for w in WORLDS for c in layer_checks.case_names(w)], ids=lambda v: str(v)
)
def test_layer_matches_reference(world, case):
    failures = [
        f"rank {r} of {world}:\n{res[case]}" for r, res in enumerate(_results_for(world)) if res.get(case)
    ]
    assert not failures, "\n".join(failures)
