"""LoRA on a mixture of experts' routed experts (PEFT's target_parameters over transformers'
stacked expert tensors) against PEFT's own PeftModel, at TP 1-4, in float64.

Three families: Mixtral (gate rows then up rows), GPT-OSS (its gate_up_proj stored [experts,
hidden, 2 * intermediate] with gate and up columns alternating, expert biases) and Qwen2-MoE
(a shared expert of 28 rows, split over every rank; adapter "e" there also names the bare
gate_proj / up_proj / down_proj, which PEFT puts on the shared expert and, reading them as
transformers 4's per-expert names too, on the stacked experts with gate_up_proj at twice the
rank and alpha: its rank_pattern / alpha_pattern). 6 experts of
intermediate size 40: uneven over 3 ranks (14, 13, 13), and over expert-parallel groups (TP 4
as 2 groups of 2: each expert split over a pair, its mirrored factors' gradients summed over
the pair alone; TP 3 as 3 groups of 1: each expert whole on one rank). PEFT makes two adapters
in the test with random A and B: "e" (r 4 on both expert tensors and q_proj), "d" (r 8,
rsLoRA, on the experts' down_proj alone).

- the logits of each adapter within 1e-12 of PEFT's, and a batch mixing "e", none and "d"
  equal row by row to each row alone;
- one SGD step on "e" equal to PEFT's within 1e-10 for every tensor; the stepped adapter saved
  by tp loads into PEFT and gives PEFT's stepped logits;
- a fresh adapter (add_adapter) starts as PEFT's does: B zeros, the logits the base's;
- torch.compile(fullgraph=True): one graph, its logits and gradients equal eager's;
- DCP: the adapters saved at TP 4 (2 groups of 2) load at TP 1, 2 and 3 (3 groups of 1);
- a folder tp cannot read exactly is refused on every rank, naming what.
"""

import json
import shutil

import pytest
import torch

import peft

import family_fixtures
import launcher
import lora_checks
import tp

SHAPES = dict(hidden_size=48, intermediate_size=40, num_attention_heads=6, num_key_value_heads=1, head_dim=8,
              num_local_experts=6)
# Qwen2-MoE: the same experts beside a shared expert of 28 rows (uneven over 3) and its gate.
QWEN2_SHAPES = dict(hidden_size=48, moe_intermediate_size=40, shared_expert_intermediate_size=28,
                    num_attention_heads=6, num_key_value_heads=1, num_experts=6)
# Bare names, as users write them: PEFT puts them on the shared expert's projections and also
# reads them as transformers 4's per-expert names, converting them into targets on the stacked
# experts, with gate_up_proj at twice the rank and alpha (rank_pattern / alpha_pattern).
SHARED = ["gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "e": dict(r=4, lora_alpha=8, target_modules=["q_proj"],
              target_parameters=["experts.gate_up_proj", "experts.down_proj"]),
    "d": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=[], target_parameters=["experts.down_proj"]),
}
ROWS = ["e", None, "d"]
LR = 0.5


def _base_model(family):
    return family_fixtures.build(family, torch.float64, seed=3, **(QWEN2_SHAPES if family == "qwen2_moe" else SHAPES))


def _adapters(family):
    """ADAPTERS for `family`: on Qwen2-MoE "e" also on the shared expert's projections."""
    if family != "qwen2_moe":
        return ADAPTERS
    out = dict(ADAPTERS)
    out["e"] = dict(out["e"], target_modules=out["e"]["target_modules"] + SHARED)
    return out


def _peft(family, folder):
    return peft.PeftModel.from_pretrained(_base_model(family), str(folder)).double().eval()


def _make(root, family):
    root.mkdir(parents=True, exist_ok=True)
    base = _base_model(family)
    base.save_pretrained(root / "base", safe_serialization=True)
    for i, (name, kw) in enumerate(_adapters(family).items()):
        torch.manual_seed(200 + i)
        model = peft.get_peft_model(_base_model(family), peft.LoraConfig(init_lora_weights=False, **kw))
        with torch.no_grad():  # B larger than PEFT's own random draw, so every adapter changes the logits clearly
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 0.5)
        model.save_pretrained(root / name)
    vocab = base.config.vocab_size
    ids = torch.randint(1, vocab, (len(ROWS), 7), generator=torch.Generator().manual_seed(11))
    ref = {"ids": ids}
    with torch.no_grad():
        for name in ADAPTERS:
            ref[f"logits_{name}"] = _peft(family, root / name)(ids).logits
        ref["logits_none"] = base(ids).logits
    pm = peft.PeftModel.from_pretrained(_base_model(family), root / "e", is_trainable=True).double()
    ref.update(lora_checks.peft_sgd_step(pm, ids, LR))
    torch.save(ref, root / "reference.pt")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_moe")
    for family in ("mixtral", "gpt_oss", "qwen2_moe"):
        _make(root / family, family)
    return root


def _rank(rank, world, folder, ep):
    ref = torch.load(f"{folder}/reference.pt")
    ids = ref["ids"]
    model = tp.CausalLM.from_pretrained(f"{folder}/base", dtype=torch.float64, expert_parallel=ep,
                                        adapters={name: f"{folder}/{name}" for name in ADAPTERS})
    out = {}
    with torch.no_grad():
        for name in ADAPTERS:
            model.set_adapter(name)
            out[f"logits_{name}"] = model.gather_logits(model(ids))
        model.set_adapter(None)
        out["logits_none"] = model.gather_logits(model(ids))
        out["mixed"] = model.gather_logits(model(ids, adapter_names=ROWS))
        try:  # merging into the stacked experts is refused, before any weight changes
            model.merge_adapter("e")
            out["merge"] = "merged"
        except ValueError as e:
            out["merge"] = str(e)
        model.set_adapter(None)
        out["after_merge"] = model.gather_logits(model(ids))
    out.update(lora_checks.tp_sgd_step(model, ids, "e", LR))
    model.save_adapter(f"{folder}/saved_{world}_{ep}", "e")
    with torch.no_grad():
        # A fresh adapter: PEFT's init (A random, B zeros), so the base's logits.
        model.add_adapter("fresh", r=4, lora_alpha=8, target_modules=[],
                          target_parameters=["experts.gate_up_proj", "experts.down_proj"])
        model.set_adapter("fresh")
        out["fresh_logits"] = model.gather_logits(model(ids))
        out["fresh"] = model.gather_adapter("fresh")
    return out


def _err(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize("family,world,ep", [
    ("mixtral", 1, 1), ("mixtral", 2, 1), ("mixtral", 3, 1), ("mixtral", 4, 1), ("mixtral", 4, 2),
    ("mixtral", 3, 3), ("gpt_oss", 3, 1), ("gpt_oss", 4, 2), ("qwen2_moe", 3, 1), ("qwen2_moe", 4, 2),
])
def test_expert_lora_equals_peft(folders, family, world, ep):
    folder = folders / family
    ref = torch.load(folder / "reference.pt")
    results = launcher.run(world, _rank, str(folder), ep, timeout=600)
    scale = max(1.0, ref["logits_e"].abs().max().item())
    for rank, r in enumerate(results):
        where = f"{family} world {world} ep {ep} rank {rank}"
        for name in ADAPTERS:
            assert _err(r[f"logits_{name}"], ref[f"logits_{name}"]) <= 1e-12 * scale, f"{where} adapter {name}"
            assert _err(r[f"logits_{name}"], ref["logits_none"]) > 1e-3, f"{where} adapter {name} changes nothing"
        assert _err(r["logits_none"], ref["logits_none"]) <= 1e-12 * scale, where
        for i, name in enumerate(ROWS):
            key = name or "none"
            assert _err(r["mixed"][i], ref[f"logits_{key}"][i]) <= 1e-12 * scale, f"{where} mixed row {i} ({key})"
        assert "cannot merge into" in r["merge"], f"{where}: {r['merge']}"
        assert torch.equal(r["after_merge"], r["logits_none"]), f"{where}: a refused merge changed the model"
        assert abs(r["loss"].item() - ref["loss"].item()) <= 1e-12, where
        assert sorted(r["stepped"]) == sorted(ref["stepped"]), where
        for k, v in ref["stepped"].items():
            assert _err(r["stepped"][k], v) <= 1e-10, f"{where} {k}"
        assert _err(r["stepped_logits"], ref["stepped_logits"]) <= 1e-10 * scale, where
        assert _err(r["fresh_logits"], ref["logits_none"]) <= 1e-12 * scale, f"{where} fresh adapter"
        fresh = r["fresh"]
        assert len(fresh) == 4 * 2, where  # A and B of two projections in each of 2 layers
        for k, v in fresh.items():
            if "lora_B" in k:
                assert torch.count_nonzero(v) == 0, f"{where} {k}"
            else:  # PEFT's Kaiming-uniform bound 1 / sqrt(in), every expert's rows drawn
                assert 0 < v.abs().max() <= v.shape[1] ** -0.5 and (v.abs().sum(1) > 0).all(), f"{where} {k}"
            assert torch.equal(v, results[0]["fresh"][k]), f"{where} {k} differs from rank 0's"
    with torch.no_grad():
        pm = _peft(family, folder / f"saved_{world}_{ep}")
        assert _err(pm(ref["ids"]).logits, ref["stepped_logits"]) <= 1e-10 * scale
    config = json.loads((folder / f"saved_{world}_{ep}" / "adapter_config.json").read_text())
    assert set(ADAPTERS["e"]["target_parameters"]) <= set(config["target_parameters"])
    if family == "qwen2_moe":  # PEFT's patterns written back: the experts' gate_up at twice the rank and alpha
        assert list(config["rank_pattern"].values()) == [8] and list(config["alpha_pattern"].values()) == [16]
    assert sorted(config["target_modules"]) == sorted(_adapters(family)["e"]["target_modules"])


def _dcp_rank(rank, world, folder, path, save, ep):
    import torch.distributed.checkpoint as dcp

    model = tp.CausalLM.from_pretrained(f"{folder}/base", dtype=torch.float64, expert_parallel=ep)
    for name in ADAPTERS:
        model.load_adapter(f"{folder}/{name}", name)
    if not save:  # every adapter tensor zeroed, to be filled by the load
        with torch.no_grad():
            for _, p in model.adapter_parameters():
                p.zero_()
    (dcp.save if save else dcp.load)(tp.dcp_state_dict(model), checkpoint_id=path)
    return {name: model.gather_adapter(name) for name in ADAPTERS}


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_expert_lora_dcp_saved_at_tp4_loads_at_tp1_to_3(folders, family):
    folder = folders / family
    path = str(folder / "dcp_tp4")
    saved = launcher.run(4, _dcp_rank, str(folder), path, True, 2)[0]
    for world, ep in ((1, 1), (2, 1), (3, 3)):
        for rank, loaded in enumerate(launcher.run(world, _dcp_rank, str(folder), path, False, ep)):
            for name in ADAPTERS:
                assert sorted(loaded[name]) == sorted(saved[name]), (world, rank, name)
                for k, v in saved[name].items():
                    assert torch.equal(loaded[name][k], v), f"world {world} rank {rank} {k}"


def _compile_rank(rank, world, folder, ep):
    """torch.compile(fullgraph=True) through the experts' adapters: one graph (the block's
    operator takes its adapters' stacks after its own tensors), a mixed batch's logits and a
    training step's adapter gradients equal eager's."""
    ids = torch.load(f"{folder}/reference.pt")["ids"]
    model = tp.CausalLM.from_pretrained(f"{folder}/base", dtype=torch.float64, expert_parallel=ep,
                                        adapters={name: f"{folder}/{name}" for name in ADAPTERS})
    compiled, out = lora_checks.compiled_mixed_batch(model, ids, ROWS)
    out.update(lora_checks.adapter_grads_eager_and_compiled(model, compiled, ids, "e"))
    return out


@pytest.mark.parametrize("world,ep", [(2, 1), (4, 2)])
def test_expert_lora_compiles_to_one_graph_equal_to_eager(folders, world, ep):
    for rank, r in enumerate(launcher.run(world, _compile_rank, str(folders / "mixtral"), ep, timeout=600)):
        where = f"world {world} ep {ep} rank {rank}"
        assert r["breaks"] == 0, where
        scale = max(1.0, r["eager"].abs().max().item())
        assert _err(r["compiled"], r["eager"]) <= 1e-12 * scale, where
        assert len(r["grads_eager"]) == len(r["grads_compiled"]) == 2 * 2 + 4 * 2, where  # q_proj's A, B; 4 stacks
        for i, (a, b) in enumerate(zip(r["grads_eager"], r["grads_compiled"])):
            assert a is not None and b is not None, f"{where} adapter tensor {i} has no gradient"
            assert a.abs().max() > 0, f"{where} adapter tensor {i} has a zero gradient"
            assert _err(a, b) <= 1e-10 * max(1.0, a.abs().max().item()), f"{where} adapter tensor {i}"


def _refusal(rank, world, folder, adapter):
    model = tp.CausalLM.from_pretrained(f"{folder}/base", dtype=torch.float64)
    try:
        model.load_adapter(f"{folder}/{adapter}", "x")
    except ValueError as e:
        return str(e), model.adapters
    return "loaded", model.adapters


def _variant(folder, name, edit_config):
    dst = folder / name
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(folder / "e", dst)
    path = dst / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(edit_config)
    path.write_text(json.dumps(config))
    return name


def test_expert_lora_refusals(folders):
    folder = folders / "mixtral"
    cases = {
        _variant(folder, "no_param", {"target_parameters": ["experts.gate_up_proj", "experts.w9"]}): "'experts.w9'",
        _variant(folder, "experts_module", {"target_modules": ["q_proj", "experts"]}): "target_parameters",
        _variant(folder, "router", {"target_modules": ["q_proj", "mlp.gate"]}): "the router",
        # The down adapter's tensors under the name the gate_up one has with both targeted: read
        # as gate_up's, their shapes do not fit.
        _variant(folder, "one_param", {"target_parameters": ["experts.gate_up_proj"]}): "has shape",
    }
    for adapter, expected in cases.items():
        for rank, (message, names) in enumerate(launcher.run(2, _refusal, str(folder), adapter)):
            assert expected in message, f"{adapter} rank {rank}: {message}"
            assert names == [], (adapter, rank, names)
