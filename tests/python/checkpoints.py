"""Checkpoint folders made by other people's code, for tp's loader and model tests.

Every maker writes a Hugging Face folder (config.json + safetensors, sharded by
transformers' own save_pretrained) and returns a `Checkpoint` with the float model it
came from and the weights as the checkpoint's producer dequantizes them. The formats,
tensor by tensor, are described in docs/checkpoint_formats.md; this module is the
executable half of that description.

    from checkpoints import save_float_checkpoint, save_compressed_tensors
    ck = save_float_checkpoint(tmp_path / "llama", "llama", dtype=torch.float64)
    ck = save_compressed_tensors(tmp_path / "w4", "w4a16_asym", "qwen3", group_size=64)
    w = ck.reference["model.layers.0.self_attn.q_proj"]      # [N, K] float64
    y_ref = x @ w.T + ck.bias.get("model.layers.0.self_attn.q_proj", 0)

Who makes what:
- float models: transformers' own config and model classes (LlamaForCausalLM,
  Qwen2ForCausalLM, Qwen3ForCausalLM), every parameter re-drawn at random (no zero
  biases, no unit norms), saved with save_pretrained(max_shard_size=...).
- compressed-tensors: compressed-tensors' own presets, apply_quantization_config,
  calculate_qparams and ModelCompressor; the reference is its own
  CompressedTensorsDequantizer reading the saved folder. The one piece llm-compressor
  would add, the observer, is a min-max reduction over the scheme's blocks (what
  llm-compressor's default min-max observer computes for weights); llm-compressor
  itself is not installable beside transformers 5.24.
- HF fine-grained FP8: transformers' own Fp8Quantize / Fp8Dequantize ops.
- GPTQ (checkpoint_format "gptq" = v1 and "gptq_v2") and AutoAWQ GEMM: packers and
  dequantizers written here from the formats' published definitions (AutoGPTQ,
  GPTQModel and AutoAWQ sources read as descriptions); round-to-nearest quantization,
  since the packing, not GPTQ's error compensation, is what a loader reads.

No tp import here: the module needs torch, safetensors, transformers and
compressed-tensors only (pinned in requirements.txt).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Iterable, Optional

import torch

DEFAULT_SHARD = "1MB"  # every fixture below is split over several files

# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------

# Llama-3.1's rope scaling, with original_max_position_embeddings small enough that a
# test's positions cross the low/high frequency bands.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}

ARCHS = ("llama", "qwen2", "qwen3")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The shape of a tiny decoder, in the names config.json uses.

    `rope_scaling` holds the rope parameters other than rope_theta (None: plain RoPE).
    `attention_bias` / `mlp_bias` exist in LlamaConfig (q/k/v/o and gate/up/down);
    Qwen3Config has attention_bias only; Qwen2 always has q/k/v biases and no o bias,
    and its head_dim is always hidden_size / num_attention_heads.
    """

    arch: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int = 2
    vocab_size: int = 512
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch={self.arch!r}: expected one of {ARCHS}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.arch == "qwen2":
            if self.head_dim * self.num_attention_heads != self.hidden_size:
                raise ValueError("qwen2: head_dim is hidden_size / num_attention_heads; "
                                 f"got head_dim={self.head_dim}, hidden={self.hidden_size}, "
                                 f"heads={self.num_attention_heads}")
            if self.attention_bias or self.mlp_bias:
                raise ValueError("qwen2: the biases are fixed by the architecture (q/k/v only)")
        if self.arch == "qwen3" and self.mlp_bias:
            raise ValueError("qwen3 has no mlp_bias")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def hf_config(self, dtype: torch.dtype = torch.float32):
        """transformers' own config object for this spec."""
        from transformers import LlamaConfig, Qwen2Config, Qwen3Config

        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": float(self.rope_theta)}
        common = dict(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            num_hidden_layers=self.num_hidden_layers,
            vocab_size=self.vocab_size,
            tie_word_embeddings=self.tie_word_embeddings,
            rope_parameters=rope,
            rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            dtype=dtype,
        )
        if self.arch == "llama":
            return LlamaConfig(head_dim=self.head_dim, attention_bias=self.attention_bias,
                               mlp_bias=self.mlp_bias, **common)
        if self.arch == "qwen2":
            return Qwen2Config(**common)
        return Qwen3Config(head_dim=self.head_dim, attention_bias=self.attention_bias, **common)


# Defaults chosen for the TP sizes the tests run (1-4) and for the quantized formats
# (every K a multiple of 128, every N a multiple of 128 for FP8 blocks):
#   llama: 12 heads / 4 KV heads -> TP 1, 2, 4 split KV heads evenly; TP 3 is uneven.
#   qwen2: 12 heads / 6 KV heads -> TP 1, 2, 3 even; TP 4 uneven.
#   qwen3:  8 heads / 2 KV heads, head_dim 64 != hidden/heads = 32 -> TP 1, 2 even,
#           TP 4 replicates each KV head twice; TP 3 impossible.
# intermediate 768 (llama, qwen2) splits into 128-multiples at TP 2 and 3, not at 4.
SPECS = {
    "llama": ModelSpec("llama", hidden_size=384, intermediate_size=768, num_attention_heads=12,
                       num_key_value_heads=4, head_dim=32, rope_theta=500000.0, rms_norm_eps=1e-5),
    "qwen2": ModelSpec("qwen2", hidden_size=384, intermediate_size=768, num_attention_heads=12,
                       num_key_value_heads=6, head_dim=32, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen3": ModelSpec("qwen3", hidden_size=256, intermediate_size=512, num_attention_heads=8,
                       num_key_value_heads=2, head_dim=64, rope_theta=1000000.0, rms_norm_eps=1e-6),
}


def model_spec(arch: str = "llama", **overrides) -> ModelSpec:
    """The default spec of `arch` with fields replaced, e.g. model_spec("llama", rope_scaling=LLAMA3_ROPE)."""
    if arch not in SPECS:
        raise ValueError(f"arch={arch!r}: expected one of {ARCHS}")
    return dataclasses.replace(SPECS[arch], **overrides)


def even_tp_sizes(spec: ModelSpec, max_world: int = 4) -> list:
    """World sizes at which every rank gets the same whole number of query and KV heads
    (KV heads replicated when world > num_key_value_heads)."""
    out = []
    for w in range(1, max_world + 1):
        kv = spec.num_key_value_heads
        if spec.num_attention_heads % w == 0 and (kv % w == 0 or w % kv == 0):
            out.append(w)
    return out


def linear_names(spec: ModelSpec, include_lm_head: bool = True) -> list:
    """Module names of every linear layer, in checkpoint naming."""
    names = []
    for i in range(spec.num_hidden_layers):
        names += [f"model.layers.{i}.self_attn.{p}_proj" for p in ("q", "k", "v", "o")]
        names += [f"model.layers.{i}.mlp.{p}_proj" for p in ("gate", "up", "down")]
    if include_lm_head:
        names.append("lm_head")
    return names


def build_model(spec: ModelSpec, dtype: torch.dtype = torch.float32, seed: int = 0):
    """transformers' own model for `spec`, every parameter drawn at random, in eval mode.

    Values are drawn in float32 and then cast, so the float64 model of a seed holds
    exactly the float32 model's values. Linear weights ~ N(0, 1/K); embeddings ~ N(0, 1);
    biases ~ N(0, 0.1^2); RMSNorm weights ~ 1 + N(0, 0.1^2) (q_norm / k_norm too).
    """
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

    cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM}[spec.arch]
    torch.manual_seed(seed)
    model = cls(spec.hf_config(dtype)).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                r = 1.0 + 0.1 * r
            elif name.endswith(".bias"):
                r = 0.1 * r
            elif "embed_tokens" in name:
                pass
            else:
                r = r / p.shape[-1] ** 0.5
            p.copy_(r.to(dtype))
    return model.eval()


# ---------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Checkpoint:
    """A folder written by one of the makers below.

    folder:    the Hugging Face folder (config.json, model*.safetensors[, index]).
    spec:      the model's shape.
    format:    "float", "ct_<scheme>", "gptq", "gptq_v2", "awq" or "hf_fp8".
    model:     transformers' model holding the float weights the checkpoint was made
               from (before quantization), in eval mode.
    reference: module name -> weight [N, K] float64 as the producer dequantizes the
               stored tensors (for "float": the stored weight). Every linear layer,
               lm_head included.
    bias:      module name -> bias [N] float64 as stored (layers with a bias only).
    quantized: names of the modules stored in the quantized format.
    """

    folder: Path
    spec: ModelSpec
    format: str
    model: object
    reference: dict
    bias: dict
    quantized: list

    def config(self) -> dict:
        with open(self.folder / "config.json") as f:
            return json.load(f)

    def quantization_config(self) -> Optional[dict]:
        return self.config().get("quantization_config")

    def tensors(self) -> dict:
        return load_tensors(self.folder)


def load_tensors(folder) -> dict:
    """Every tensor of a folder, through the safetensors package (sharded or not)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        part = load_file(str(folder / name))
        dup = set(part) & set(out)
        if dup:
            raise ValueError(f"{folder}: tensors {sorted(dup)} appear in more than one shard")
        out.update(part)
    return out


def _float_refs(model, spec: ModelSpec):
    ref, bias = {}, {}
    for name in linear_names(spec):
        mod = model.get_submodule(name)
        ref[name] = mod.weight.detach().to(torch.float64).clone()
        if mod.bias is not None:
            bias[name] = mod.bias.detach().to(torch.float64).clone()
    return ref, bias


def _make_model(arch, dtype, seed, spec_overrides):
    spec = model_spec(arch, **spec_overrides)
    return spec, build_model(spec, dtype, seed)


def _add_quantization_config(folder: Path, qcfg: dict):
    path = folder / "config.json"
    with open(path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = qcfg
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def _rewrite_legacy_config(folder: Path):
    """config.json as transformers 4.x wrote it (most Hub checkpoints): top-level
    rope_theta, rope_scaling (null for plain RoPE), torch_dtype instead of dtype."""
    path = folder / "config.json"
    with open(path) as f:
        cfg = json.load(f)
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    cfg["torch_dtype"] = cfg.pop("dtype")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def save_float_checkpoint(folder, arch: str = "llama", *, dtype: torch.dtype = torch.float32, seed: int = 0,
                          max_shard_size=DEFAULT_SHARD, legacy_config: bool = False,
                          **spec_overrides) -> Checkpoint:
    """An unquantized model saved by transformers' save_pretrained.

    spec_overrides replace ModelSpec fields, e.g. tie_word_embeddings=True,
    rope_scaling=LLAMA3_ROPE, attention_bias=True. legacy_config=True rewrites
    config.json in the transformers 4.x form (rope_theta / rope_scaling / torch_dtype).
    """
    folder = Path(folder)
    spec, model = _make_model(arch, dtype, seed, spec_overrides)
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    if legacy_config:
        _rewrite_legacy_config(folder)
    ref, bias = _float_refs(model, spec)
    return Checkpoint(folder, spec, "float", model, ref, bias, [])


def _save_state_dict(model, state_dict: dict, folder: Path, max_shard_size):
    # save_pretrained writes config.json and the shards + index like for any model.
    model.save_pretrained(folder, state_dict=state_dict, max_shard_size=max_shard_size)


# ---------------------------------------------------------------------------------------
# compressed-tensors
# ---------------------------------------------------------------------------------------

# scheme name here -> compressed-tensors preset
CT_SCHEMES = {
    "fp8_tensor": "FP8",  # float-quantized: per-tensor weight scale, static per-tensor input scale
    "fp8_channel": "FP8_DYNAMIC",  # float-quantized: per-channel weight scale, dynamic per-token input
    "fp8_block": "FP8_BLOCK",  # float-quantized: 128x128 weight blocks, dynamic per-group(128) input
    "w8a8": "W8A8",  # int-quantized: int8 per-channel weight, dynamic per-token int8 input
    "w4a16": "W4A16",  # pack-quantized: int4 symmetric groups (128 unless group_size)
    "w4a16_asym": "W4A16_ASYM",  # pack-quantized: int4 asymmetric groups with packed zero points
    "nvfp4a16": "NVFP4A16",  # nvfp4-pack-quantized: E2M1 in groups of 16, E4M3 scales, a global scale
}


def _ct_observe_weight(weight: torch.Tensor, args):
    """min / max over the scheme's reduction blocks (llm-compressor's min-max observer
    for weights), then compressed-tensors' own calculate_qparams: (scale, zero point,
    global scale or None). NVFP4's global scale is compressed-tensors' generate_gparam
    over the whole tensor, as llm-compressor computes it before the group scales."""
    from compressed_tensors.quantization import QuantizationStrategy as S
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    n, k = weight.shape
    w = weight.detach()
    if args.strategy == S.TENSOR_GROUP:
        g = args.group_size
        gs = generate_gparam(w.amin(), w.amax()).reshape(1)
        wg = w.reshape(n, k // g, g)
        scale, zp = calculate_qparams(wg.amin(dim=-1), wg.amax(dim=-1), args, global_scale=gs)
        return scale, zp, gs
    if args.strategy == S.TENSOR:
        lo, hi = w.amin(), w.amax()
    elif args.strategy == S.CHANNEL:
        lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    elif args.strategy == S.GROUP:
        g = args.group_size
        if k % g:
            raise ValueError(f"in_features={k} is not a multiple of group_size={g}")
        wg = w.reshape(n, k // g, g)
        lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
    elif args.strategy == S.BLOCK:
        from compressed_tensors.quantization.utils import maybe_pad_tensor_for_block_quant

        bh, bw = args.block_structure
        wp = maybe_pad_tensor_for_block_quant(w, (bh, bw))  # pads with zeros, as compression does
        wb = wp.reshape(wp.shape[0] // bh, bh, wp.shape[1] // bw, bw)
        lo, hi = wb.amin(dim=(1, 3)), wb.amax(dim=(1, 3))
    else:
        raise ValueError(f"no observer here for weight strategy {args.strategy}")
    return (*calculate_qparams(lo, hi, args), None)


def _ct_calibrate_inputs(model, names: Iterable[str], seed: int, tokens: int = 32):
    """Per-tensor amax of each named linear's input over one random batch."""
    amax = {}
    hooks = []
    for name in names:
        def hook(mod, args, name=name):
            a = args[0].detach().abs().amax()
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, model.config.vocab_size, (2, tokens), generator=gen)
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return amax


def save_compressed_tensors(folder, scheme: str, arch: str = "llama", *, group_size: Optional[int] = None,
                            ignore: Iterable[str] = ("lm_head",), dtype: torch.dtype = torch.float32,
                            seed: int = 0, max_shard_size=DEFAULT_SHARD, **spec_overrides) -> Checkpoint:
    """A compressed-tensors checkpoint made with compressed-tensors' own API.

    scheme: a key of CT_SCHEMES. group_size: for w4a16 / w4a16_asym (32, 64, 128; the
    preset's is 128). ignore: compressed-tensors' ignore list (module names or "re:"
    regexes), written into config.json. The scales take the model's dtype (as
    compressed-tensors does; Hub checkpoints are bf16).
    """
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer
    from compressed_tensors.quantization import (QuantizationConfig, apply_quantization_config,
                                                 preset_name_to_scheme)
    from compressed_tensors.quantization.utils import calculate_qparams

    if scheme not in CT_SCHEMES:
        raise ValueError(f"scheme={scheme!r}: expected one of {sorted(CT_SCHEMES)}")
    folder = Path(folder)
    spec, model = _make_model(arch, dtype, seed, spec_overrides)
    float_model = copy.deepcopy(model)

    qscheme = preset_name_to_scheme(CT_SCHEMES[scheme], ["Linear"])
    if group_size is not None:
        if not scheme.startswith("w4a16"):
            raise ValueError(f"group_size applies to w4a16 / w4a16_asym, not {scheme}")
        qscheme.weights = qscheme.weights.model_copy(update={"group_size": int(group_size)})
    qconfig = QuantizationConfig(config_groups={"group_0": qscheme}, ignore=list(ignore))

    apply_quantization_config(model, qconfig)
    targets = [n for n, m in model.named_modules() if getattr(m, "quantization_scheme", None) is not None]
    static_inputs = qscheme.input_activations is not None and not qscheme.input_activations.dynamic
    amax = _ct_calibrate_inputs(float_model, targets, seed) if static_inputs else {}
    with torch.no_grad():
        for name in targets:
            mod = model.get_submodule(name)
            args = mod.quantization_scheme.weights
            scale, zp, gs = _ct_observe_weight(mod.weight, args)
            if gs is not None:
                mod.weight_global_scale.copy_(gs)
            mod.weight_scale.copy_(scale.to(mod.weight_scale.dtype))
            if hasattr(mod, "weight_zero_point"):
                mod.weight_zero_point.copy_(zp.to(mod.weight_zero_point.dtype))
            if static_inputs:
                a = amax[name].to(mod.input_scale.dtype)
                s, z = calculate_qparams(-a.reshape(1), a.reshape(1), mod.quantization_scheme.input_activations)
                mod.input_scale.copy_(s)
                if hasattr(mod, "input_zero_point"):
                    mod.input_zero_point.copy_(z.to(mod.input_zero_point.dtype))

    # llm-compressor's save wrapper does exactly these three steps.
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    compressor.update_config(str(folder))

    # The reference: compressed-tensors' own dequantizer over the tensors on disk.
    # It matches tensors by name only (any "<module>.weight" is a Linear to it), so it
    # is handed the quantized modules' tensors alone.
    stored = load_tensors(folder)
    target_set = set(targets)
    deq = CompressedTensorsDequantizer(str(folder), dtype=torch.float64).process(
        {k: v for k, v in stored.items() if k.rpartition(".")[0] in target_set})
    ref, bias = _float_refs(float_model, spec)
    for name in targets:
        ref[name] = deq[f"{name}.weight"]
        if scheme == "nvfp4a16":
            # compressed-tensors decompresses NVFP4 to bfloat16 last; the reference keeps the
            # float32 weight before that rounding (code * (scale / global scale), one
            # float32 rounding each), which the bfloat16 result must be.
            exact = nvfp4_dequantize(stored[f"{name}.weight_packed"], stored[f"{name}.weight_scale"],
                                     stored[f"{name}.weight_global_scale"], divide=True)
            if not torch.equal(exact.to(torch.bfloat16).double(), ref[name]):
                raise AssertionError(f"{name}: NVFP4 float32 dequantization is not compressed-tensors' before bf16")
            ref[name] = exact.double()
    for name in bias:
        bias[name] = stored[f"{name}.bias"].to(torch.float64)
    return Checkpoint(folder, spec, f"ct_{scheme}", float_model, ref, bias, targets)


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def nvfp4_dequantize(packed, scale, global_scale, *, divide: bool) -> torch.Tensor:
    """NVFP4 as its producers dequantize it, float32: E2M1 codes two a byte (element 2i in
    the low nibble) times the group-of-16 scale, scale / global (compressed-tensors'
    weight_global_scale, divide=True) or scale * global (ModelOpt's weight_scale_2)."""
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1).long()
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32)[codes]
    s = scale.to(torch.float32)
    g = global_scale.to(torch.float32)
    group = s / g if divide else s * g
    return values * group.repeat_interleave(16, dim=1)


# ---------------------------------------------------------------------------------------
# 4-bit packing into int32 words (GPTQ, AWQ; compressed-tensors' is the GPTQ order)
# ---------------------------------------------------------------------------------------

# AutoAWQ GEMM: nibble i (bits 4i..4i+3) of a word holds element AWQ_ORDER[i] of its 8.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_int4(u: torch.Tensor, dim: int, order=None) -> torch.Tensor:
    """Pack unsigned 4-bit values (0..15) 8 to an int32 word along `dim`.

    Element j of each run of 8 goes to nibble j (bits 4j..4j+3, little end first), or,
    with `order`, nibble i holds element order[i]. The word is stored as int32 (bit 31
    set -> negative), so `dim` shrinks 8x; its size must be a multiple of 8.
    """
    u = u.to(torch.int64)
    if u.min() < 0 or u.max() > 15:
        raise ValueError("pack_int4: values outside 0..15")
    u = u.movedim(dim, -1)
    if u.shape[-1] % 8:
        raise ValueError(f"pack_int4: size {u.shape[-1]} along dim {dim} is not a multiple of 8")
    u = u.reshape(*u.shape[:-1], u.shape[-1] // 8, 8)
    if order is not None:
        u = u[..., list(order)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    word = (u << shifts).sum(-1)
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    return word.movedim(-1, dim).contiguous()


def unpack_int4(words: torch.Tensor, dim: int, order=None) -> torch.Tensor:
    """The inverse of pack_int4: int32 words -> unsigned 4-bit values (int64), 8x along `dim`."""
    if words.dtype != torch.int32:
        raise ValueError(f"unpack_int4: expected int32 words, got {words.dtype}")
    w = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    nib = (w.unsqueeze(-1) >> torch.arange(0, 32, 4, dtype=torch.int64)) & 0xF  # [..., words, 8] by nibble
    if order is not None:
        inv = [list(order).index(j) for j in range(8)]  # element j sits in nibble inv[j]
        nib = nib[..., inv]
    nib = nib.reshape(*nib.shape[:-2], nib.shape[-2] * 8)
    return nib.movedim(-1, dim).contiguous()


# ---------------------------------------------------------------------------------------
# GPTQ
# ---------------------------------------------------------------------------------------


def gptq_quantize(weight: torch.Tensor, *, bits: int = 4, group_size: int = 128, sym: bool = True,
                  desc_act: bool = False, scale_dtype: torch.dtype = torch.float16, seed: int = 0,
                  min_zero: int = 0):
    """Round-to-nearest GPTQ quantization of weight [N, K] (GPTQ's quantizer: the range
    always includes 0; sym: zero = 2^(bits-1), scale = 2*max|w| / maxq; asym:
    scale = (max - min) / maxq, zero = round(-min / scale)).

    desc_act=True forms the groups over a (seeded random) column permutation, as GPTQ's
    act-order does over the Hessian order, and records it in g_idx.
    min_zero: asym zero points are clamped to >= min_zero (1 for v1, whose stored
    zero - 1 cannot hold -1).
    Returns q [N, K] (0..maxq), zeros [G, N], scales [G, N] (scale_dtype), g_idx [K] int32.
    """
    if bits != 4:
        raise ValueError("only 4-bit GPTQ is made here")
    maxq = 2**bits - 1
    w = weight.detach().to(torch.float64)
    n, k = w.shape
    g = k if group_size == -1 else group_size
    if k % g:
        raise ValueError(f"in_features={k} is not a multiple of group_size={g}")
    if desc_act:
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed + 7))
    else:
        perm = torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // g).to(torch.int32)
    ngroups = k // g
    wg = w[:, perm].reshape(n, ngroups, g)  # groups in the (permuted) quantization order
    lo = torch.clamp(wg.amin(-1), max=0.0)
    hi = torch.clamp(wg.amax(-1), min=0.0)
    if sym:
        hi = torch.maximum(lo.abs(), hi)
        lo = -hi
    scale = (hi - lo) / maxq
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    scale = scale.to(scale_dtype).to(torch.float64)  # quantize against the stored scale
    if sym:
        zero = torch.full_like(scale, (maxq + 1) // 2)
    else:
        zero = torch.clamp(torch.round(-lo / scale), min_zero, maxq)
    q = torch.clamp(torch.round(wg / scale.unsqueeze(-1)) + zero.unsqueeze(-1), 0, maxq)
    q = q.reshape(n, k)[:, torch.argsort(perm)].to(torch.int64)  # back to the original column order
    return q, zero.T.to(torch.int64).contiguous(), scale.T.to(scale_dtype).contiguous(), g_idx


def gptq_pack(q, zeros, scales, g_idx, checkpoint_format: str = "gptq") -> dict:
    """GPTQ tensors of one linear layer from gptq_quantize's outputs.

    qweight [K/8, N] int32: word [r, n] holds q[n, 8r + j] in nibble j.
    qzeros  [G, N/8] int32: word [g, c] holds zero[g, 8c + j] in nibble j, minus 1 in
            v1 ("gptq"), as is in v2 ("gptq_v2").
    scales  [G, N], g_idx [K] int32.
    """
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(f"checkpoint_format={checkpoint_format!r}: expected 'gptq' or 'gptq_v2'")
    z = zeros - 1 if checkpoint_format == "gptq" else zeros
    if z.min() < 0:
        raise ValueError("a zero point of 0 cannot be stored in GPTQ v1 (it stores zero - 1)")
    return {
        "qweight": pack_int4(q.T, dim=0),
        "qzeros": pack_int4(z, dim=1),
        "scales": scales,
        "g_idx": g_idx,
    }


def gptq_dequantize(qweight, qzeros, scales, g_idx, checkpoint_format: str = "gptq") -> torch.Tensor:
    """W [N, K] float64 from GPTQ tensors: W[n, k] = scale[g, n] * (q[k, n] - zero[g, n]),
    g = g_idx[k], zero = stored + 1 in v1 ("gptq"), stored in v2 ("gptq_v2")."""
    q = unpack_int4(qweight, dim=0)  # [K, N]
    z = unpack_int4(qzeros, dim=1)  # [G, N]
    if checkpoint_format == "gptq":
        z = z + 1
    elif checkpoint_format != "gptq_v2":
        raise ValueError(f"checkpoint_format={checkpoint_format!r}")
    gi = g_idx.to(torch.int64)
    w = scales.to(torch.float64)[gi] * (q - z[gi]).to(torch.float64)
    return w.T.contiguous()


def _gptq_config(writer: str, checkpoint_format: str, group_size: int, sym: bool, desc_act: bool) -> dict:
    if writer == "gptqmodel":
        # GPTQModel 7.x's QuantizeConfig.to_dict (the quantization_config of config.json
        # and quantize_config.json), trimmed of its run-time "meta" detail.
        return {
            "bits": 4, "dynamic": None, "group_size": group_size, "desc_act": desc_act, "sym": sym,
            "lm_head": False, "method": "gptq", "quant_method": "gptq",
            "format": checkpoint_format, "checkpoint_format": checkpoint_format,
            "pack_dtype": "int32",
            "meta": {"quantizer": ["gptqmodel:7.7.0"], "damp_percent": 0.05, "true_sequential": True,
                     "static_groups": False},
        }
    if writer == "autogptq":
        # AutoGPTQ 0.7.1's BaseQuantizeConfig.to_dict: no checkpoint_format, i.e. v1.
        if checkpoint_format != "gptq":
            raise ValueError("AutoGPTQ writes v1 only")
        return {
            "bits": 4, "group_size": group_size, "damp_percent": 0.01, "desc_act": desc_act,
            "static_groups": False, "sym": sym, "true_sequential": True, "model_name_or_path": None,
            "model_file_base_name": "model", "is_marlin_format": False, "quant_method": "gptq",
        }
    if writer == "transformers":
        from transformers import GPTQConfig

        return GPTQConfig(bits=4, group_size=group_size, sym=sym, desc_act=desc_act,
                          checkpoint_format=checkpoint_format).to_dict()
    raise ValueError(f"writer={writer!r}: expected gptqmodel, autogptq or transformers")


def save_gptq(folder, arch: str = "llama", *, checkpoint_format: str = "gptq", sym: bool = True,
              group_size: int = 128, desc_act: bool = False, scale_dtype: torch.dtype = torch.float16,
              writer: str = "gptqmodel", modules: Optional[Iterable[str]] = None,
              dtype: torch.dtype = torch.float32, seed: int = 0, max_shard_size=DEFAULT_SHARD,
              **spec_overrides) -> Checkpoint:
    """A GPTQ 4-bit checkpoint: every decoder linear (or `modules`) packed, lm_head and
    embeddings left in the model dtype. checkpoint_format "gptq" (v1) or "gptq_v2".
    The biases of quantized layers are stored in scale_dtype (the tools store fp16).
    writer picks whose config.json quantization_config is written: "gptqmodel",
    "autogptq" (no checkpoint_format field: v1) or "transformers" (GPTQConfig); the
    first two also write it to quantize_config.json, as those tools do."""
    folder = Path(folder)
    spec, model = _make_model(arch, dtype, seed, spec_overrides)
    names = list(modules) if modules is not None else linear_names(spec, include_lm_head=False)
    sd = dict(model.state_dict())
    ref, bias = _float_refs(model, spec)
    for i, name in enumerate(names):
        mod = model.get_submodule(name)
        q, zeros, scales, g_idx = gptq_quantize(mod.weight, group_size=group_size, sym=sym, desc_act=desc_act,
                                                scale_dtype=scale_dtype, seed=seed + i,
                                                min_zero=1 if checkpoint_format == "gptq" else 0)
        packed = gptq_pack(q, zeros, scales, g_idx, checkpoint_format)
        del sd[f"{name}.weight"]
        for key, t in packed.items():
            sd[f"{name}.{key}"] = t
        if mod.bias is not None:
            sd[f"{name}.bias"] = mod.bias.detach().to(scale_dtype)
            bias[name] = sd[f"{name}.bias"].to(torch.float64)
        ref[name] = gptq_dequantize(packed["qweight"], packed["qzeros"], packed["scales"], packed["g_idx"],
                                    checkpoint_format)
    _save_state_dict(model, sd, folder, max_shard_size)
    qcfg = _gptq_config(writer, checkpoint_format, group_size, sym, desc_act)
    _add_quantization_config(folder, qcfg)
    if writer in ("gptqmodel", "autogptq"):  # both tools also write it beside config.json
        with open(folder / "quantize_config.json", "w") as f:
            json.dump(qcfg, f, indent=2)
    return Checkpoint(folder, spec, checkpoint_format, model, ref, bias, names)


# ---------------------------------------------------------------------------------------
# AWQ (AutoAWQ GEMM)
# ---------------------------------------------------------------------------------------


def awq_quantize(weight: torch.Tensor, *, group_size: int = 128, scale_dtype: torch.dtype = torch.float16):
    """AutoAWQ's zero-point quantization of weight [N, K] over groups along K:
    scale = max(max - min, 1e-5) / 15, zero = clamp(-round(min / scale), 0, 15),
    q = clamp(round(w / scale) + zero, 0, 15) (no AWQ activation-aware search: the
    format is the same). Returns q [N, K], zeros [G, N], scales [G, N] (scale_dtype)."""
    w = weight.detach().to(torch.float64)
    n, k = w.shape
    g = k if group_size == -1 else group_size
    if k % g:
        raise ValueError(f"in_features={k} is not a multiple of group_size={g}")
    wg = w.reshape(n, k // g, g)
    hi, lo = wg.amax(-1), wg.amin(-1)
    scale = torch.clamp(hi - lo, min=1e-5) / 15
    scale = scale.to(scale_dtype).to(torch.float64)
    zero = torch.clamp(-torch.round(lo / scale), 0, 15)
    q = torch.clamp(torch.round(wg / scale.unsqueeze(-1)) + zero.unsqueeze(-1), 0, 15)
    return (q.reshape(n, k).to(torch.int64), zero.T.to(torch.int64).contiguous(),
            scale.T.to(scale_dtype).contiguous())


def awq_pack(q, zeros, scales) -> dict:
    """AutoAWQ GEMM tensors: qweight [K, N/8] int32 (word [k, c] holds q[8c + AWQ_ORDER[i], k]
    in nibble i), qzeros [G, N/8] int32 (same order, zero as is), scales [G, N]."""
    return {"qweight": pack_int4(q.T, dim=1, order=AWQ_ORDER),
            "qzeros": pack_int4(zeros, dim=1, order=AWQ_ORDER),
            "scales": scales}


def awq_dequantize(qweight, qzeros, scales) -> torch.Tensor:
    """W [N, K] float64 from AutoAWQ GEMM tensors: W[n, k] = scale[g, n] * (q[k, n] - zero[g, n]),
    g = k // (K / G)."""
    q = unpack_int4(qweight, dim=1, order=AWQ_ORDER)  # [K, N]
    z = unpack_int4(qzeros, dim=1, order=AWQ_ORDER)  # [G, N]
    group = q.shape[0] // z.shape[0]
    zf = z.repeat_interleave(group, dim=0)
    sf = scales.to(torch.float64).repeat_interleave(group, dim=0)
    return (sf * (q - zf).to(torch.float64)).T.contiguous()


def _awq_config(writer: str, group_size: int) -> dict:
    if writer == "autoawq":
        # AutoAWQ 0.2.x's AwqConfig.to_transformers_dict.
        return {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4,
                "version": "gemm", "modules_to_not_convert": None}
    if writer == "transformers":
        from transformers import AwqConfig

        return AwqConfig(bits=4, group_size=group_size, zero_point=True, version="gemm").to_dict()
    raise ValueError(f"writer={writer!r}: expected autoawq or transformers")


def save_awq(folder, arch: str = "llama", *, group_size: int = 128, scale_dtype: torch.dtype = torch.float16,
             writer: str = "autoawq", modules: Optional[Iterable[str]] = None, dtype: torch.dtype = torch.float32,
             seed: int = 0, max_shard_size=DEFAULT_SHARD, **spec_overrides) -> Checkpoint:
    """An AutoAWQ GEMM 4-bit checkpoint (zero_point true, the only GEMM variant); lm_head
    and embeddings in the model dtype; quantized layers' biases in scale_dtype."""
    folder = Path(folder)
    spec, model = _make_model(arch, dtype, seed, spec_overrides)
    names = list(modules) if modules is not None else linear_names(spec, include_lm_head=False)
    sd = dict(model.state_dict())
    ref, bias = _float_refs(model, spec)
    for name in names:
        mod = model.get_submodule(name)
        packed = awq_pack(*awq_quantize(mod.weight, group_size=group_size, scale_dtype=scale_dtype))
        del sd[f"{name}.weight"]
        for key, t in packed.items():
            sd[f"{name}.{key}"] = t
        if mod.bias is not None:
            sd[f"{name}.bias"] = mod.bias.detach().to(scale_dtype)
            bias[name] = sd[f"{name}.bias"].to(torch.float64)
        ref[name] = awq_dequantize(packed["qweight"], packed["qzeros"], packed["scales"])
    _save_state_dict(model, sd, folder, max_shard_size)
    _add_quantization_config(folder, _awq_config(writer, group_size))
    return Checkpoint(folder, spec, "awq", model, ref, bias, names)


# ---------------------------------------------------------------------------------------
# HF fine-grained FP8 (quant_method "fp8", DeepSeek-V3 / Qwen3-FP8 style)
# ---------------------------------------------------------------------------------------


def hf_fp8_dequantize(weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    """W [N, K] float64 = fp8 weight * weight_scale_inv broadcast over its blocks (block
    size N / scale rows by K / scale columns), through transformers' own Fp8Dequantize."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    op = Fp8Dequantize(FineGrainedFP8HfQuantizer(FineGrainedFP8Config()))
    return op._dequantize_one(weight, weight_scale_inv, output_dtype=torch.float64)


def save_hf_fp8(folder, arch: str = "llama", *, weight_block_size=(128, 128), writer: str = "transformers",
                modules: Optional[Iterable[str]] = None, dtype: torch.dtype = torch.float32, seed: int = 0,
                max_shard_size=DEFAULT_SHARD, **spec_overrides) -> Checkpoint:
    """A fine-grained FP8 checkpoint from transformers' own Fp8Quantize: weight
    float8_e4m3fn [N, K] + weight_scale_inv float32 [ceil(N/bm), ceil(K/bn)] for every
    decoder linear (or `modules`); lm_head, embeddings, norms and biases in the model
    dtype. writer: "transformers" (FineGrainedFP8Config.to_dict) or "deepseek" (the four
    keys DeepSeek-V3's config.json has). Every quantized N and K must be a multiple of the
    block (the default llama and qwen3 specs are; qwen2's k/v N = 6 * 32 is not: pass
    num_key_value_heads=4)."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    folder = Path(folder)
    spec, model = _make_model(arch, dtype, seed, spec_overrides)
    names = list(modules) if modules is not None else linear_names(spec, include_lm_head=False)
    cfg = FineGrainedFP8Config(weight_block_size=list(weight_block_size))
    op = Fp8Quantize(FineGrainedFP8HfQuantizer(cfg))
    sd = dict(model.state_dict())
    ref, bias = _float_refs(model, spec)
    bm, bn = weight_block_size
    for name in names:
        w = model.get_submodule(name).weight.detach()
        if w.shape[0] % bm or w.shape[1] % bn:
            # Fp8Quantize would silently leave such a weight in float.
            raise ValueError(f"{name}: weight {tuple(w.shape)} is not a multiple of the block {bm}x{bn}")
        out = op.convert({f"{name}.weight": w})
        sd.update(out)
        ref[name] = hf_fp8_dequantize(out[f"{name}.weight"], out[f"{name}.weight_scale_inv"])
    _save_state_dict(model, sd, folder, max_shard_size)
    if writer == "transformers":
        qcfg = cfg.to_dict()
    elif writer == "deepseek":
        qcfg = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": list(weight_block_size)}
    else:
        raise ValueError(f"writer={writer!r}: expected transformers or deepseek")
    _add_quantization_config(folder, qcfg)
    return Checkpoint(folder, spec, "hf_fp8", model, ref, bias, names)


# ---------------------------------------------------------------------------------------
# Quantization error bounds (relative Frobenius error of reference vs float weight)
# ---------------------------------------------------------------------------------------

# Upper bounds on ||W_deq - W|| / ||W|| for the default random weights; the test of this
# module checks them, so a layer test can use them as "within the format's error".
REL_ERROR = {
    "float": 0.0,
    "ct_fp8_tensor": 0.06, "ct_fp8_channel": 0.06, "ct_fp8_block": 0.06, "hf_fp8": 0.06,
    "ct_w8a8": 0.01,
    "ct_w4a16": 0.16, "ct_w4a16_asym": 0.12, "gptq": 0.16, "gptq_v2": 0.16, "awq": 0.12,
    "ct_nvfp4a16": 0.12,
}
