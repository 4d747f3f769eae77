"""Per-rank helpers the LoRA tests share (test_lora.py, test_lora_moe.py)."""

import peft
import torch
import torch.nn.functional as F


def causal_loss(logits, ids):
    """Next-token cross entropy of full logits [batch, seq, vocab] over ids [batch, seq]."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))


def peft_sgd_step(pm, ids, lr):
    """One SGD step of PEFT model `pm` (loaded is_trainable: its adapter's tensors alone
    trainable) on causal_loss: {"loss", "stepped": the adapter's tensors after it, under
    PEFT's names, "stepped_logits"}. The base's tables PEFT keeps beside an adapter on the
    embedding or the LM head (save_embedding_layers) are left out: tp checks them on load
    and does not write them."""
    params = [p for n, p in pm.named_parameters() if "lora_" in n]
    assert params and all(p.requires_grad for p in params)
    assert not any(p.requires_grad for n, p in pm.named_parameters() if "lora_" not in n)
    loss = causal_loss(pm(ids).logits, ids)
    loss.backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
        stepped = {k: v.clone() for k, v in peft.get_peft_model_state_dict(pm).items() if ".lora_" in k}
        return {"loss": loss.detach(), "stepped": stepped, "stepped_logits": pm(ids).logits}


def compiled_mixed_batch(model, ids, rows):
    """The model compiled (fullgraph, aot_eager) with row i taking adapter rows[i]: (compiled,
    {"breaks": graph breaks dynamo found, "eager": logits, "compiled": its logits}) without autograd."""
    model.set_adapter(rows)
    explanation = torch._dynamo.explain(model)(ids)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = {"breaks": explanation.graph_break_count}
    with torch.no_grad():
        out["eager"], out["compiled"] = model(ids), compiled(ids)
    return compiled, out


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


def tp_sgd_step(model, ids, adapter, lr):
    """One SGD step of tp.CausalLM `model` on adapter `adapter` alone (the base frozen), on
    the vocab-parallel cross entropy: {"loss", "stepped": the adapter gathered whole under
    PEFT's names, "stepped_logits"}. Collective."""
    model.set_adapter(adapter)
    trained = [p for _, p in model.adapter_parameters(adapter)]
    for p in model.parameters():
        p.requires_grad_(any(p is t for t in trained))
    loss = model.cross_entropy(model(ids)[:, :-1], ids[:, 1:]).mean()
    loss.backward()
    with torch.no_grad():
        for p in trained:
            p -= lr * p.grad
        out = {"loss": loss.detach(), "stepped": model.gather_adapter(adapter)}
        out["stepped_logits"] = model.gather_logits(model(ids))
    return out
