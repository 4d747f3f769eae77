"""Whole-model weighted splits from Python (``tp.CausalLM.from_pretrained(...,
split_weights=[3, 1])``), against the folders' own transformers models (family_fixtures.py):
a dense family with sandwich norms (Gemma 2), one with the parallel residual (GPT-NeoX,
6 heads), a mixture of experts with a gated shared expert (Qwen2-MoE) and one with 16
experts distributed over the ranks (Qwen3-MoE, expert parallelism), at 3:1 over two ranks
and 1:2:1 over three:

- float64 logits of the prompt and of the whole generated sequence within 1e-12, and 16
  greedy tokens equal to generate(do_sample=False);
- gather_weights gives back the folder's tensors;
- the plan every rank gets is the same and gives each rank its weight's share of the heads,
  rows and experts (within one unit);
- one SGD step of the vocab-parallel cross entropy at 3:1 and 1:2:1: the loss and every
  weight after it equal transformers' step (test_model_families' bounds).
"""

import pytest
import torch

import family_fixtures
import launcher
import tp
from test_model_families import _reference, _stored, _train_reference, check_step, model_result, sgd_step

CASES = {"gemma2": False, "gpt_neox": False, "qwen2_moe": False, "qwen3_moe": True}  # name: expert_parallel
WEIGHTS = {2: [3.0, 1.0], 3: [1.0, 2.0, 1.0]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return family_fixtures.folder_for_tests(tmp_path_factory, names=tuple(CASES))


def _model(folder, name, world):
    return tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64, split_weights=WEIGHTS[world],
                                       expert_parallel=CASES[name])


def _rank(rank, world, folder):
    out = {}
    for name in CASES:
        model = _model(folder, name, world)
        plan = model.split_plan()
        out[name] = dict(model_result(model, _reference(folder, name), rank), plan=str(plan),
                         shares=[[(s.q_heads, s.mlp_rows, s.experts, s.expert_rows, s.shared_rows) for s in layer]
                                 for layer in plan.layers],
                         vocab_rows=list(plan.vocab_rows))
    return out


def _within_one_unit(held, weights, unit=1):
    """Each rank's share of sum(held) within `unit` of its weight's."""
    total, wsum = sum(held), sum(weights)
    return all(abs(h - total * w / wsum) <= unit for h, w in zip(held, weights))


@pytest.mark.parametrize("world", [2, 3])
def test_weighted_split_equals_transformers(folder, world):
    weights = WEIGHTS[world]
    results = launcher.run(world, _rank, str(folder), timeout=600)
    for name in CASES:
        for rank, res in enumerate(results):
            r, where = res[name], f"{name} weights {weights} rank {rank}"
            assert r["err"] <= 1e-12 * r["scale"], f"{where}: max |prompt logit err| {r['err']:.3g}\n{r['plan']}"
            assert r["full_err"] <= 1e-12 * r["scale"], f"{where}: max |sequence logit err| {r['full_err']:.3g}"
            assert r["same_tokens"], f"{where}: greedy tokens {r['tokens']} differ from transformers'"
            assert r["plan"] == results[0][name]["plan"], where
        first = results[0][name]
        config = family_fixtures.FAMILIES[name]["config"]
        group = config["num_attention_heads"] // config.get("num_key_value_heads", config["num_attention_heads"])
        for i, layer in enumerate(first["shares"]):
            q, rows, experts, expert_rows, shared = zip(*layer)
            assert _within_one_unit(q, weights, group), (name, i, q, first["plan"])
            if any(rows):
                assert _within_one_unit(rows, weights), (name, i, rows, first["plan"])
            if CASES[name] and any(experts):
                assert _within_one_unit(experts, weights), (name, i, experts, first["plan"])
            elif any(expert_rows):
                assert _within_one_unit(expert_rows, weights), (name, i, expert_rows, first["plan"])
            if any(shared):
                assert _within_one_unit(shared, weights), (name, i, shared, first["plan"])
        assert _within_one_unit(first["vocab_rows"], weights), (name, first["plan"])
        stored = _stored(f"{folder}/{name}")
        got = {k: torch.from_numpy(v) for k, v in first["weights"].items()}
        assert got.keys() == stored.keys(), (name, sorted(set(got) ^ set(stored)))
        for k, v in stored.items():
            assert torch.equal(got[k], v), (name, k)
        print(f"\n{name}, weights {weights}: max |logit err| "
              f"{max(res[name]['full_err'] for res in results):.2g}\n{first['plan']}")


def _train_rank(rank, world, folder):
    out = {}
    for name in CASES:
        out[name] = sgd_step(_model(folder, name, world), _reference(folder, name)["model.prompt"], rank)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_weighted_split_sgd_step_equals_transformers(folder, world, tmp_path):
    results = launcher.run(world, _train_rank, str(folder), timeout=600)
    for name in CASES:
        want_loss, want, changed = _train_reference(folder, name, tmp_path)
        assert changed > 1e-3, f"{name}: the step changed nothing"
        for rank, res in enumerate(results):
            assert abs(res[name][0] - want_loss) <= 1e-10, f"{name} rank {rank}: loss {res[name][0]!r} vs {want_loss!r}"
        check_step(name, results[0][name][1], want, f"weights {WEIGHTS[world]}")
