"""LoRA adapters on tp.CausalLM against PEFT's own PeftModel over transformers' model (the
real client), at TP 1-4, in float64.

The base is a Llama with one KV head (every rank of a world > 1 holds a replica of k and v),
6 query heads (uneven over 4), an intermediate size of 40 (uneven over 3) and a vocabulary
of 64 (uneven over 3, and 48 / 16 under the 3:1 split). PEFT makes three adapters in the
test: "a" (r 8 on every linear layer, the embedding and the LM head), "b" (r 16, rsLoRA, on
q_proj and v_proj), "c" (r 8 on gate_proj and down_proj), with random A and B.

- the logits of each adapter within 1e-12 of PEFT's, and 8 greedy tokens equal;
- a batch mixing "a", "b", no adapter and "c" equal, row by row, to each row alone;
- one SGD step on A and B (the base frozen) equal to PEFT's within 1e-10 for every adapter
  tensor; the stepped adapter saved by tp (at every TP size, TP 4 included) loads into PEFT
  and gives PEFT's logits;
- at TP 2 with split weights 3:1 (a cut `dim / world` would miss) the logits again;
- under torch.compile(fullgraph=True) one graph at TP 1 and 3, its logits for two selections
  and its adapter gradients equal eager's;
- a folder tp cannot read exactly is refused on every rank, naming what: DoRA, a target
  that matches nothing, a target without its tensors, a tensor nothing reads, a saved copy
  of the embedding (PEFT's save_embedding_layers) that differs from the base's.
"""

import json
import os
import shutil

import pytest
import torch

import peft
import transformers

import launcher
import lora_checks
import tp

ADAPTERS = {
    "a": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                  "down_proj", "embed_tokens", "lm_head"]),
    "b": dict(r=16, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj"]),
    "c": dict(r=8, lora_alpha=32, target_modules=["gate_proj", "down_proj"]),
}
ROWS = ["a", "b", None, "c"]
LR = 0.5
NEW_TOKENS = 8


def _base_model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
                                      num_attention_heads=6, num_key_value_heads=1, head_dim=8,
                                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None)
    return transformers.LlamaForCausalLM(config).double().eval()


def _greedy(model, ids):
    """transformers' generate(do_sample=False): NEW_TOKENS tokens, no stop token."""
    config = transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                           bos_token_id=None, pad_token_id=0)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[:, ids.shape[1]:]


def _peft(folder, name):
    return peft.PeftModel.from_pretrained(_base_model(), f"{folder}/{name}").double().eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = _base_model()
    base.save_pretrained(root / "base", safe_serialization=True)
    for i, (name, kw) in enumerate(ADAPTERS.items()):
        torch.manual_seed(100 + i)
        model = peft.get_peft_model(_base_model(), peft.LoraConfig(init_lora_weights=False, **kw))
        model.save_pretrained(root / name)
    ids = torch.randint(1, 64, (len(ROWS), 7), generator=torch.Generator().manual_seed(7))
    ref = {"ids": ids}
    with torch.no_grad():
        for name in ADAPTERS:
            pm = _peft(root, name)
            ref[f"logits_{name}"] = pm(ids).logits
            ref[f"tokens_{name}"] = _greedy(pm, ids)
        ref["logits_none"] = base.eval()(ids).logits
        ref["tokens_none"] = _greedy(base, ids)
    # One SGD step on adapter "a"'s A and B, the base frozen.
    pm = peft.PeftModel.from_pretrained(_base_model(), root / "a", is_trainable=True).double()
    ref.update(lora_checks.peft_sgd_step(pm, ids, LR))
    torch.save(ref, root / "reference.pt")
    return root


def _rank(rank, world, folder, weights):
    folder = str(folder)
    ref = torch.load(f"{folder}/reference.pt")
    ids = ref["ids"]
    model = tp.CausalLM.from_pretrained(f"{folder}/base", dtype=torch.float64, split_weights=weights,
                                        adapters={name: f"{folder}/{name}" for name in ADAPTERS})
    out = {"adapters": model.adapters}
    with torch.no_grad():
        for name in ADAPTERS:
            model.set_adapter(name)
            out[f"logits_{name}"] = model.gather_logits(model(ids))
            out[f"tokens_{name}"] = model.generate(ids, NEW_TOKENS)
        model.set_adapter(None)
        out["logits_none"] = model.gather_logits(model(ids))
        out["mixed"] = model.gather_logits(model(ids, adapter_names=ROWS))
        out["mixed_tokens"] = model.generate(ids, NEW_TOKENS, adapter_names=ROWS)
        # Merged into the base (every rank its slices): the adapter's logits; unmerged: the base's.
        model.merge_adapter("a")
        out["merged"] = model.gather_logits(model(ids))
        try:
            model(ids, adapter_names=ROWS)
        except ValueError as e:
            out["merged_refusal"] = str(e)
        model.unmerge_adapter("a")
        model.set_adapter(None)
        out["unmerged"] = model.gather_logits(model(ids))
    if weights:
        return out
    # One SGD step on "a" alone, the base frozen; saved at this TP size for PEFT.
    out.update(lora_checks.tp_sgd_step(model, ids, "a", LR))
    model.save_adapter(f"{folder}/saved_{world}", "a")
    return out


def _err(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_lora_equals_peft(folder, world):
    ref = torch.load(folder / "reference.pt")
    results = launcher.run(world, _rank, str(folder), None, timeout=600)
    scale = max(1.0, ref["logits_a"].abs().max().item())
    for rank, r in enumerate(results):
        where = f"world {world} rank {rank}"
        assert r["adapters"] == sorted(ADAPTERS)
        for name in ADAPTERS:
            assert _err(r[f"logits_{name}"], ref[f"logits_{name}"]) <= 1e-12 * scale, f"{where} adapter {name}"
            assert torch.equal(r[f"tokens_{name}"], ref[f"tokens_{name}"]), f"{where} adapter {name} tokens"
        assert _err(r["logits_none"], ref["logits_none"]) <= 1e-12 * scale, where
        assert _err(r["merged"], ref["logits_a"]) <= 1e-12 * scale, f"{where} merged"
        assert "merged into the base" in r["merged_refusal"], where
        assert _err(r["unmerged"], ref["logits_none"]) <= 1e-12 * scale, f"{where} unmerged"
        # The mixed batch, row by row, equals each row alone (its logits and its greedy tokens).
        for i, name in enumerate(ROWS):
            key = name or "none"
            assert _err(r["mixed"][i], ref[f"logits_{key}"][i]) <= 1e-12 * scale, f"{where} mixed row {i} ({key})"
            assert torch.equal(r["mixed_tokens"][i], ref[f"tokens_{key}"][i]), f"{where} mixed row {i} tokens"
        # The SGD step: the loss and every adapter tensor after it.
        assert abs(r["loss"].item() - ref["loss"].item()) <= 1e-12, where
        assert sorted(r["stepped"]) == sorted(ref["stepped"]), where
        for k, v in ref["stepped"].items():
            assert _err(r["stepped"][k], v) <= 1e-10, f"{where} {k}"
        assert _err(r["stepped_logits"], ref["stepped_logits"]) <= 1e-10 * scale, where
    # What tp saved at this TP size loads into PEFT and gives PEFT's own stepped logits.
    with torch.no_grad():
        pm = _peft(folder, f"saved_{world}")
        assert _err(pm(ref["ids"]).logits, ref["stepped_logits"]) <= 1e-10 * scale
    config = json.loads((folder / f"saved_{world}" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16 and config["peft_type"] == "LORA"


def test_lora_weighted_split_equals_peft(folder):
    ref = torch.load(folder / "reference.pt")
    results = launcher.run(2, _rank, str(folder), [3.0, 1.0], timeout=600)
    scale = max(1.0, ref["logits_a"].abs().max().item())
    for rank, r in enumerate(results):
        for name in ADAPTERS:
            assert _err(r[f"logits_{name}"], ref[f"logits_{name}"]) <= 1e-12 * scale, f"rank {rank} {name}"
        for i, name in enumerate(ROWS):
            alone = ref[f"logits_{name}" if name else "logits_none"][i]
            assert _err(r["mixed"][i], alone) <= 1e-12 * scale, f"rank {rank} mixed row {i}"


def _refusal(rank, world, folder, adapter):
    model = tp.CausalLM.from_pretrained(f"{folder}/base", dtype=torch.float64)
    try:
        model.load_adapter(f"{folder}/{adapter}", "x")
    except ValueError as e:
        # Nothing of the refused adapter stays: the name loads again, and only its tensors are there.
        model.load_adapter(f"{folder}/b", "x")
        return str(e), model.adapters, len(model.adapter_parameters())
    return "loaded", model.adapters, 0


def _variant(folder, name, edit_config=None, extra_tensor=None, source="b"):
    dst = folder / name
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(folder / source, dst)
    if edit_config:
        path = dst / "adapter_config.json"
        config = json.loads(path.read_text())
        config.update(edit_config)
        path.write_text(json.dumps(config))
    if extra_tensor:
        from safetensors.torch import load_file, save_file

        tensors = load_file(dst / "adapter_model.safetensors")
        tensors.update(extra_tensor)
        save_file(tensors, dst / "adapter_model.safetensors")
    return name


def test_lora_refuses_what_it_cannot_compute(folder):
    cases = {
        _variant(folder, "dora", {"use_dora": True}): "DoRA",
        _variant(folder, "nothing", {"target_modules": ["q_proj", "v_proj", "rotary_emb"]}): "'rotary_emb'",
        _variant(folder, "lm_head", {"target_modules": ["q_proj", "v_proj", "lm_head"]}):
            "holds no base_model.model.lm_head.lora_A.weight",
        _variant(folder, "pattern", {"rank_pattern": {"q_proj": 4}}): "rank_pattern",
        _variant(folder, "pissa", {"init_lora_weights": "pissa"}): "rewrites the base weights",
        _variant(folder, "unread", extra_tensor={"base_model.model.lm_head.lora_A.weight": torch.zeros(16, 48,
                                                                                                     dtype=torch.float64)}):
            "base_model.model.lm_head.lora_A.weight",
        _variant(folder, "resized", source="a", extra_tensor={
            "base_model.model.model.embed_tokens.base_layer.weight": torch.ones(64, 48, dtype=torch.float64)}):
            "differs from this model's own",
    }
    for adapter, expected in cases.items():
        results = launcher.run(2, _refusal, str(folder), adapter)
        for rank, (message, names, params) in enumerate(results):
            assert expected in message, f"{adapter} rank {rank}: {message}"
            assert names == ["x"] and params == 2 * 2 * 2, (adapter, rank, names, params)  # b: q, v of 2 layers


def _dcp_rank(rank, world, folder, path, save):
    import torch.distributed.checkpoint as dcp

    model = tp.CausalLM.from_pretrained(f"{folder}/base", dtype=torch.float64)
    if save:
        model.load_adapter(f"{folder}/a", "a")
        model.load_adapter(f"{folder}/b", "b")
        dcp.save(tp.dcp_state_dict(model), checkpoint_id=path)
    else:
        # Fresh adapters of the same shapes (A random, B zeros), filled by the load.
        model.add_adapter("a", **ADAPTERS["a"])
        model.add_adapter("b", **ADAPTERS["b"])
        dcp.load(tp.dcp_state_dict(model), checkpoint_id=path)
    return {name: model.gather_adapter(name) for name in ("a", "b")}


def test_lora_dcp_saved_at_tp4_loads_at_tp1_to_3(folder):
    path = str(folder / "dcp_tp4")
    saved = launcher.run(4, _dcp_rank, str(folder), path, True)[0]
    for world in (1, 2, 3):
        for rank, loaded in enumerate(launcher.run(world, _dcp_rank, str(folder), path, False)):
            for name in ("a", "b"):
                assert sorted(loaded[name]) == sorted(saved[name]), (world, rank, name)
                for k, v in saved[name].items():
                    assert torch.equal(loaded[name][k], v), f"world {world} rank {rank} {k}"


def _compile_rank(rank, world, folder):
    """The model with adapters under torch.compile(fullgraph=True): one graph (each layer's
    operator takes its adapters as parameters); a mixed batch's logits and a training step's
    adapter gradients equal eager's (the C++ model whole); adapter_names refused inside."""
    folder = str(folder)
    ids = torch.load(f"{folder}/reference.pt")["ids"]
    model = tp.CausalLM.from_pretrained(f"{folder}/base", dtype=torch.float64)
    for name in ADAPTERS:
        model.load_adapter(f"{folder}/{name}", name)
    compiled, out = lora_checks.compiled_mixed_batch(model, ids, ROWS)
    with torch.no_grad():
        model.set_adapter("c")  # the same graph, another selection
        out["eager_c"], out["compiled_c"] = model(ids), compiled(ids)
    out.update(lora_checks.adapter_grads_eager_and_compiled(model, compiled, ids, "a"))
    try:
        compiled(ids, adapter_names=ROWS)
    except Exception as e:  # noqa: BLE001 - dynamo wraps the refusal
        out["refusal"] = str(e)
    return out


def test_lora_compiles_to_one_graph_equal_to_eager(folder):
    for world in (1, 3):
        for rank, r in enumerate(launcher.run(world, _compile_rank, str(folder), timeout=600)):
            where = f"world {world} rank {rank}"
            assert r["breaks"] == 0, where
            scale = max(1.0, r["eager"].abs().max().item())
            # The operators run without autograd (the adapters' inference path: addmm into the
            # output), eager with it: the same sums in another order.
            assert _err(r["compiled"], r["eager"]) <= 1e-12 * scale, where
            assert _err(r["compiled_c"], r["eager_c"]) <= 1e-12 * scale, where
            assert _err(r["compiled_c"], r["eager"]) > 1e-6, where  # the selection was read at run time
            assert len(r["grads_eager"]) == len(r["grads_compiled"]) > 0, where
            for i, (a, b) in enumerate(zip(r["grads_eager"], r["grads_compiled"])):
                assert a is not None and b is not None, f"{where} adapter tensor {i} has no gradient"
                assert _err(a, b) <= 1e-10 * max(1.0, a.abs().max().item()), f"{where} adapter tensor {i}"
            assert "set_adapter" in r.get("refusal", ""), where


def _tied_merge_rank(rank, world, folder):
    model = tp.CausalLM.from_pretrained(f"{folder}/tied", dtype=torch.float64)
    model.add_adapter("t", r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"])
    ids = torch.load(f"{folder}/reference.pt")["ids"]
    with torch.no_grad():
        before = model.gather_logits(model(ids))
        try:
            model.merge_adapter("t")
            message = "merged"
        except ValueError as e:
            message = str(e)
        after = model.gather_logits(model(ids))
    return message, torch.equal(before, after)


def test_lora_merge_into_a_tied_table_is_refused(folder):
    """A tied embedding is the LM head's weight too: merging an adapter into it would change
    both, so it is refused on every rank before any weight (q_proj's included) changes."""
    if not (folder / "tied").exists():
        torch.manual_seed(5)
        config = _base_model().config
        config.tie_word_embeddings = True
        transformers.LlamaForCausalLM(config).double().save_pretrained(folder / "tied", safe_serialization=True)
    for rank, (message, unchanged) in enumerate(launcher.run(2, _tied_merge_rank, str(folder))):
        assert "tie_word_embeddings" in message, f"rank {rank}: {message}"
        assert unchanged, f"rank {rank}: a refused merge changed the model"
