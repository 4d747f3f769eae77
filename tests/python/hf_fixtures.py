"""Hugging Face folders for tp's ModelConfig tests, made by the makers of checkpoints.py
(transformers' save_pretrained, compressed-tensors' own API, GPTQ / AWQ packers from
the published definitions), with what a test needs to check tp against them.

    python tests/python/hf_fixtures.py OUT_DIR        # what the C++ tests' CTest fixture runs
    fixtures = hf_fixtures.make(OUT_DIR, names)       # from pytest

For each fixture NAME, OUT_DIR holds:
- NAME/               the folder (config.json + sharded safetensors), as the producer wrote it;
- NAME.reference.safetensors, float64:
    x.hidden [T, hidden], x.attn [T, heads * head_dim], x.inter [T, intermediate]: inputs;
    w.<module> [N, K]  the weight as the checkpoint's producer dequantizes it (float
                       folders: the stored weight), for every decoder linear;
    b.<module> [N]     its bias, where it has one;
    y.<module> [T, N]  float folders only: transformers' own module applied to its input
                       (q/k/v/gate/up to x.hidden, o to x.attn, down to x.inter);
    model.prompt [B, P] int64, model.logits [B, P, vocab] float64 (transformers' forward of
                       the prompt), model.generated [B, NEW_TOKENS] int64 (its
                       generate(do_sample=False) after the prompt): float folders only;
- manifest.json: {NAME: {"arch", "format", "layers", "config": the ModelConfig fields
  tp must read, "quant": {module: the QuantConfig text tp must choose}}}. The expected
  values are written here from the maker's own parameters, not from config.json.

No tp import: this runs before (and without) a tp build.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoints as C  # noqa: E402

T = 5  # tokens per input
PROMPT, BATCH, NEW_TOKENS = 6, 2, 16  # the whole-model reference (float folders)
SHARD = "200KB"

# Float models (float64, two layers):
#   llama: 8 heads / 4 KV heads: TP 3 splits the KV groups 2, 1, 1 (uneven); attention
#          and MLP biases; Llama-3 RoPE written in transformers 4.x's spelling.
#   qwen2: 12 heads / 6 KV heads: TP 4 is uneven (2, 2, 1, 1); q/k/v biases; tied embeddings.
#   qwen3: 8 heads / 2 KV heads, head_dim 32 != hidden / heads: TP 4 replicates each KV
#          head twice; TP 3 cannot split the heads (the MLP still can).
FLOAT_SPECS = {
    "llama": dict(arch="llama", hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4,
                  head_dim=16, vocab_size=128, attention_bias=True, mlp_bias=True, rope_scaling=C.LLAMA3_ROPE,
                  legacy_config=True),
    "qwen2": dict(arch="qwen2", hidden_size=192, intermediate_size=256, num_attention_heads=12,
                  num_key_value_heads=6, head_dim=16, vocab_size=128, tie_word_embeddings=True),
    "qwen3": dict(arch="qwen3", hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=32, vocab_size=128),
}

# Quantized models (float32 as quantized, one layer): every K a multiple of 128 and
# every N of 128 (q 256, k/v 128, o 128, gate/up 256, down 128) so that each format can
# store every layer; qwen2's head_dim is hidden / heads.
_Q = dict(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
          num_hidden_layers=1, vocab_size=128)
_Q_QWEN2 = dict(_Q, head_dim=16)

# name -> (maker, arch, keyword arguments, the QuantConfig text tp must choose for the
# decoder linears)
QUANT_SPECS = {
    "ct_fp8_channel": ("ct", "qwen2", dict(scheme="fp8_channel", **_Q_QWEN2), "fp8_channel"),
    "ct_fp8_block": ("ct", "llama", dict(scheme="fp8_block", **_Q), "fp8_block:weight_scale"),
    "ct_w8a8": ("ct", "qwen3", dict(scheme="w8a8", **_Q), "int8_w8a8"),
    "ct_w4a16": ("ct", "qwen3", dict(scheme="w4a16", group_size=128, **_Q), "int4_pack_quantized:g128:sym"),
    "ct_w4a16_asym": ("ct", "llama", dict(scheme="w4a16_asym", group_size=64, **_Q), "int4_pack_quantized:g64:asym"),
    "ct_nvfp4a16": ("ct", "qwen2", dict(scheme="nvfp4a16", **_Q_QWEN2), "nvfp4"),
    "gptq_v1": ("gptq", "llama", dict(checkpoint_format="gptq", sym=True, group_size=128, writer="autogptq", **_Q),
                "int4_gptq:g128:sym"),
    "gptq_v2": ("gptq", "qwen3", dict(checkpoint_format="gptq_v2", sym=False, group_size=64, writer="gptqmodel", **_Q),
                "int4_gptq:g64:asym:v2"),
    "awq": ("awq", "qwen2", dict(group_size=64, **_Q_QWEN2), "int4_awq:g64:asym"),
    "hf_fp8": ("hf_fp8", "llama", dict(**_Q), "fp8_block"),
}

ALL = tuple(FLOAT_SPECS) + tuple(QUANT_SPECS)

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                torch.float16: "float16"}


def _config_fields(spec: C.ModelSpec, dtype: torch.dtype) -> dict:
    rope = dict(spec.rope_scaling or {})
    return {
        "model_type": spec.arch,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "qkv_bias": spec.arch == "qwen2" or spec.attention_bias,
        "o_bias": spec.arch != "qwen2" and spec.attention_bias,
        "mlp_bias": spec.mlp_bias,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_type": rope.get("rope_type", "default"),
        "rope_theta": spec.rope_theta,
        "rope_factor": rope.get("factor", 1.0),
        "rope_low_freq_factor": rope.get("low_freq_factor", 1.0),
        "rope_high_freq_factor": rope.get("high_freq_factor", 4.0),
        "rope_original_max_position_embeddings": rope.get("original_max_position_embeddings", 0),
        "dtype": _DTYPE_NAMES[dtype],
    }


def _inputs(spec: C.ModelSpec, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "x.hidden": torch.randn(T, spec.hidden_size, generator=g, dtype=torch.float64),
        "x.attn": torch.randn(T, spec.q_size, generator=g, dtype=torch.float64),
        "x.inter": torch.randn(T, spec.intermediate_size, generator=g, dtype=torch.float64),
    }


def _model_reference(model, spec: C.ModelSpec, seed: int) -> dict:
    """transformers' logits of a random prompt and its greedy continuation. Generation
    runs with no EOS (so that nothing cuts it short or masks a logit); each token is
    checked to be the argmax of a plain forward of the sequence so far."""
    from transformers import GenerationConfig

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, spec.vocab_size, (BATCH, PROMPT), generator=g)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, bos_token_id=None,
                              pad_token_id=0)
    with torch.no_grad():
        logits = model(prompt).logits
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
        generated = out[:, PROMPT:]
        assert generated.shape == (BATCH, NEW_TOKENS), generated.shape
        for i in range(NEW_TOKENS):
            step = model(out[:, : PROMPT + i]).logits[:, -1]
            assert torch.equal(step.argmax(-1), generated[:, i]), f"generate's token {i} is not the argmax"
    return {"model.prompt": prompt, "model.logits": logits.contiguous(), "model.generated": generated.contiguous()}


def _input_of(module: str) -> str:
    if module.endswith("o_proj"):
        return "x.attn"
    if module.endswith("down_proj"):
        return "x.inter"
    return "x.hidden"


def _make_one(out: Path, name: str, seed: int) -> dict:
    import shutil

    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)  # no stale shards from an earlier run
    if name in FLOAT_SPECS:
        kw = dict(FLOAT_SPECS[name])
        arch = kw.pop("arch")
        ck = C.save_float_checkpoint(folder, arch, dtype=torch.float64, seed=seed, max_shard_size=SHARD, **kw)
        dtype, quant_text = torch.float64, "none"
    else:
        maker, arch, kw, quant_text = QUANT_SPECS[name]
        kw = dict(kw)
        common = dict(dtype=torch.float32, seed=seed, max_shard_size=SHARD)
        if maker == "ct":
            ck = C.save_compressed_tensors(folder, kw.pop("scheme"), arch, **common, **kw)
        elif maker == "gptq":
            ck = C.save_gptq(folder, arch, **common, **kw)
        elif maker == "awq":
            ck = C.save_awq(folder, arch, **common, **kw)
        else:
            ck = C.save_hf_fp8(folder, arch, **common, **kw)
        dtype = torch.float32
    spec = ck.spec
    tensors = _inputs(spec, seed + 100)
    quant = {}
    for module in C.linear_names(spec, include_lm_head=True):
        quant[module] = quant_text if module in ck.quantized else "none"
        if module == "lm_head":
            continue
        w = ck.reference[module]
        tensors[f"w.{module}"] = w.contiguous()
        if module in ck.bias:
            tensors[f"b.{module}"] = ck.bias[module].contiguous()
        if name in FLOAT_SPECS:
            with torch.no_grad():
                y = ck.model.get_submodule(module)(tensors[_input_of(module)])
            tensors[f"y.{module}"] = y.contiguous()
    if name in FLOAT_SPECS:
        tensors.update(_model_reference(ck.model, spec, seed + 200))
    from safetensors.torch import save_file

    save_file(tensors, str(out / f"{name}.reference.safetensors"))
    return {"arch": spec.arch, "format": ck.format, "layers": spec.num_hidden_layers,
            "config": _config_fields(spec, dtype), "quant": quant}


def make(out, names=ALL, seed: int = 0) -> dict:
    """Writes the fixtures `names` under `out` (see the module doc); returns the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    manifest = {}
    for i, name in enumerate(names):
        if name not in ALL:
            raise ValueError(f"unknown fixture {name!r}; expected one of {ALL}")
        manifest[name] = _make_one(out, name, seed + 10 * i)
    with open(out / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def _stamp(names) -> str:
    """What the outputs depend on: this file, the makers and the fixture names."""
    import hashlib

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for f in ("hf_fixtures.py", "checkpoints.py"):
        h.update((here / f).read_bytes())
    h.update(repr(tuple(names)).encode())
    return h.hexdigest()


def folder_for_tests(tmp_path_factory, names=ALL) -> Path:
    """The fixtures a pytest module reads: $TP_HF_FIXTURES; else the build tree's
    (<build>/tests/hf_fixtures, made by the CTest fixture that tools/test.sh runs first)
    when its stamp is current; else `names` made now in a pytest temporary folder."""
    import os

    env = os.environ.get("TP_HF_FIXTURES")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[2]
    built = root / os.environ.get("TP_BUILD_DIR", "build") / "tests" / "hf_fixtures"
    stamp = built / "stamp"
    if (built / "manifest.json").exists() and stamp.exists() and stamp.read_text() == _stamp(ALL):
        return built
    out = tmp_path_factory.mktemp("hf_fixtures")
    make(out, names)
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: hf_fixtures.py OUT_DIR [NAME ...]")
    out, names = Path(sys.argv[1]), tuple(sys.argv[2:]) or ALL
    stamp = out / "stamp"
    if (out / "manifest.json").exists() and stamp.exists() and stamp.read_text() == _stamp(names):
        print(f"hf_fixtures: {out} is up to date")
        sys.exit(0)
    if stamp.exists():
        stamp.unlink()
    make(out, names)
    stamp.write_text(_stamp(names))
    print(f"hf_fixtures: wrote {len(names)} folders to {out}")
