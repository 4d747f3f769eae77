"""tp.CausalLM on the families beyond Llama / Qwen (family_fixtures.py: Mistral with a
sliding window shorter than the prompt, Phi-3 with fused qkv_proj / gate_up_proj, partial
rotary and LongRoPE crossing its pretrained context during generation, GPT-NeoX with its
per-head interleaved query_key_value, LayerNorms, partial rotary and the parallel residual
(and a sequential twin with gelu_fast), Gemma 2 with soft caps that are reached and
alternating sliding layers, Gemma 3 with q/k norms and a RoPE per layer type; the mixtures
of experts Mixtral (per expert, and fused as transformers 5 holds it), Qwen2-MoE with its
gated shared expert, Qwen3-MoE, GLM-4.5 with grouped sigmoid routing and a shared expert),
against the folders' own transformers models, at TP 1-4 (one process per rank, gloo; 12 / 4
and 8 / 4 heads and GPT-NeoX's 6 heads split unevenly at TP 3 and 4, the vocabulary of 128
at TP 3):

- float64 logits of the prompt within 1e-12, and of the whole generated sequence;
- 16 greedy tokens equal to generate(do_sample=False);
- gather_weights gives back the folder's tensors (the fused layouts written as read);
- one SGD step of the vocab-parallel cross entropy: every weight after it equal to the one
  transformers' step gives (as its save_pretrained writes them);
- a save at TP 4 (gather_weights, rank 0 writes) reloaded at TP 1-3 gives the logits;
- float32 within transformers' own float32 error;
- the mixtures of experts with their experts distributed (EP 1-4) and split two ways
  (TP x EP 2 x 2): logits, tokens, gather_weights, one SGD step, a save at EP 3 reloaded
  at TP 2 and at 2 x 2.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

import family_fixtures
import float32_checks
import launcher
import tp

FAMILIES = tuple(family_fixtures.FAMILIES)
LR = 0.5


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return family_fixtures.folder_for_tests(tmp_path_factory)


def _reference(folder, name):
    from safetensors.torch import load_file

    return load_file(f"{folder}/{name}.reference.safetensors")


def model_result(model, ref, rank) -> dict:
    """A loaded model against a folder's references: the prompt's and the whole sequence's
    logit errors, the greedy tokens, and (rank 0) gather_weights."""
    prompt, generated = ref["model.prompt"], ref["model.generated"]
    with torch.no_grad():
        logits = model.gather_logits(model(prompt))
        full = model.gather_logits(model(torch.cat([prompt, generated[:, :-1]], 1)))
    tokens = model.generate(prompt, generated.shape[1])
    weights = model.gather_weights()
    return dict(
        err=(logits - ref["model.logits"]).abs().max().item(),
        full_err=(full - ref["model.full_logits"]).abs().max().item(),
        scale=max(1.0, ref["model.full_logits"].abs().max().item()),
        same_tokens=torch.equal(tokens, generated), tokens=tokens.tolist(),
        # numpy: pickled by value (a tensor would travel as shared memory of a process that exits)
        weights={k: v.numpy() for k, v in weights.items()} if rank == 0 else None,
    )


def _rank(rank, world, folder):
    out = {}
    for name in FAMILIES:
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64)
        out[name] = model_result(model, _reference(folder, name), rank)
    return out


def _stored(folder):
    from safetensors import safe_open

    stored = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            stored.update({k: st.get_tensor(k) for k in st.keys()})
    return stored


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_families_equal_transformers(folder, world):
    results = launcher.run(world, _rank, str(folder), timeout=600) if world > 1 else [_rank(0, 1, str(folder))]
    for name in FAMILIES:
        for rank, res in enumerate(results):
            r, where = res[name], f"{name} TP {world} rank {rank}"
            assert r["err"] <= 1e-12 * r["scale"], f"{where}: max |prompt logit err| {r['err']:.3g}"
            assert r["full_err"] <= 1e-12 * r["scale"], f"{where}: max |sequence logit err| {r['full_err']:.3g}"
            assert r["same_tokens"], f"{where}: greedy tokens {r['tokens']} differ from transformers'"
        stored = _stored(Path(folder, name))
        got = {k: torch.from_numpy(v) for k, v in results[0][name]["weights"].items()}
        assert got.keys() == stored.keys(), (name, world, sorted(set(got) ^ set(stored)))
        for k, v in stored.items():
            assert torch.equal(got[k], v), (name, world, k)
    worst = {n: max(res[n]["full_err"] for res in results) for n in FAMILIES}
    print(f"\nTP {world}: max |logit err| " + ", ".join(f"{n}: {e:.2g}" for n, e in worst.items()))


def sgd_step(model, ids, rank, loss=None):
    """The mean cross entropy of `ids` (or the `loss` given), its backward, one SGD step; the
    loss and (rank 0) gather_weights after it."""
    if loss is None:
        loss = model.cross_entropy(model(ids)[:, :-1], ids[:, 1:]).mean()
    loss.backward()
    if model.attention_data_parallel_size > 1:
        model.reduce_data_parallel_grads()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:  # an expert no token reached has none (as torch.optim skips it)
                p -= LR * p.grad
    weights = model.gather_weights()
    return loss.item(), {k: v.numpy() for k, v in weights.items()} if rank == 0 else None


def _train_rank(rank, world, folder):
    out = {}
    for name in FAMILIES:
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64)
        out[name] = sgd_step(model, _reference(folder, name)["model.prompt"], rank)
    return out


def check_step(name, got_weights, want, where):
    """Every weight after tp's step against transformers' (_step_bound)."""
    got = {k: torch.from_numpy(v) for k, v in got_weights.items()}
    assert got.keys() == want.keys(), (name, sorted(set(got) ^ set(want)))
    diffs = {k: (got[k] - v).abs().max().item() / max(1.0, v.abs().max().item()) for k, v in want.items()}
    for key, diff in diffs.items():
        assert diff <= _step_bound(name, key), f"{name} {where}: {key} after the step differs by {diff:.3g}"
    return max(diffs.values())


def _train_reference(folder, name, tmp_path, ids=None):
    """transformers' loss and one SGD step on `ids` (None: the folder's prompt), its weights as
    its save_pretrained names them."""
    from transformers import AutoModelForCausalLM

    ids = _reference(folder, name)["model.prompt"] if ids is None else ids
    model = AutoModelForCausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64,
                                                 **family_fixtures.hf_kwargs(name)).eval()
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():  # tied weights appear once
            p -= LR * p.grad
    changed = max((v - before[k]).abs().max().item() for k, v in model.state_dict().items())
    # In the folder's own layout (a fused MoE folder's experts stay fused).
    model.save_pretrained(tmp_path / name,
                          save_original_format=family_fixtures.FAMILIES[name].get("save_original_format", True))
    return loss.item(), _stored(tmp_path / name), changed


def _step_bound(name, key):
    """Gemma's norms compute in float32 in every dtype (transformers' Gemma RMSNorm casts
    x and the weight to float32), so a norm weight's gradient is a float32 sum over tokens
    (and, for q_norm / k_norm, heads), which tp adds per rank and then over ranks: its
    bound is float32's rounding of that sum (~1e-7 relative, times the step's LR). Every
    other weight's gradient is float64 throughout, but in a mixture of experts: the router's
    softmax is float32 in every dtype (transformers' TopKRouter), so the gradient that reaches
    the router, and through it every weight before it, carries float32 rounding of a sum tp
    takes per rank and then over ranks: the same float32 bound there. The experts' own
    weights see the routing weights only as float64 factors: float64's bound."""
    if name.startswith("gemma") and key.endswith("norm.weight"):
        return 1e-7
    if family_fixtures.is_moe(name) and ".experts." not in key:
        return 1e-7
    return 1e-10


@pytest.mark.parametrize("world", [2, 3])
def test_one_sgd_step_equals_transformers(folder, world, tmp_path):
    """The vocab-parallel loss, its backward through every layer (fused and interleaved
    projections, the parallel residual's one all-reduce, soft caps, sliding windows), one
    SGD step: the loss and every weight after the step equal transformers' within 1e-10
    (relative; Gemma's float32 norm weights within float32's rounding, _step_bound)."""
    results = launcher.run(world, _train_rank, str(folder), timeout=600)
    for name in FAMILIES:
        want_loss, want, changed = _train_reference(folder, name, tmp_path)
        assert changed > 1e-3, f"{name}: the step changed nothing"
        for rank, res in enumerate(results):
            assert abs(res[name][0] - want_loss) <= 1e-10, f"{name} rank {rank}: loss {res[name][0]!r} vs {want_loss!r}"
        worst = check_step(name, results[0][name][1], want, f"TP {world}")
        print(f"\n{name} TP {world}: |loss - transformers'| {abs(results[0][name][0] - want_loss):.2g}, "
              f"max relative weight difference after the step {worst:.2g}")


def _save_rank(rank, world, folder, out):
    for name in FAMILIES:
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64)
        weights = model.gather_weights()  # collective
        if rank == 0:
            target = Path(out, name)
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(folder, name, "config.json"), target / "config.json")
            tp.save_sharded_safetensors(str(target), weights, 100_000)
    return True


def _reloaded_rank(rank, world, folder, saved):
    out = {}
    for name in FAMILIES:
        ref = _reference(folder, name)  # beside the original folders, not the saved ones
        model = tp.CausalLM.from_pretrained(f"{saved}/{name}", dtype=torch.float64)
        with torch.no_grad():
            logits = model.gather_logits(model(ref["model.prompt"]))
        out[name] = (logits - ref["model.logits"]).abs().max().item() / max(1.0, ref["model.logits"].abs().max().item())
    return out


def test_saved_at_tp4_reloads_at_tp1_2_3(folder, tmp_path):
    launcher.run(4, _save_rank, str(folder), str(tmp_path), timeout=600)
    for name in FAMILIES:
        assert json.loads((tmp_path / name / "config.json").read_text())["model_type"], name
    for world in (1, 2, 3):
        results = launcher.run(world, _reloaded_rank, str(folder), str(tmp_path), timeout=600) if world > 1 else [
            _reloaded_rank(0, 1, str(folder), str(tmp_path))]
        for name in FAMILIES:
            for rank, res in enumerate(results):
                assert res[name] <= 1e-12, f"{name}: saved at TP 4, loaded at TP {world} rank {rank}: {res[name]:.3g} (relative)"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_families_in_float32_are_as_close_as_transformers_in_float32(folder, world):
    results = launcher.run(world, float32_checks.rank_float32, str(folder), FAMILIES, timeout=600) if world > 1 else [
        float32_checks.rank_float32(0, 1, str(folder), FAMILIES)]
    float32_checks.check_against_transformers(folder, world, results, family_fixtures.hf_kwargs)


def test_families_compile_to_one_graph_equal_to_eager(folder):
    """Each family's module forward (its norms with biases, the parallel residual's one
    all-reduce, the soft caps, the per-layer RoPE tables) is the C++ forward bit for bit
    and compiles with fullgraph=True to one graph whose logits, loss and gradients equal
    eager's (compile_checks.compiled_causal_lm_matches_eager), at TP 2."""
    import compile_checks

    results = launcher.run(2, compile_checks.compiled_causal_lm_matches_eager, str(folder), FAMILIES,
                           torch.float64, timeout=900)
    for rank, res in enumerate(results):
        for name in FAMILIES:
            assert res[name] == "ok", f"rank {rank} {name}: {res[name]}"


@pytest.fixture(scope="module")
def gptq_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("family_gptq")
    for i, name in enumerate(family_fixtures.GPTQ_FAMILIES):
        family_fixtures.make_gptq(out, name, seed=50 + i)
    return out


def _rank_gptq(rank, world, folder):
    out = {}
    for name in family_fixtures.GPTQ_FAMILIES:
        ref = _reference(folder, name)
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float32)
        with torch.no_grad():
            logits = model.gather_logits(model(ref["model.prompt"]))
        out[name] = ((logits.double() - ref["model.logits"]).abs().max().item(), repr(model))
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_gptq_folders_of_every_family_equal_their_dequantized_model(gptq_folder, world):
    """A GPTQ 4-bit folder of each family (Phi-3's fused qkv_proj / gate_up_proj and
    GPT-NeoX's per-head query_key_value quantized as the one module they are) loads through
    the same path, each rank reading its slices of the packed words, scales and zero points,
    and its float32 logits equal the format's float64 model (transformers with the
    dequantized weights) within transformers' own float32 error of that model."""
    results = launcher.run(world, _rank_gptq, str(gptq_folder), timeout=600) if world > 1 else [
        _rank_gptq(0, 1, str(gptq_folder))]
    for name in family_fixtures.GPTQ_FAMILIES:
        ref = _reference(gptq_folder, name)
        hf_err = (ref["model.logits_float32"] - ref["model.logits"]).abs().max().item()
        scale = max(1.0, ref["model.logits"].abs().max().item())
        for rank, res in enumerate(results):
            err, text = res[name]
            assert "int4_gptq" in text, f"{name}: the model is not GPTQ-quantized:\n{text}"
            assert err <= 4 * hf_err + 1e-6 * scale, f"{name} TP {world} rank {rank}: {err:.3g} vs transformers {hf_err:.3g}"
        print(f"\nTP {world} {name}: max |logit err| {max(r[name][0] for r in results):.2g}, transformers float32 {hf_err:.2g}")


@pytest.fixture(scope="module")
def mxfp4_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("family_mxfp4")
    family_fixtures.make_mxfp4(out, seed=70)
    return out


def _rank_mxfp4(rank, world, folder, ep):
    ref = _reference(folder, "gpt_oss_mxfp4")
    out = {}
    for dtype in (torch.float64, torch.float32):
        model = tp.CausalLM.from_pretrained(f"{folder}/gpt_oss_mxfp4", dtype=dtype, expert_parallel=ep)
        with torch.no_grad():
            logits = model.gather_logits(model(ref["model.prompt"]))
        out[str(dtype)] = ((logits.double() - ref["model.logits"]).abs().max().item(), repr(model.layers[0].moe))
    return out


@pytest.mark.parametrize("world,ep", [(1, False), (2, False), (4, False), (3, True), (4, 2)])
def test_gpt_oss_mxfp4_folder_equals_transformers_dequantized(mxfp4_folder, world, ep):
    """GPT-OSS with its experts in MXFP4 as OpenAI stores them (fused _blocks / _scales,
    quantization_config mxfp4): in float64 tp's logits equal transformers' own (which
    dequantizes the experts with its own code) within 1e-12; in float32, where tp's MXFP4
    CPU kernel runs, within transformers' own float32 error of that model. Experts split
    (TP 1, 2, 4: intermediate 64 in blocks of 32, so one rank of four holds none),
    distributed (EP 3) and both (2 x 2)."""
    results = launcher.run(world, _rank_mxfp4, str(mxfp4_folder), ep, timeout=600) if world > 1 else [
        _rank_mxfp4(0, 1, str(mxfp4_folder), ep)]
    ref = _reference(mxfp4_folder, "gpt_oss_mxfp4")
    scale = max(1.0, ref["model.logits"].abs().max().item())
    hf_err = (ref["model.logits_float32"] - ref["model.logits"]).abs().max().item()
    for rank, res in enumerate(results):
        err64, text = res[str(torch.float64)]
        err32, _ = res[str(torch.float32)]
        assert "quant=mxfp4" in text, text
        assert err64 <= 1e-12 * scale, f"world {world} ep {ep} rank {rank}: float64 max |logit err| {err64:.3g}"
        assert err32 <= 4 * hf_err + 1e-6 * scale, f"world {world} rank {rank}: float32 {err32:.3g} vs transformers {hf_err:.3g}"


MOE = tuple(n for n in FAMILIES if family_fixtures.is_moe(n))
# (world, expert_parallel): the experts distributed over every rank (EP 1-4; 16 experts over
# 3 ranks: 6, 5, 5), and two groups of two ranks each splitting its experts (TP x EP).
EP_SPLITS = [(1, True), (2, True), (3, True), (4, True), (4, 2)]


def _rank_ep(rank, world, folder, ep):
    out = {}
    for name in MOE:
        ref = _reference(folder, name)
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64, expert_parallel=ep)
        prompt, generated = ref["model.prompt"], ref["model.generated"]
        with torch.no_grad():
            logits = model.gather_logits(model(prompt))
        tokens = model.generate(prompt, generated.shape[1])
        weights = model.gather_weights()
        out[name] = dict(err=(logits - ref["model.logits"]).abs().max().item(),
                         scale=max(1.0, ref["model.logits"].abs().max().item()),
                         same_tokens=torch.equal(tokens, generated), text=repr(model),
                         weights={k: v.numpy() for k, v in weights.items()} if rank == 0 else None)
    return out


@pytest.mark.parametrize("world,ep", EP_SPLITS)
def test_moe_families_with_expert_parallelism_equal_transformers(folder, world, ep):
    """Every MoE family's experts distributed over the ranks (Mixtral's 8 over 3: 3, 3, 2;
    16 over 3: 6, 5, 5), or over two groups of two ranks that each split their experts:
    float64 logits within 1e-12, the greedy tokens, and gather_weights giving back the
    folder's tensors (a fused folder's as fused tensors)."""
    results = launcher.run(world, _rank_ep, str(folder), ep, timeout=600) if world > 1 else [
        _rank_ep(0, 1, str(folder), ep)]
    groups = world if ep is True else ep
    for name in MOE:
        for rank, res in enumerate(results):
            r, where = res[name], f"{name} world {world} expert_parallel={ep} rank {rank}"
            assert f"expert_parallel={groups}" in r["text"], r["text"]
            assert r["err"] <= 1e-12 * r["scale"], f"{where}: max |logit err| {r['err']:.3g}"
            assert r["same_tokens"], where
        stored = _stored(Path(folder, name))
        got = {k: torch.from_numpy(v) for k, v in results[0][name]["weights"].items()}
        assert got.keys() == stored.keys(), (name, world, sorted(set(got) ^ set(stored)))
        for k, v in stored.items():
            assert torch.equal(got[k], v), (name, world, k)


def _train_rank_ep(rank, world, folder, ep):
    out = {}
    for name in MOE:
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64, expert_parallel=ep)
        out[name] = sgd_step(model, _reference(folder, name)["model.prompt"], rank)
    return out


@pytest.mark.parametrize("world,ep", [(3, True), (4, 2)])
def test_moe_sgd_step_under_expert_parallelism_equals_transformers(folder, world, ep, tmp_path):
    """One SGD step with the experts distributed (EP 3) or split two ways (TP x EP 2 x 2): the
    loss, the router and every expert's weights after the step equal transformers' (_step_bound)."""
    results = launcher.run(world, _train_rank_ep, str(folder), ep, timeout=600)
    for name in MOE:
        want_loss, want, changed = _train_reference(folder, name, tmp_path)
        assert changed > 1e-3, f"{name}: the step changed nothing"
        for rank, res in enumerate(results):
            assert abs(res[name][0] - want_loss) <= 1e-10, f"{name} rank {rank}: loss {res[name][0]!r} vs {want_loss!r}"
        check_step(name, results[0][name][1], want, f"world {world} ep {ep}")


def _save_rank_ep(rank, world, folder, out, ep):
    for name in MOE:
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float64, expert_parallel=ep)
        weights = model.gather_weights()  # collective
        if rank == 0:
            target = Path(out, name)
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(folder, name, "config.json"), target / "config.json")
            tp.save_sharded_safetensors(str(target), weights, 100_000)
    return True


def _reloaded_rank_ep(rank, world, folder, saved, ep):
    out = {}
    for name in MOE:
        ref = _reference(folder, name)
        model = tp.CausalLM.from_pretrained(f"{saved}/{name}", dtype=torch.float64, expert_parallel=ep)
        with torch.no_grad():
            logits = model.gather_logits(model(ref["model.prompt"]))
        out[name] = (logits - ref["model.logits"]).abs().max().item() / max(1.0, ref["model.logits"].abs().max().item())
    return out


def test_moe_saved_under_expert_parallelism_reloads_at_other_splits(folder, tmp_path):
    """Saved with the experts distributed over 3 ranks (gather_weights, rank 0 writes; a fused
    folder stays fused), reloaded at TP 2 and at TP x EP 2 x 2: the logits."""
    launcher.run(3, _save_rank_ep, str(folder), str(tmp_path), True, timeout=600)
    for world, ep in ((2, False), (4, 2)):
        results = launcher.run(world, _reloaded_rank_ep, str(folder), str(tmp_path), ep, timeout=600)
        for name in MOE:
            for rank, res in enumerate(results):
                assert res[name] <= 1e-12, f"{name}: saved at EP 3, loaded at world {world} ep {ep} rank {rank}: {res[name]:.3g}"
