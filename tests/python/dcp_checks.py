"""Per-rank checks of tp.dcp_state_dict with torch.distributed.checkpoint: a model saved at
one TP size and loaded at another is the same model, bit for bit (every tensor gathered
whole equals the saved model's), and reading touches only this rank's shards."""

import resource

import torch
import torch.distributed.checkpoint as dcp

import tp


def _example_block(dtype, seed):
    import compile_checks

    llama_block = compile_checks._example()
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        block = llama_block.TPDecoderBlock(dict(llama_block.CONFIG, kv_heads=1))  # 1 KV head: replicated at TP > 1
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():  # distinct random values everywhere, norms included (same on every rank)
        g = torch.Generator().manual_seed(seed)
        for norm in (block.input_layernorm, block.post_attention_layernorm):
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=g, dtype=dtype))
    return block


def _model(kind, folder, seed, ep=False):
    if kind == "block":
        return _example_block(torch.float32, seed)
    model = tp.CausalLM.from_pretrained(f"{folder}/{kind}", dtype=torch.float64, expert_parallel=ep)
    if seed:  # other values than the folder's, so a load that did nothing is seen
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5).add_(0.25)
    return model


def save(rank, world, kind, folder, path, ep=False):
    """Saves the model (the folder's weights, or the seeded example block) at this TP size
    (a mixture of experts' experts split as `ep` says); returns every tensor gathered whole."""
    model = _model(kind, folder, 0, ep)
    dcp.save(tp.dcp_state_dict(model), checkpoint_id=path)
    return tp.gather_weights(model)


def load(rank, world, kind, folder, path, ep=False):
    """A model with other values, loaded from `path`: every tensor gathered whole, and
    this process's peak RSS growth during the load (KiB)."""
    model = _model(kind, folder, 1, ep)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    dcp.load(tp.dcp_state_dict(model), checkpoint_id=path)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return tp.gather_weights(model), grown


def quantized_layers(quant, seed):
    """QKV (1 KV head: replicated; 4 query heads: uneven at TP 3), O, gate/up and down, in
    `quant`, random codes and scales drawn from `seed`. Heads of 32 (of 128 for FP8 block,
    whose 128 x 128 blocks every rank's slice must hold whole)."""
    torch.manual_seed(seed)
    d = 128 if quant.startswith("fp8_block") else 32
    hidden, inter = 4 * d, 8 * d
    qkv = tp.QKVParallelLinear(hidden, d, 4, 1, quant=quant, dtype=torch.bfloat16)
    return torch.nn.ModuleDict(dict(
        qkv=qkv,
        o=tp.RowParallelLinear(hidden, hidden, bias=False, split=qkv.attention_output_split(), quant=quant,
                               dtype=torch.bfloat16),
        gate_up=tp.GateUpParallelLinear(hidden, inter, quant=quant, dtype=torch.bfloat16),
        down=tp.RowParallelLinear(inter, hidden, quant=quant, dtype=torch.bfloat16),
    ))


def pieces(sd):
    """{name: (global shape, [(offsets, this rank's values)])} of a dcp_state_dict."""
    return {n: (tuple(p.shape), [(o, v.clone()) for o, v in p._pieces]) for n, p in sd.items()}


def save_quantized(rank, world, quant, path):
    sd = tp.dcp_state_dict(quantized_layers(quant, 0))
    dcp.save(sd, checkpoint_id=path)
    return pieces(sd)


def load_quantized(rank, world, quant, path):
    sd = tp.dcp_state_dict(quantized_layers(quant, 1))
    before = pieces(sd)
    dcp.load(sd, checkpoint_id=path)
    return before, pieces(sd)
