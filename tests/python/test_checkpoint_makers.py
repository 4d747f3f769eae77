"""The checkpoint makers of checkpoints.py against their producers and against
docs/checkpoint_formats.md. Needs no tp build: torch, safetensors, transformers and
compressed-tensors only.

What is checked, per format:
- the folder loads with the safetensors package, is sharded, and every linear layer
  stores exactly the tensors the doc lists (names, dtypes, shapes);
- config.json parses (json, transformers' AutoConfig, and the producer's own config
  class for quantization_config) and carries the fields the doc lists;
- the producer's dequantized weights are within the format's error of the float weights
  (and not equal to them: the checkpoint is really quantized);
- a reader written here from the doc alone reproduces the producer's dequantization
  exactly (compressed-tensors, HF FP8), or an independent reader does (GPTQ through
  compressed-tensors' pack-quantized decompressor, AWQ through compressed-tensors'
  AutoAWQ converter); transformers' from_pretrained loads what it can load on CPU.
"""

import json
import math

import pytest
import torch

import checkpoints as C

# Small shapes keep the whole file fast; they still satisfy every format's alignment
# (K a multiple of 128, N a multiple of 128 for FP8 blocks).
SMALL = {
    "llama": dict(hidden_size=256, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4,
                  head_dim=32, num_hidden_layers=1, vocab_size=256),
    "qwen2": dict(hidden_size=256, intermediate_size=256, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=32, num_hidden_layers=1, vocab_size=256),
    "qwen3": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=64, num_hidden_layers=1, vocab_size=256),
}
SHARD = "100KB"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are small: intra-op threads only add synchronization (4x slower
    on a busy 2-core machine). Restored for the modules that run after this one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

_cache = {}


def _ck(tmp_path_factory, key, maker, *args, **kwargs):
    """Build a fixture once per session (several tests read the same folder)."""
    if key not in _cache:
        folder = tmp_path_factory.mktemp(key.replace("/", "_"))
        _cache[key] = maker(folder, *args, max_shard_size=SHARD, **kwargs)
    return _cache[key]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _suffixes(tensors, module):
    return {k[len(module) + 1:]: v for k, v in tensors.items() if k.rpartition(".")[0] == module}


def _check_sharded(ck):
    index = ck.folder / "model.safetensors.index.json"
    assert index.exists(), "expected a sharded checkpoint"
    with open(index) as f:
        files = set(json.load(f)["weight_map"].values())
    assert len(files) > 1
    assert files == {p.name for p in ck.folder.glob("*.safetensors")}


def _check_quantization_error(ck, strict_bound=None):
    bound = C.REL_ERROR[ck.format] if strict_bound is None else strict_bound
    assert ck.quantized, "no module was quantized"
    for name in ck.quantized:
        w = ck.model.get_submodule(name).weight.detach().double()
        err = _rel(ck.reference[name], w)
        assert 1e-4 < err < bound, f"{ck.format} {name}: relative error {err:.4g} (bound {bound})"
    for name in C.linear_names(ck.spec):
        if name not in ck.quantized:  # stored in float: reference is the weight itself
            assert torch.equal(ck.reference[name], ck.model.get_submodule(name).weight.detach().double())


# ---------------------------------------------------------------------------------------
# Float models
# ---------------------------------------------------------------------------------------

FLOAT_CASES = {
    "llama": dict(arch="llama"),
    "llama_tied": dict(arch="llama", tie_word_embeddings=True),
    "llama3_rope": dict(arch="llama", rope_scaling=C.LLAMA3_ROPE),
    "llama3_rope_legacy": dict(arch="llama", rope_scaling=C.LLAMA3_ROPE, legacy_config=True),
    "llama_bias": dict(arch="llama", attention_bias=True, mlp_bias=True),
    "llama_f64": dict(arch="llama", dtype=torch.float64),
    "qwen2": dict(arch="qwen2"),
    "qwen2_tied": dict(arch="qwen2", tie_word_embeddings=True),
    "qwen3": dict(arch="qwen3"),
    "qwen3_tied_f64": dict(arch="qwen3", tie_word_embeddings=True, dtype=torch.float64),
}


def _float_ck(tmp_path_factory, case):
    kw = dict(FLOAT_CASES[case])
    arch = kw.pop("arch")
    return _ck(tmp_path_factory, f"float_{case}", C.save_float_checkpoint, arch, **{**SMALL[arch], **kw})


def _expected_float_names(spec):
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not spec.tie_word_embeddings:
        names.add("lm_head.weight")
    qkv_bias = spec.arch == "qwen2" or spec.attention_bias
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}"
        names |= {f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"}
        for proj in ("q", "k", "v", "o"):
            names.add(f"{p}.self_attn.{proj}_proj.weight")
            if (proj != "o" and qkv_bias) or (proj == "o" and spec.attention_bias):
                names.add(f"{p}.self_attn.{proj}_proj.bias")
        for proj in ("gate", "up", "down"):
            names.add(f"{p}.mlp.{proj}_proj.weight")
            if spec.mlp_bias:
                names.add(f"{p}.mlp.{proj}_proj.bias")
        if spec.arch == "qwen3":
            names |= {f"{p}.self_attn.q_norm.weight", f"{p}.self_attn.k_norm.weight"}
    return names


@pytest.mark.parametrize("case", sorted(FLOAT_CASES))
def test_float_checkpoint(tmp_path_factory, case):
    ck = _float_ck(tmp_path_factory, case)
    spec = ck.spec
    _check_sharded(ck)
    tensors = ck.tensors()
    assert set(tensors) == _expected_float_names(spec)
    dtype = FLOAT_CASES[case].get("dtype", torch.float32)
    state = ck.model.state_dict()
    for name, t in tensors.items():
        assert t.dtype == dtype, name
        assert torch.equal(t, state[name]), name
    # shapes the doc lists
    p = "model.layers.0"
    assert tensors[f"{p}.self_attn.q_proj.weight"].shape == (spec.q_size, spec.hidden_size)
    assert tensors[f"{p}.self_attn.k_proj.weight"].shape == (spec.kv_size, spec.hidden_size)
    assert tensors[f"{p}.self_attn.o_proj.weight"].shape == (spec.hidden_size, spec.q_size)
    assert tensors[f"{p}.mlp.down_proj.weight"].shape == (spec.hidden_size, spec.intermediate_size)
    if spec.arch == "qwen3":
        assert tensors[f"{p}.self_attn.q_norm.weight"].shape == (spec.head_dim,)
        assert spec.head_dim * spec.num_attention_heads != spec.hidden_size
    # no parameter is left at transformers' zero / one init
    for name, t in tensors.items():
        assert t.double().std() > 0.01, name

    cfg = ck.config()
    legacy = FLOAT_CASES[case].get("legacy_config", False)
    assert cfg["model_type"] == spec.arch
    for field in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                  "num_hidden_layers", "vocab_size", "tie_word_embeddings", "rms_norm_eps",
                  "max_position_embeddings"):
        assert cfg[field] == getattr(spec, field), field
    if spec.arch != "qwen2":
        assert cfg["head_dim"] == spec.head_dim and cfg["attention_bias"] == spec.attention_bias
    else:
        assert "head_dim" not in cfg and "attention_bias" not in cfg
    if spec.arch == "llama":
        assert cfg["mlp_bias"] == spec.mlp_bias
    rope_extra = spec.rope_scaling or {}
    if legacy:
        assert "rope_parameters" not in cfg and "dtype" not in cfg
        assert cfg["rope_theta"] == spec.rope_theta and cfg["torch_dtype"] == "float32"
        assert cfg["rope_scaling"] == (rope_extra or None)
    else:
        assert cfg["dtype"] == str(dtype).replace("torch.", "")
        assert cfg["rope_parameters"] == {"rope_type": "default", **rope_extra, "rope_theta": spec.rope_theta}
        assert "rope_theta" not in cfg and "rope_scaling" not in cfg

    # transformers reads the folder back to the same configuration (the legacy form too)
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(ck.folder)
    assert hf.rope_parameters == {"rope_type": "default", **rope_extra, "rope_theta": spec.rope_theta}
    assert getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads) == spec.head_dim
    assert hf.num_key_value_heads == spec.num_key_value_heads


@pytest.mark.parametrize("case", ["llama3_rope_legacy", "qwen2_tied", "qwen3_tied_f64"])
def test_float_checkpoint_roundtrip_through_transformers(tmp_path_factory, case):
    from transformers import AutoModelForCausalLM

    ck = _float_ck(tmp_path_factory, case)
    dtype = FLOAT_CASES[case].get("dtype", torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(ck.folder, dtype=dtype).eval()
    ids = torch.randint(0, ck.spec.vocab_size, (1, 300 if ck.spec.rope_scaling else 12),
                        generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, ck.model(input_ids=ids).logits)


def test_float32_and_float64_models_hold_the_same_values(tmp_path_factory):
    spec = C.model_spec("qwen3", **SMALL["qwen3"])
    m32, m64 = C.build_model(spec, torch.float32, seed=5), C.build_model(spec, torch.float64, seed=5)
    for (n32, p32), (n64, p64) in zip(m32.named_parameters(), m64.named_parameters()):
        assert n32 == n64 and torch.equal(p32.double(), p64)


def test_even_tp_sizes_of_default_specs():
    assert C.even_tp_sizes(C.model_spec("llama")) == [1, 2, 4]
    assert C.even_tp_sizes(C.model_spec("qwen2")) == [1, 2, 3]
    assert C.even_tp_sizes(C.model_spec("qwen3")) == [1, 2, 4]
    assert C.model_spec("qwen3").head_dim != C.model_spec("qwen3").hidden_size // 8


# ---------------------------------------------------------------------------------------
# compressed-tensors
# ---------------------------------------------------------------------------------------

# A reader written from docs/checkpoint_formats.md only (no compressed-tensors code):
# it must reproduce compressed-tensors' own decompression bit for bit.


def _doc_unpack_int4_rows(words, n_elems):
    """int32 [R, W] -> [R, 8W] nibbles, element j of word c at bits 4j..4j+3 of word c."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    nib = torch.stack([(w >> (4 * j)) & 0xF for j in range(8)], dim=-1)  # [R, W, 8]
    return nib.reshape(words.shape[0], -1)[:, :n_elems]


def _doc_read_ct(t, qargs):
    """Dequantize one linear's tensors (suffix -> tensor) as the doc describes."""
    scale = t["weight_scale"]
    sd = scale.dtype  # compressed-tensors computes in the scale's dtype
    strategy = qargs["strategy"]
    if "weight_global_scale" in t:
        # NVFP4 (section 6b): codes two a byte, element 2i low; float32 scale / global scale.
        packed = t["weight_packed"].to(torch.int64)
        codes = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=torch.int64)
        codes[:, 0::2], codes[:, 1::2] = packed % 16, packed // 16
        magnitude = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])[codes % 8]
        values = torch.where(codes >= 8, -magnitude, magnitude)
        group = scale.to(torch.float32) / t["weight_global_scale"]
        return (values * group.repeat_interleave(16, dim=1)).double()
    if "weight_packed" in t:
        n, k = t["weight_shape"].tolist()
        q = _doc_unpack_int4_rows(t["weight_packed"], k) - 8  # offset binary -> -8..7
        g = qargs["group_size"]
        s = scale.repeat_interleave(g, dim=1)
        if qargs["symmetric"]:
            assert "weight_zero_point" not in t
            return (q.to(sd) * s).double()
        zp = _doc_unpack_int4_rows(t["weight_zero_point"].T.contiguous(), n).T - 8  # packed along N
        return ((q.to(sd) - zp.to(sd).repeat_interleave(g, dim=1)) * s).double()
    w = t["weight"]
    n, k = w.shape
    if strategy == "tensor":
        s = scale.reshape(1, 1)
    elif strategy == "channel":
        s = scale  # [N, 1]
    elif strategy == "block":
        bh, bw = qargs["block_structure"]
        s = scale.repeat_interleave(bh, dim=0)[:n].repeat_interleave(bw, dim=1)[:, :k]
    else:
        raise AssertionError(strategy)
    return (w.to(sd) * s).double()


def _ct_expected(scheme, n, k, group_size, sdtype):
    """suffix -> (dtype, shape) per linear layer, from the doc's table."""
    g = group_size or 128
    if scheme in ("fp8_tensor", "fp8_channel", "fp8_block"):
        scale_shape = {"fp8_tensor": (1,), "fp8_channel": (n, 1),
                       "fp8_block": (math.ceil(n / 128), math.ceil(k / 128))}[scheme]
        out = {"weight": (torch.float8_e4m3fn, (n, k)), "weight_scale": (sdtype, scale_shape)}
        if scheme == "fp8_tensor":
            out["input_scale"] = (sdtype, (1,))
        return out
    if scheme == "w8a8":
        return {"weight": (torch.int8, (n, k)), "weight_scale": (sdtype, (n, 1))}
    if scheme == "nvfp4a16":
        return {"weight_packed": (torch.uint8, (n, k // 2)), "weight_scale": (torch.float8_e4m3fn, (n, k // 16)),
                "weight_global_scale": (torch.float32, (1,))}
    out = {"weight_packed": (torch.int32, (n, math.ceil(k / 8))), "weight_scale": (sdtype, (n, k // g)),
           "weight_shape": (torch.int64, (2,))}
    if scheme == "w4a16_asym":
        out["weight_zero_point"] = (torch.int32, (math.ceil(n / 8), k // g))
    return out


CT_CASES = {
    "fp8_tensor": dict(scheme="fp8_tensor", arch="llama"),
    "fp8_channel": dict(scheme="fp8_channel", arch="qwen2"),
    "fp8_block": dict(scheme="fp8_block", arch="qwen3"),
    "fp8_block_f64": dict(scheme="fp8_block", arch="llama", dtype=torch.float64),
    "w8a8": dict(scheme="w8a8", arch="qwen2"),
    "w4a16_g32": dict(scheme="w4a16", arch="llama", group_size=32),
    "w4a16_g64": dict(scheme="w4a16", arch="qwen3", group_size=64),
    "w4a16_g128": dict(scheme="w4a16", arch="qwen2"),
    "w4a16_asym_g32": dict(scheme="w4a16_asym", arch="qwen3", group_size=32),
    "w4a16_asym_g64": dict(scheme="w4a16_asym", arch="qwen2", group_size=64),
    "w4a16_asym_g128": dict(scheme="w4a16_asym", arch="llama"),
    "w4a16_asym_ignore": dict(scheme="w4a16_asym", arch="llama", group_size=64,
                              ignore=["lm_head", "re:.*self_attn\\.o_proj$"], tie_word_embeddings=True),
    "nvfp4a16": dict(scheme="nvfp4a16", arch="qwen3"),
}


def _ct_ck(tmp_path_factory, case):
    kw = dict(CT_CASES[case])
    scheme, arch = kw.pop("scheme"), kw.pop("arch")
    return _ck(tmp_path_factory, f"ct_{case}", C.save_compressed_tensors, scheme, arch, **{**SMALL[arch], **kw})


@pytest.mark.parametrize("case", sorted(CT_CASES))
def test_compressed_tensors_checkpoint(tmp_path_factory, case):
    from compressed_tensors.quantization import QuantizationConfig

    ck = _ct_ck(tmp_path_factory, case)
    kw = CT_CASES[case]
    scheme = kw["scheme"]
    _check_sharded(ck)
    tensors = ck.tensors()

    qc = ck.quantization_config()
    QuantizationConfig.model_validate(qc)  # compressed-tensors' own parser accepts it
    fmt = {"w8a8": "int-quantized", "w4a16": "pack-quantized", "w4a16_asym": "pack-quantized",
           "nvfp4a16": "nvfp4-pack-quantized"}.get(
        scheme, "float-quantized")
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == fmt
    assert qc["quantization_status"] == "compressed"
    # compressed-tensors writes the ignore list it resolved: every Linear left
    # unquantized, by exact module name, in module order (a "re:" entry is expanded)
    ignored = [n for n in C.linear_names(ck.spec) if n == "lm_head" or n.endswith("o_proj") and "ignore" in case]
    assert qc["ignore"] == ignored
    (group,) = qc["config_groups"].values()
    assert group["format"] == fmt and group["targets"] == ["Linear"]
    wargs = group["weights"]

    assert sorted(ck.quantized) == sorted(set(C.linear_names(ck.spec)) - set(ignored))
    sdtype = kw.get("dtype", torch.float32)
    for name in C.linear_names(ck.spec):
        mod = ck.model.get_submodule(name)
        t = _suffixes(tensors, name)
        if mod.bias is not None:
            assert torch.equal(t.pop("bias"), mod.bias.detach())
        if name not in ck.quantized:
            if name == "lm_head" and ck.spec.tie_word_embeddings:
                assert t == {}
            else:
                assert set(t) == {"weight"} and t["weight"].dtype == sdtype
            continue
        n, k = mod.weight.shape
        expected = _ct_expected(scheme, n, k, kw.get("group_size"), sdtype)
        assert {s: (v.dtype, tuple(v.shape)) for s, v in t.items()} == expected, name
        if "weight_shape" in t:
            assert t["weight_shape"].tolist() == [n, k]
        # the doc's reading equals compressed-tensors' decompression exactly
        assert torch.equal(_doc_read_ct(t, wargs), ck.reference[name]), name
    _check_quantization_error(ck)


def test_compressed_tensors_zero_points_are_asymmetric(tmp_path_factory):
    """An asym fixture whose zero points were all 0 would not test their packing."""
    ck = _ct_ck(tmp_path_factory, "w4a16_asym_g64")
    t = _suffixes(ck.tensors(), "model.layers.0.mlp.down_proj")
    zp = _doc_unpack_int4_rows(t["weight_zero_point"].T.contiguous(), t["weight_shape"][0].item()).T - 8
    assert len(torch.unique(zp)) > 3


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`")
@pytest.mark.parametrize("case", ["w4a16_g128", "fp8_block", "w8a8"])
def test_transformers_loads_compressed_tensors_checkpoint(tmp_path_factory, case):
    """transformers (with compressed-tensors) loads the folder and decompresses to the
    reference. (Asymmetric pack-quantized folders are refused by transformers 5.24 +
    compressed-tensors 0.20.1: their weight_zero_point shape check runs before
    decompression; see docs/checkpoint_formats.md.)"""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    ck = _ct_ck(tmp_path_factory, case)
    loaded = AutoModelForCausalLM.from_pretrained(
        ck.folder, dtype=torch.float32, quantization_config=CompressedTensorsConfig(run_compressed=False))
    for name in ck.quantized:
        w = loaded.get_submodule(name).weight.detach()
        assert torch.equal(w.double(), ck.reference[name].to(w.dtype).double()), name


# ---------------------------------------------------------------------------------------
# GPTQ and AWQ
# ---------------------------------------------------------------------------------------


def test_pack_int4_bit_layout():
    # the doc's worked examples
    u = torch.arange(1, 9).reshape(1, 8)
    assert C.pack_int4(u, dim=1).item() & 0xFFFFFFFF == 0x87654321  # stored as int32: negative
    assert C.pack_int4(torch.arange(8).reshape(1, 8), dim=1, order=C.AWQ_ORDER).item() == 0x75316420
    assert C.pack_int4(torch.full((1, 8), 15), dim=1).item() == -1  # 0xFFFFFFFF as int32
    r = torch.randint(0, 16, (16, 24), generator=torch.Generator().manual_seed(0))
    for dim in (0, 1):
        for order in (None, C.AWQ_ORDER):
            assert torch.equal(C.unpack_int4(C.pack_int4(r, dim, order), dim, order), r)


GPTQ_CASES = {
    "v1_sym": dict(checkpoint_format="gptq", sym=True, arch="qwen2"),
    "v1_asym_g64": dict(checkpoint_format="gptq", sym=False, group_size=64, arch="llama"),
    "v2_sym": dict(checkpoint_format="gptq_v2", sym=True, arch="qwen2"),
    "v2_asym_g64": dict(checkpoint_format="gptq_v2", sym=False, group_size=64, arch="llama"),
    "v2_asym_g32_f64": dict(checkpoint_format="gptq_v2", sym=False, group_size=32, arch="qwen3",
                            dtype=torch.float64, scale_dtype=torch.float32),
    "v1_autogptq": dict(checkpoint_format="gptq", sym=True, arch="llama", writer="autogptq"),
    "v2_transformers": dict(checkpoint_format="gptq_v2", sym=True, arch="llama", writer="transformers"),
    "v1_desc_act": dict(checkpoint_format="gptq", sym=True, group_size=64, desc_act=True, arch="llama"),
}


def _gptq_ck(tmp_path_factory, case):
    kw = dict(GPTQ_CASES[case])
    arch = kw.pop("arch")
    return _ck(tmp_path_factory, f"gptq_{case}", C.save_gptq, arch, **{**SMALL[arch], **kw})


def _ct_decompress_int4(qweight_nk, scales_ng, zeros_packed_n8g, n, k, group_size):
    """compressed-tensors' own pack-quantized decompressor over tensors rearranged to its
    layout (float64 scales, so that it computes exactly)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    sym = zeros_packed_n8g is None
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=sym, strategy="group", group_size=group_size))
    sd = {"weight_packed": qweight_nk, "weight_scale": scales_ng.to(torch.float64),
          "weight_shape": torch.tensor([n, k])}
    if not sym:
        sd["weight_zero_point"] = zeros_packed_n8g
    return BaseCompressor.get_value_from_registry("pack-quantized").decompress(sd, scheme)["weight"]


@pytest.mark.parametrize("case", sorted(GPTQ_CASES))
def test_gptq_checkpoint(tmp_path_factory, case):
    ck = _gptq_ck(tmp_path_factory, case)
    kw = GPTQ_CASES[case]
    fmt, sym = kw["checkpoint_format"], kw["sym"]
    g = kw.get("group_size", 128)
    sdtype = kw.get("scale_dtype", torch.float16)
    _check_sharded(ck)
    tensors = ck.tensors()

    qc = ck.quantization_config()
    writer = kw.get("writer", "gptqmodel")
    assert qc["quant_method"] == "gptq" and qc["bits"] == 4 and qc["group_size"] == g
    assert qc["sym"] == sym and qc["desc_act"] == kw.get("desc_act", False)
    assert qc.get("checkpoint_format", "gptq") == fmt  # AutoGPTQ writes none: v1
    if writer == "autogptq":
        assert "checkpoint_format" not in qc
    if writer != "transformers":
        with open(ck.folder / "quantize_config.json") as f:
            assert json.load(f) == qc
    from transformers import GPTQConfig

    assert GPTQConfig.from_dict(qc).format == fmt  # transformers' parser agrees

    assert ck.quantized == C.linear_names(ck.spec, include_lm_head=False)
    for name in ck.quantized:
        mod = ck.model.get_submodule(name)
        n, k = mod.weight.shape
        t = _suffixes(tensors, name)
        expected = {"qweight": (torch.int32, (k // 8, n)), "qzeros": (torch.int32, (k // g, n // 8)),
                    "scales": (sdtype, (k // g, n)), "g_idx": (torch.int32, (k,))}
        if mod.bias is not None:
            expected["bias"] = (sdtype, (n,))
        assert {s: (v.dtype, tuple(v.shape)) for s, v in t.items()} == expected, name
        gi = t["g_idx"].long()
        if kw.get("desc_act"):
            assert not torch.equal(gi, torch.arange(k) // g)
            assert torch.equal(torch.bincount(gi), torch.full((k // g,), g))
        else:
            assert torch.equal(gi, torch.arange(k) // g)
        z = C.unpack_int4(t["qzeros"], dim=1) + (1 if fmt == "gptq" else 0)
        if sym:
            assert torch.all(z == 8)
        else:
            assert len(torch.unique(z)) > 3 and z.min() >= (1 if fmt == "gptq" else 0)
        ref = C.gptq_dequantize(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], fmt)
        assert torch.equal(ref, ck.reference[name])
        if not kw.get("desc_act"):
            # An independent reader of the same nibble layout: qweight^T is compressed-tensors'
            # weight_packed; v2 qzeros^T is its weight_zero_point (see the doc).
            zeros_v2 = t["qzeros"] if fmt == "gptq_v2" else (
                t["qzeros"].to(torch.int64) + 0x11111111).to(torch.int32)  # GPTQModel's v1 -> v2
            other = _ct_decompress_int4(t["qweight"].T.contiguous(), t["scales"].T.contiguous(),
                                        None if sym else zeros_v2.T.contiguous(), n, k, g)
            assert torch.equal(other, ref), name
    _check_quantization_error(ck, strict_bound=0.16 if sym else 0.12)


def test_gptq_v1_and_v2_differ_only_in_qzeros(tmp_path_factory):
    """Same weights, same quantization (zero points >= 1, as v1 needs): v2's qzeros word
    is v1's + 0x11111111 (GPTQModel's v1 -> v2 conversion); everything else is equal."""
    ck = _gptq_ck(tmp_path_factory, "v1_asym_g64")
    v1 = ck.tensors()
    name = "model.layers.0.self_attn.q_proj"
    w = ck.model.get_submodule(name).weight
    q, zeros, scales, g_idx = C.gptq_quantize(w, group_size=64, sym=False, min_zero=1)
    p1, p2 = C.gptq_pack(q, zeros, scales, g_idx, "gptq"), C.gptq_pack(q, zeros, scales, g_idx, "gptq_v2")
    assert torch.equal(p1["qweight"], v1[f"{name}.qweight"]) and torch.equal(p1["qzeros"], v1[f"{name}.qzeros"])
    assert torch.equal(p1["qweight"], p2["qweight"]) and torch.equal(p1["scales"], p2["scales"])
    assert torch.equal((p1["qzeros"].to(torch.int64) + 0x11111111).to(torch.int32), p2["qzeros"])
    assert torch.equal(C.gptq_dequantize(**p1, checkpoint_format="gptq"),
                       C.gptq_dequantize(**p2, checkpoint_format="gptq_v2"))
    # v2 read as v1: every zero point off by one (issue 14, failure 4)
    assert _rel(C.gptq_dequantize(**p2, checkpoint_format="gptq"), w.double()) > 0.12
    with pytest.raises(ValueError, match="zero point of 0"):
        C.gptq_pack(q, zeros * 0, scales, g_idx, "gptq")


AWQ_CASES = {
    "g128": dict(arch="qwen2"),
    "g64": dict(arch="llama", group_size=64),
    "g32_transformers": dict(arch="qwen3", group_size=32, writer="transformers"),
}


@pytest.mark.parametrize("case", sorted(AWQ_CASES))
def test_awq_checkpoint(tmp_path_factory, case):
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter

    kw = dict(AWQ_CASES[case])
    arch = kw.pop("arch")
    ck = _ck(tmp_path_factory, f"awq_{case}", C.save_awq, arch, **{**SMALL[arch], **kw})
    g = kw.get("group_size", 128)
    _check_sharded(ck)
    tensors = ck.tensors()
    qc = ck.quantization_config()
    assert qc["quant_method"] == "awq" and qc["bits"] == 4 and qc["group_size"] == g
    assert qc["zero_point"] is True and qc["version"] == "gemm"
    from transformers import AwqConfig

    assert AwqConfig.from_dict(qc).zero_point is True

    converter = AutoAWQConverter.from_autoawq_config(qc)  # compressed-tensors' AutoAWQ reader
    for name in ck.quantized:
        mod = ck.model.get_submodule(name)
        n, k = mod.weight.shape
        t = _suffixes(tensors, name)
        expected = {"qweight": (torch.int32, (k, n // 8)), "qzeros": (torch.int32, (k // g, n // 8)),
                    "scales": (torch.float16, (k // g, n))}
        if mod.bias is not None:
            expected["bias"] = (torch.float16, (n,))
        assert {s: (v.dtype, tuple(v.shape)) for s, v in t.items()} == expected, name
        ref = C.awq_dequantize(t["qweight"], t["qzeros"], t["scales"])
        assert torch.equal(ref, ck.reference[name])
        conv = converter.process({f"{name}.{s}": v for s, v in t.items() if s != "bias"})
        zp = conv[f"{name}.weight_zero_point"]
        scale = conv[f"{name}.weight_scale"]
        assert scale.shape == (n, k // g) and zp.shape == (n // 8, k // g)
        other = _ct_decompress_int4(conv[f"{name}.weight_packed"], scale, zp, n, k, g)
        assert torch.equal(other, ref), name
    _check_quantization_error(ck)


# ---------------------------------------------------------------------------------------
# HF fine-grained FP8
# ---------------------------------------------------------------------------------------

HF_FP8_CASES = {"transformers": dict(arch="qwen3"), "deepseek": dict(arch="llama", writer="deepseek")}


@pytest.mark.parametrize("case", sorted(HF_FP8_CASES))
def test_hf_fp8_checkpoint(tmp_path_factory, case):
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    kw = dict(HF_FP8_CASES[case])
    arch = kw.pop("arch")
    ck = _ck(tmp_path_factory, f"hf_fp8_{case}", C.save_hf_fp8, arch, **{**SMALL[arch], **kw})
    _check_sharded(ck)
    tensors = ck.tensors()
    qc = ck.quantization_config()
    assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [128, 128]
    assert qc["activation_scheme"] == "dynamic"
    assert FineGrainedFP8Config.from_dict(qc).weight_block_size in ([128, 128], (128, 128))

    other_reader = FP8BlockDequantizer(dtype=torch.float64, targets=ck.quantized)
    for name in ck.quantized:
        n, k = ck.model.get_submodule(name).weight.shape
        t = _suffixes(tensors, name)
        t.pop("bias", None)
        assert {s: (v.dtype, tuple(v.shape)) for s, v in t.items()} == {
            "weight": (torch.float8_e4m3fn, (n, k)), "weight_scale_inv": (torch.float32, (n // 128, k // 128))}
        # the doc: W = fp8 * scale_inv over 128x128 blocks, in float32
        s = t["weight_scale_inv"].repeat_interleave(128, 0).repeat_interleave(128, 1)
        doc = (t["weight"].float() * s).double()
        assert torch.equal(doc, ck.reference[name]), name
        out = other_reader.process({f"{name}.weight": t["weight"], f"{name}.weight_scale_inv": t["weight_scale_inv"]})
        assert torch.equal(out[f"{name}.weight"], ck.reference[name]), name
    _check_quantization_error(ck)

    # transformers loads it on CPU by dequantizing (needs accelerate)
    loaded = AutoModelForCausalLM.from_pretrained(ck.folder, dtype=torch.float32)
    for name in ck.quantized:
        w = loaded.get_submodule(name).weight.detach()
        assert w.dtype == torch.float32 and torch.equal(w.double(), ck.reference[name]), name


def test_hf_fp8_refuses_partial_blocks(tmp_path):
    """transformers' Fp8Quantize would leave such a weight in float without a word."""
    with pytest.raises(ValueError, match="not a multiple of the block 128x128"):
        C.save_hf_fp8(tmp_path, "qwen2", **SMALL["qwen2"])  # k_proj N = 2 * 32
