"""The float32 check the CausalLM tests share: tp in float32 against the folder's float64
reference logits, bounded by the peer, transformers' own model run in float32 (the same
weights rounded to float32), with room for another summation order."""

import torch

import tp


def rank_float32(rank, world, folder, names):
    """On each rank: {name: max |tp float32 logits - float64 reference|} (launcher.run target)."""
    from safetensors.torch import load_file

    out = {}
    for name in names:
        ref = load_file(f"{folder}/{name}.reference.safetensors")
        model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float32)
        with torch.no_grad():
            logits = model.gather_logits(model(ref["model.prompt"]))
        out[name] = (logits.double() - ref["model.logits"]).abs().max().item()
    return out


def check_against_transformers(folder, world, results, hf_kwargs=lambda name: {}):
    """Asserts every rank's error of each name in results[0] <= 4 x transformers' float32
    error + 1e-6 max |logit|; hf_kwargs(name): from_pretrained's extra arguments."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    for name in results[0]:
        ref = load_file(f"{folder}/{name}.reference.safetensors")
        hf = AutoModelForCausalLM.from_pretrained(f"{folder}/{name}", dtype=torch.float32, **hf_kwargs(name)).eval()
        with torch.no_grad():
            hf_err = (hf(ref["model.prompt"]).logits.double() - ref["model.logits"]).abs().max().item()
        scale = max(1.0, ref["model.logits"].abs().max().item())
        err = max(res[name] for res in results)
        print(f"\nTP {world} float32 {name}: max |logit err| tp {err:.2g}, transformers {hf_err:.2g}")
        assert err <= 4 * hf_err + 1e-6 * scale, f"{name} TP {world}: tp float32 {err:.3g} vs transformers {hf_err:.3g}"
