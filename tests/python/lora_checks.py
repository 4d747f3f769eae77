"""Per-rank helpers the LoRA tests share (test_lora.py, test_lora_moe.py)."""


def adapter_grads_eager_and_compiled(model, compiled, ids, adapter):
    """Adapter `adapter` alone trainable (the base frozen): the gradients of its tensors after
    one cross-entropy backward through the eager model and through `compiled`, as
    {"grads_eager": [...], "grads_compiled": [...]} in adapter_parameters' order."""
    model.set_adapter(adapter)
    trained = [p for _, p in model.adapter_parameters(adapter)]
    for p in model.parameters():
        p.requires_grad_(any(p is t for t in trained))
    out = {}
    for key, fn in (("eager", model), ("compiled", compiled)):
        model.zero_grad(set_to_none=True)
        model.cross_entropy(fn(ids)[:, :-1], ids[:, 1:]).mean().backward()
        out[f"grads_{key}"] = [p.grad for p in trained]
    return out
