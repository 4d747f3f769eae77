"""Attention data parallelism from Python (``tp.CausalLM.from_pretrained(...,
attention_data_parallel=D)``), against the folders' own transformers models
(family_fixtures.py) run on each group's prompts alone: a family with sandwich norms
(Gemma 2), one with the parallel residual (GPT-NeoX), a mixture of experts with a gated
shared expert (Qwen2-MoE) and one with its 16 experts distributed over every rank (Qwen3-MoE
at expert parallelism 4), in three layouts:

- DP 2 x TP 2 over four ranks (attention split over each group's two ranks);
- DP 3 over three ranks with 3, 1 and 0 prompts of lengths 5, 7 and none;
- DP 2 over two ranks, and one SGD step of every group's loss (each group's cross entropy
  summed over its tokens, divided by all groups' count) after reduce_data_parallel_grads:
  every weight equal to transformers' step on all the prompts in one batch.

Each group's float64 logits within 1e-12 of transformers' and its greedy tokens equal.
"""

import pytest
import torch

import family_fixtures
import launcher
import tp
from test_model_families import _train_reference, check_step, sgd_step

CASES = {"gemma2": False, "gpt_neox": False, "qwen2_moe": False, "qwen3_moe": True}  # name: expert_parallel
LAYOUTS = {"dp2_tp2": (4, 2, [(2, 6), (1, 8)]), "dp3_uneven": (3, 3, [(3, 5), (1, 7), (0, 0)])}
NEW_TOKENS = 6
VOCAB = 128


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return family_fixtures.folder_for_tests(tmp_path_factory, names=tuple(CASES))


def _prompts(group, count, length):
    """Ids from 1: transformers' embeddings with a padding_idx (Gemma's pad token 0) leave that
    row's gradient zero, where tp trains every row."""
    g = torch.Generator().manual_seed(2000 + group)
    return torch.randint(1, VOCAB, (count, length), generator=g)


def _rank(rank, world, folder, dp, batches):
    group = rank // (world // dp)
    count, length = batches[group]
    ids = _prompts(group, count, length)
    out = {}
    for name, ep in CASES.items():
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64, attention_data_parallel=dp,
                                            expert_parallel=ep)
        assert model.attention_group == group
        with torch.no_grad():
            logits = model.gather_logits(model(ids))
        tokens = model.generate(ids, NEW_TOKENS)
        out[name] = (logits.numpy(), tokens.numpy())
    return out


def _hf(folder, name):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64,
                                                **family_fixtures.hf_kwargs(name)).eval()


def _greedy(model, ids, n):
    """transformers' model's greedy continuation: the argmax of the whole sequence's last
    logits, step by step (what generate(do_sample=False) gives; family_fixtures checks so)."""
    out = ids
    with torch.no_grad():
        for _ in range(n):
            out = torch.cat([out, model(out).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_attention_dp_equals_transformers(folder, layout):
    world, dp, batches = LAYOUTS[layout]
    results = launcher.run(world, _rank, str(folder), dp, batches, timeout=600)
    for name in CASES:
        model = _hf(folder, name)
        worst = 0.0
        for rank, res in enumerate(results):
            group = rank // (world // dp)
            count, length = batches[group]
            logits, tokens = (torch.from_numpy(x) for x in res[name])
            where = f"{name} {layout} rank {rank} (group {group}: {count} prompts of {length})"
            assert tokens.shape == (count, NEW_TOKENS), where
            if count == 0:
                continue
            ids = _prompts(group, count, length)
            with torch.no_grad():
                want = model(ids).logits
            err = (logits - want).abs().max().item()
            assert err <= 1e-12 * max(1.0, want.abs().max().item()), f"{where}: max |logit err| {err:.3g}"
            assert torch.equal(tokens, _greedy(model, ids, NEW_TOKENS)), f"{where}: greedy tokens differ"
            worst = max(worst, err)
        print(f"\n{name} {layout}: max |logit err| {worst:.2g}")


TRAIN_BATCHES = [(2, 6), (1, 6)]  # one length: transformers' reference runs all prompts in one batch


def _train_rank(rank, world, folder):
    count, length = TRAIN_BATCHES[rank]
    ids = _prompts(rank, count, length)
    all_tokens = sum(c * (n - 1) for c, n in TRAIN_BATCHES)
    out = {}
    for name, ep in CASES.items():
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64, attention_data_parallel=2,
                                            expert_parallel=ep)
        loss = model.cross_entropy(model(ids)[:, :-1], ids[:, 1:]).sum() / all_tokens
        out[name] = sgd_step(model, ids, rank, loss)[1]
    return out


def test_attention_dp_sgd_step_equals_transformers(folder, tmp_path):
    results = launcher.run(2, _train_rank, str(folder), timeout=600)
    ids = torch.cat([_prompts(g, c, n) for g, (c, n) in enumerate(TRAIN_BATCHES)])
    for name in CASES:
        _, want, changed = _train_reference(folder, name, tmp_path, ids)
        assert changed > 1e-3, f"{name}: the step changed nothing"
        check_step(name, results[0][name], want, "attention DP 2")
