"""Tiny Hugging Face folders of the model families tp reads beyond Llama / Qwen (Mistral,
Phi-3, GPT-NeoX, Gemma 2, Gemma 3 text; test_model_families.py), made by transformers' own
config and model classes with random weights, with transformers' own outputs as the
reference.

    fixtures = family_fixtures.make(OUT_DIR)          # or make(OUT_DIR, ("phi3",))
    python tests/python/family_fixtures.py OUT_DIR [NAME ...]

For each family NAME, OUT_DIR holds:
- NAME/    config.json + sharded safetensors (float64), as save_pretrained wrote them;
- NAME.reference.safetensors:
    model.prompt      [B, P] int64, random tokens;
    model.logits      [B, P, vocab] float64: transformers' forward of the prompt;
    model.generated   [B, NEW_TOKENS] int64: its generate(do_sample=False) after the prompt,
                      no EOS; each token checked to be the argmax of a plain forward of the
                      sequence so far;
    model.full_logits [B, P + NEW_TOKENS - 1, vocab] float64: a plain forward of the prompt
                      and every generated token but the last: row j is what a cached decode
                      gives at position j. Not for phi3's rows j < original_max_position_
                      embeddings: this sequence is longer than that, so every row of it uses
                      LongRoPE's long factor, where decoding at j used the short one;
- manifest.json: {NAME: what make() measured to prove each feature is exercised}.

Each maker asserts that the features it is there for change the output: a sliding window
shorter than the prompt (a twin model without it gives other logits), LongRoPE's long
factor (a twin whose long factor is the short one gives other logits), softcaps that the
raw values exceed. Weights are drawn as checkpoints.build_model draws them.

No tp import: this runs before (and without) a tp build.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import torch

BATCH, NEW_TOKENS = 2, 16
SHARD = "200KB"

# LongRoPE over rotary_dim = 16 * 0.5 = 8 (4 frequencies). original_max_position_embeddings
# 12 lies between the prompt (8) and prompt + generation (24); max_position_embeddings /
# original = 4 gives attention_factor sqrt(1 + ln 4 / ln 12).
PHI3_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
             "short_factor": [1.0, 1.25, 1.5, 2.0], "long_factor": [1.5, 3.0, 6.0, 12.0]}

_COMMON = dict(num_hidden_layers=2, vocab_size=128)

# Gemma's embeddings are scaled by sqrt(hidden) and tied to the LM head: drawn N(0, 1), the
# residual stream is the input token's own embedding and every position predicts its own
# token (greedy generation repeats the last prompt token 16 times); 0.02 (Gemma's
# initializer_range) leaves the layers' outputs the larger part. Generation still settles on
# repeated tokens after a few steps (random tied models do); model.full_logits lets a test
# check every decode step, not only its argmax.
GEMMA_EMBED_STD = 0.02

# name -> config_class / model_class (transformers' names), prompt length, config kwargs.
#   mistral: 12 heads / 4 KV heads, head_dim 16 given explicitly (hidden / heads = 10.7);
#            TP 1, 2, 4 split the KV heads evenly, TP 3 unevenly. Window 4 < prompt 8.
#   phi3:    fused qkv_proj / gate_up_proj; head_dim is hidden / heads (Phi3Config has no
#            head_dim field); partial rotary 0.5; window 5 < prompt 8; LongRoPE as above.
#   gpt_neox: fused per-head interleaved query_key_value, LayerNorm with bias, rotary 0.25,
#            parallel residual, exact gelu, untied embed_out (Pythia's layout).
#   gpt_neox_seq: sequential residual, gelu_fast (GPT-NeoX-20B's activation), rotary 0.5.
#   gemma2 / gemma3: 8 heads / 4 KV heads, head_dim 32 != hidden / heads: TP 1-4 all work
#            (TP 3 splits the KV groups 2, 1, 1). Layer 0 sliding (window 4 < prompt 8),
#            layer 1 full; query_pre_attn_scalar != head_dim; tied embeddings.
FAMILIES = {
    "mistral": dict(config_class="MistralConfig", model_class="MistralForCausalLM", prompt=8, config=dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=12, num_key_value_heads=4, head_dim=16,
        sliding_window=4, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **_COMMON)),
    "phi3": dict(config_class="Phi3Config", model_class="Phi3ForCausalLM", prompt=8, config=dict(
        hidden_size=192, intermediate_size=256, num_attention_heads=12, num_key_value_heads=4,
        partial_rotary_factor=0.5, sliding_window=5, original_max_position_embeddings=12,
        max_position_embeddings=48, rope_parameters=PHI3_ROPE, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        **_COMMON)),
    "gpt_neox": dict(config_class="GPTNeoXConfig", model_class="GPTNeoXForCausalLM", prompt=8, config=dict(
        hidden_size=96, intermediate_size=256, num_attention_heads=6, hidden_act="gelu", use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, **_COMMON)),
    "gpt_neox_seq": dict(config_class="GPTNeoXConfig", model_class="GPTNeoXForCausalLM", prompt=8, config=dict(
        hidden_size=96, intermediate_size=256, num_attention_heads=6, hidden_act="gelu_fast",
        use_parallel_residual=False, layer_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        tie_word_embeddings=False, **_COMMON)),
    "gemma2": dict(config_class="Gemma2Config", model_class="Gemma2ForCausalLM", prompt=8, config=dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=2.0,
        final_logit_softcapping=0.3, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, **_COMMON)),
    "gemma3": dict(config_class="Gemma3TextConfig", model_class="Gemma3ForCausalLM", prompt=8, config=dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=40, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}},
        tie_word_embeddings=True, **_COMMON)),
    # Mixtures of experts: Mixtral's 8 experts, top 2, renormalised (saved per expert as
    # block_sparse_moe.experts.{e}.w1 / w3 / w2); Qwen3-MoE's 16, top 4, norm_topk_prob,
    # layer 1 dense (mlp_only_layers), q/k norms. A decode step of 2 tokens leaves most
    # experts without a token.
    "mixtral": dict(config_class="MixtralConfig", model_class="MixtralForCausalLM", prompt=8, config=dict(
        hidden_size=128, intermediate_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
        num_local_experts=8, num_experts_per_tok=2, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **_COMMON)),
    "qwen3_moe": dict(config_class="Qwen3MoeConfig", model_class="Qwen3MoeForCausalLM", prompt=8, config=dict(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_attention_heads=8,
        num_key_value_heads=4, head_dim=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
        mlp_only_layers=[1], decoder_sparse_step=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **_COMMON)),
    # Qwen2-MoE: a shared expert (96 wide) scaled by its sigmoid gate beside 8 experts, top 2
    # not renormalised; q/k/v biased; 12 / 4 heads (uneven at TP 3).
    "qwen2_moe": dict(config_class="Qwen2MoeConfig", model_class="Qwen2MoeForCausalLM", prompt=8, config=dict(
        hidden_size=96, intermediate_size=256, moe_intermediate_size=48, shared_expert_intermediate_size=96,
        num_attention_heads=12, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **_COMMON)),
    # GLM-4.5: layer 0 dense (first_k_dense_replace), layer 1 a mixture of 16 experts routed
    # as DeepSeek-V3 does (sigmoid scores, a random correction bias that changes the
    # choice, 4 groups of which the best 2, top 4, renormalised, x 2.5), one shared expert;
    # q/k/v biased, q/k norms, rotary on half of each head.
    "glm4_moe": dict(config_class="Glm4MoeConfig", model_class="Glm4MoeForCausalLM", prompt=8, config=dict(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_attention_heads=8,
        num_key_value_heads=4, head_dim=32, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
        n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1,
        attention_bias=True, use_qk_norm=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, **_COMMON)),
    # Mixtral as transformers 5 holds it (save_pretrained(save_original_format=False)): one
    # [experts, 2 * intermediate, hidden] gate_up_proj and one [experts, hidden,
    # intermediate] down_proj per layer, under mlp.experts.
    "mixtral_fused": dict(config_class="MixtralConfig", model_class="MixtralForCausalLM", prompt=8,
                          save_original_format=False, config=dict(
        hidden_size=128, intermediate_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
        num_local_experts=8, num_experts_per_tok=2, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **_COMMON)),
    # GPT-OSS: attention sinks, q/k/v/o biased, layer 0 sliding (window 4 < prompt 8) and
    # layer 1 full, YaRN (GPT-OSS's own parameters, truncate false); 8 experts of 64, top 2
    # by a softmax of the top logits with the router's bias, expert biases, the clamped
    # swiglu with its limit low enough to clamp (0.8), stored fused as transformers writes
    # them (gate_up_proj [experts, hidden, 2 * intermediate], gate and up columns alternating).
    "gpt_oss": dict(config_class="GptOssConfig", model_class="GptOssForCausalLM", prompt=8, config=dict(
        hidden_size=128, intermediate_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=16,
        num_local_experts=8, num_experts_per_tok=2, sliding_window=4, swiglu_limit=0.8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False},
        tie_word_embeddings=False, **_COMMON)),
}


def _config(name: str, dtype: torch.dtype, **changes):
    import transformers

    spec = FAMILIES[name]
    kw = copy.deepcopy(spec["config"])  # transformers edits rope_parameters in place
    kw.update(copy.deepcopy(changes))
    config = getattr(transformers, spec["config_class"])(dtype=dtype, **kw)
    if is_moe(name):
        config._experts_implementation = "eager"  # grouped_mm has no float64
    return config


def is_moe(name: str) -> bool:
    return any(k in FAMILIES[name]["config"] for k in ("num_local_experts", "num_experts", "n_routed_experts"))


def _set_sinks(model, value):
    """GPT-OSS: every attention sink set to `value` (a twin without the sinks' share: -inf)."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(value)


def hf_kwargs(name: str) -> dict:
    """from_pretrained's extra arguments for family `name`: the eager experts of a mixture
    of experts (transformers' default grouped_mm has no float64)."""
    return {"experts_implementation": "eager"} if is_moe(name) else {}


def _model(name: str, config, dtype: torch.dtype):
    import transformers

    model = getattr(transformers, FAMILIES[name]["model_class"])(config).to(dtype)
    # Gemma's sqrt(hidden) embedding scale is a buffer made in float32: as from_pretrained
    # (which builds under the requested default dtype) it should be sqrt(hidden) in dtype.
    emb = model.get_input_embeddings()
    if hasattr(emb, "embed_scale"):
        emb.embed_scale.fill_(emb.scalar_embed_scale)
    return model.eval()


def build(name: str, dtype: torch.dtype = torch.float64, seed: int = 0, **config_changes):
    """transformers' *ForCausalLM of family `name`, every parameter drawn at random, in eval mode.

    As checkpoints.build_model: drawn in float32, then cast (the float64 model of a seed holds
    exactly the float32 model's values). Linear weights ~ N(0, 1/K); embeddings ~ N(0, 1);
    biases (LayerNorm's too) ~ 0.1 N(0, 1); norm weights ~ 1 + 0.1 N(0, 1). Gemma differs:
    its RMSNorms scale by (1 + weight), so the weight itself is 0.1 N(0, 1); its embeddings,
    multiplied by sqrt(hidden) and tied to the LM head, are GEMMA_EMBED_STD N(0, 1).
    config_changes replace config kwargs (the makers' twin models).
    """
    torch.manual_seed(seed)
    model = _model(name, _config(name, dtype, **config_changes), dtype)
    gemma = name.startswith("gemma")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():  # tied weights appear once
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if pname.endswith("norm.weight"):
                r = 0.1 * r if gemma else 1.0 + 0.1 * r
            elif pname.endswith(".bias"):
                r = 0.1 * r
            elif "embed_tokens" in pname or "embed_in" in pname:
                r = GEMMA_EMBED_STD * r if gemma else r
            else:
                r = r / p.shape[-1] ** 0.5
            p.copy_(r.to(dtype))
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                # DeepSeek-V3 / GLM routing: a correction that changes which experts are chosen,
                # kept in float32 as from_pretrained keeps it (with the router weight).
                b.data = 0.3 * torch.randn(b.shape, generator=gen, dtype=torch.float32)
        for mname, m in model.named_modules():
            if hasattr(m, "e_score_correction_bias"):
                m.weight.data = m.weight.data.to(torch.float32)
    return model


def _twin(name: str, model, **config_changes):
    """A model of the same weights with config kwargs replaced."""
    twin = _model(name, _config(name, model.dtype, **config_changes), model.dtype)
    twin.load_state_dict(model.state_dict())
    return twin


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _reference(model, prompt_len: int, vocab: int, seed: int) -> dict:
    """As hf_fixtures._model_reference, for a prompt of `prompt_len` tokens. generate fills
    the fields a GenerationConfig leaves None from model.generation_config, so eos_token_id=None
    alone would keep the config's EOS (which, inside a 128-token vocabulary, gets generated
    and pads the rest): the model's EOS is cleared while it runs."""
    from transformers import GenerationConfig

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (BATCH, prompt_len), generator=g)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, bos_token_id=None,
                              pad_token_id=0)
    saved = model.generation_config
    model.generation_config = copy.deepcopy(saved)
    model.generation_config.eos_token_id = None
    try:
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    finally:
        model.generation_config = saved
    generated = out[:, prompt_len:]
    assert generated.shape == (BATCH, NEW_TOKENS), generated.shape
    for i in range(NEW_TOKENS):
        step = _logits(model, out[:, : prompt_len + i])[:, -1]
        assert torch.equal(step.argmax(-1), generated[:, i]), f"generate's token {i} is not the argmax"
    return {"model.prompt": prompt, "model.logits": _logits(model, prompt).contiguous(),
            "model.generated": generated.contiguous(),
            "model.full_logits": _logits(model, out[:, :-1]).contiguous()}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _max_attention_score(model, ids) -> float:
    """The largest |q.k * scaling| over unmasked pairs that Gemma 2's eager attention computes
    before its softcap (the function is wrapped while `model` runs)."""
    import transformers.models.gemma2.modeling_gemma2 as m

    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    seen, original = [], m.eager_attention_forward

    def spy(module, query, key, value, attention_mask, **kw):
        s = query @ m.repeat_kv(key, module.num_key_value_groups).transpose(2, 3) * kw["scaling"]
        if attention_mask is not None:
            keep = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
            s = s.masked_fill(~keep, 0)
        seen.append(s.abs().max().item())
        return original(module, query, key, value, attention_mask, **kw)

    m.eager_attention_forward = spy
    try:
        _logits(model, ids)
    finally:
        m.eager_attention_forward = original
    assert len(seen) == model.config.num_hidden_layers
    return max(seen)


def _checks(name: str, model, ref: dict) -> dict:
    """Asserts that the family's features change its outputs; returns what was measured.
    A "*_change" is the largest logit difference from a twin model without the feature."""
    cfg, prompt = model.config, ref["model.prompt"]
    seq = torch.cat([prompt, ref["model.generated"][:, :-1]], 1)  # what full_logits ran
    out = {}

    def change(key, ids, expected, **config_changes):
        out[key] = _max_diff(_logits(_twin(name, model, **config_changes), ids), expected)
        assert out[key] > 1e-3, f"{name}: {key} = {out[key]}: the feature does not change the output"

    if getattr(cfg, "sliding_window", None):  # None or 0 (Qwen2-MoE without use_sliding_window): no window
        assert cfg.sliding_window < prompt.shape[1], "the window must be shorter than the prompt"
        if cfg.model_type.startswith("gemma") or cfg.model_type == "gpt_oss":  # layer_types keeps sliding layers: widen the window
            change("no_window_change", prompt, ref["model.logits"], sliding_window=4096)
        else:
            change("no_window_change", prompt, ref["model.logits"], sliding_window=None)
    if cfg.model_type == "phi3":
        omp = cfg.original_max_position_embeddings
        assert prompt.shape[1] <= omp < seq.shape[1], (prompt.shape, omp)
        rope = dict(FAMILIES[name]["config"]["rope_parameters"], long_factor=PHI3_ROPE["short_factor"])
        change("long_factor_change", seq, ref["model.full_logits"], rope_parameters=rope)
        short = _twin(name, model, rope_parameters=rope)  # the prompt must not see the long factor
        assert _max_diff(_logits(short, prompt), ref["model.logits"]) == 0
    if cfg.model_type == "gemma3_text":
        full = FAMILIES[name]["config"]["rope_parameters"]["full_attention"]
        change("one_rope_change", prompt, ref["model.logits"],
               rope_parameters={"sliding_attention": full, "full_attention": full})
    if cfg.model_type == "gpt_oss":
        no_sinks = _twin(name, model)
        _set_sinks(no_sinks, float("-inf"))
        out["sinks_change"] = _max_diff(_logits(no_sinks, prompt), ref["model.logits"])
        assert out["sinks_change"] > 1e-3, f"{name}: the attention sinks change nothing"
        change("no_clamp_change", prompt, ref["model.logits"], swiglu_limit=1e9)
    if cfg.model_type == "gemma2":
        with torch.no_grad():
            raw = model.lm_head(model.model(prompt).last_hidden_state)
        out["raw_logit_max"] = raw.abs().max().item()
        out["raw_logits_over_cap"] = (raw.abs() > cfg.final_logit_softcapping).double().mean().item()
        assert out["raw_logit_max"] > 2 * cfg.final_logit_softcapping, out
        out["attention_score_max"] = _max_attention_score(model, prompt)
        assert out["attention_score_max"] > 2 * cfg.attn_logit_softcapping, out
    return out


def _make_one(out: Path, name: str, seed: int) -> dict:
    import shutil

    from safetensors.torch import save_file

    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)  # no stale shards from an earlier run
    model = build(name, torch.float64, seed)
    model.save_pretrained(folder, max_shard_size=SHARD,
                          save_original_format=FAMILIES[name].get("save_original_format", True))
    ref = _reference(model, FAMILIES[name]["prompt"], model.config.vocab_size, seed + 200)
    checks = _checks(name, model, ref)
    # what a user of the folder gets: from_pretrained must give the reference logits
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, **hf_kwargs(name)).eval()
    assert _max_diff(_logits(loaded, ref["model.prompt"]), ref["model.logits"]) == 0, name
    save_file(ref, str(out / f"{name}.reference.safetensors"))
    return {"model_type": model.config.model_type, "prompt": FAMILIES[name]["prompt"], "new_tokens": NEW_TOKENS,
            "checks": checks}


def make(out, names=tuple(FAMILIES), seed: int = 0) -> dict:
    """Writes the families `names` under `out` (see the module doc); returns the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    manifest = {}
    for name in names:
        if name not in FAMILIES:
            raise ValueError(f"unknown family {name!r}; expected one of {tuple(FAMILIES)}")
        # a family's seed does not depend on which others are made with it
        manifest[name] = _make_one(out, name, seed + 10 * list(FAMILIES).index(name))
    with open(out / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


# GPTQ 4-bit folders of each family (checkpoints.py's GPTQ v1 packer, gptqmodel's
# quantization_config): every decoder linear quantized as the checkpoint stores it (Phi-3's
# fused qkv_proj and gate_up_proj, GPT-NeoX's per-head query_key_value each one module),
# group 32, so that TP 2 cuts every row layer's K into whole groups (GPT-NeoX with head_dim
# 32 for that: hidden 192 over its 6 heads). name -> (family, config changes).
GPTQ_GROUP = 32
GPTQ_FAMILIES = {
    "mistral_gptq": ("mistral", {}),
    "phi3_gptq": ("phi3", {}),
    "gpt_neox_gptq": ("gpt_neox", dict(hidden_size=192)),
    "gemma2_gptq": ("gemma2", {}),
    "gemma3_gptq": ("gemma3", {}),
}


def make_gptq(out, name: str, seed: int = 0) -> dict:
    """Writes out/NAME (config.json with quantization_config, model.safetensors: qweight,
    qzeros, scales, g_idx per decoder linear, biases in float16 as the GPTQ tools store
    them) and out/NAME.reference.safetensors: model.prompt and model.logits [B, P, vocab],
    transformers' float64 forward with every quantized weight replaced by its GPTQ
    dequantization (the format's float64 model), and model.logits_float32, the same model
    in float32 (the peer's float32 error). Returns {"quantized": names}."""
    import re
    import shutil

    from safetensors.torch import load_file, save_file

    import checkpoints as C

    family, changes = GPTQ_FAMILIES[name]
    folder = Path(out) / name
    shutil.rmtree(folder, ignore_errors=True)
    model = build(family, torch.float32, seed, **changes)
    model.save_pretrained(folder)  # the family's own tensor names
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
        f.unlink()
    for f in folder.glob("*.index.json"):
        f.unlink()
    linear = re.compile(r".*\.layers\.\d+\..*\.weight$")
    quantized, dequantized = [], {}
    for i, key in enumerate(sorted(k for k, t in tensors.items() if linear.match(k) and t.dim() == 2)):
        module = key[: -len(".weight")]
        q, zeros, scales, g_idx = C.gptq_quantize(tensors.pop(key), group_size=GPTQ_GROUP, sym=True,
                                                  scale_dtype=torch.float16, seed=seed + i, min_zero=1)
        packed = C.gptq_pack(q, zeros, scales, g_idx, "gptq")
        tensors.update({f"{module}.{k}": t for k, t in packed.items()})
        dequantized[key] = C.gptq_dequantize(packed["qweight"], packed["qzeros"], packed["scales"],
                                             packed["g_idx"], "gptq")
        if f"{module}.bias" in tensors:
            tensors[f"{module}.bias"] = tensors[f"{module}.bias"].to(torch.float16)
        quantized.append(module)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    C._add_quantization_config(folder, C._gptq_config("gptqmodel", "gptq", GPTQ_GROUP, True, False))
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, FAMILIES[family]["prompt"]),
                           generator=torch.Generator().manual_seed(seed + 300))
    ref = {"model.prompt": prompt}
    for dtype, key in ((torch.float64, "model.logits"), (torch.float32, "model.logits_float32")):
        deq = build(family, dtype, seed, **changes)
        state = deq.state_dict()
        with torch.no_grad():
            for k, w in dequantized.items():
                state[k].copy_(w.to(dtype))
            for module in quantized:
                if f"{module}.bias" in state:
                    state[f"{module}.bias"].copy_(tensors[f"{module}.bias"].to(dtype))
        ref[key] = _logits(deq, prompt).to(torch.float64).contiguous()
    save_file(ref, str(Path(out) / f"{name}.reference.safetensors"))
    return {"quantized": quantized}


def mxfp4_quantize(w: torch.Tensor):
    """OCP MXFP4 of w [..., N, K] along K: (blocks uint8 [..., N, K/32, 16], two E2M1 codes a
    byte, element 2i in the low nibble; scales uint8 [..., N, K/32], E8M0) with each block's
    scale 2^(floor(log2(amax)) - 2) and codes the nearest E2M1 values (saturating at 6), as
    GPT-OSS's checkpoints store its experts."""
    *lead, n, k = w.shape
    g = w.reshape(*lead, n, k // 32, 32).float()
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2, torch.full_like(amax, -127)).clamp(-127, 127)
    v = g / torch.ldexp(torch.ones_like(amax), e).unsqueeze(-1)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    code = (v.abs().unsqueeze(-1) - grid).abs().argmin(-1)
    code = torch.where(v < 0, code | 8, code).to(torch.uint8)
    pairs = code.reshape(*lead, n, k // 32, 16, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous(), (e + 127).to(torch.uint8).contiguous()


def make_mxfp4(out, name: str = "gpt_oss_mxfp4", seed: int = 0) -> dict:
    """Writes out/NAME: the GPT-OSS family's folder with its experts in MXFP4 as OpenAI's
    checkpoints store them (mlp.experts.gate_up_proj_blocks [experts, 2 * intermediate,
    hidden / 32, 16], _scales, down_proj_blocks / _scales; biases, router and attention
    unquantized; quantization_config mxfp4 with GPT-OSS's modules_to_not_convert), and
    out/NAME.reference.safetensors: model.prompt, model.logits (transformers' float64
    forward of the folder, which dequantizes the experts itself: the format's float64 model
    from the peer's own code) and model.logits_float32 (the same in float32)."""
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    folder = Path(out) / name
    shutil.rmtree(folder, ignore_errors=True)
    model = build("gpt_oss", torch.float32, seed)
    model.save_pretrained(folder)
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
        f.unlink()
    for f in folder.glob("*.index.json"):
        f.unlink()
    quantized = sorted(k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj")))
    for key in quantized:  # stored [experts, in, out]; MXFP4 is [experts, out, in / 32, 16]
        tensors[f"{key}_blocks"], tensors[f"{key}_scales"] = mxfp4_quantize(tensors.pop(key).transpose(1, 2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with open(folder / "config.json") as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(folder / "config.json", "w") as f:
        json.dump(config, f, indent=1)
    prompt = torch.randint(0, model.config.vocab_size, (BATCH, FAMILIES["gpt_oss"]["prompt"]),
                           generator=torch.Generator().manual_seed(seed + 300))
    ref = {"model.prompt": prompt}
    for dtype, key in ((torch.float64, "model.logits"), (torch.float32, "model.logits_float32")):
        loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, experts_implementation="eager").eval()
        assert loaded.model.layers[0].mlp.experts.gate_up_proj.dtype == dtype  # dequantized by transformers
        ref[key] = _logits(loaded, prompt).to(torch.float64).contiguous()
    save_file(ref, str(Path(out) / f"{name}.reference.safetensors"))
    return {"quantized": quantized}


def folder_for_tests(tmp_path_factory, names=tuple(FAMILIES)) -> Path:
    """The folders a pytest module reads: $TP_FAMILY_FIXTURES; else `names` made now in a
    pytest temporary folder."""
    import os

    env = os.environ.get("TP_FAMILY_FIXTURES")
    if env:
        return Path(env)
    out = tmp_path_factory.mktemp("family_fixtures")
    make(out, names)
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: family_fixtures.py OUT_DIR [NAME ...]")
    start = time.perf_counter()
    manifest = make(Path(sys.argv[1]), tuple(sys.argv[2:]) or tuple(FAMILIES))
    print(json.dumps(manifest, indent=1, sort_keys=True))
    print(f"family_fixtures: wrote {len(manifest)} folders in {time.perf_counter() - start:.1f} s")
