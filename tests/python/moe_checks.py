"""Per-rank checks of tp.MoEParallelMLP, built by a user from global sizes, against a
plain-torch reference of the same global weights (float64), forward and backward.

``run(rank, world, case)`` runs in each rank's process (launcher.py) and returns
{what: None if it matched, else what went wrong}. Every rank draws the same global
weights from a seed, so the reference needs no communication; each rank compares its
own slices of the gradients (its experts' rows / columns, its shared-expert slice).
"""

import traceback

import torch
import torch.nn.functional as F

import tp

DTYPE = torch.float64
TOL = 1e-9
HIDDEN, INTER, EXPERTS, TOP_K, SHARED = 24, 20, 6, 2, 28  # 20 over 3 ranks: 7, 7, 6

# name: (constructor keywords, what the reference computes). "softmax": Qwen2-MoE's block
# (softmax, top-k renormalised, a shared expert scaled by its sigmoid gate); "sigmoid":
# DeepSeek-V3 / GLM-4.5's grouped sigmoid routing with a correction bias and a scale.
CASES = {
    "softmax_shared": dict(router=dict(normalize_top_k=True), shared_expert_intermediate_size=SHARED,
                           shared_expert_gate=True),
    "sigmoid_grouped": dict(router=dict(scoring="sigmoid", num_groups=3, top_k_groups=2, score_correction_bias=True,
                                        scaling_factor=2.5, normalize_top_k=True)),
}


def _randn(seed, *shape, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=DTYPE) * scale


def global_weights(case):
    """The block's tensors under transformers' per-expert names, prefix "mlp"."""
    w = {"mlp.gate.weight": _randn(1, EXPERTS, HIDDEN)}
    for e in range(EXPERTS):
        w[f"mlp.experts.{e}.gate_proj.weight"] = _randn(10 + e, INTER, HIDDEN)
        w[f"mlp.experts.{e}.up_proj.weight"] = _randn(20 + e, INTER, HIDDEN)
        w[f"mlp.experts.{e}.down_proj.weight"] = _randn(30 + e, HIDDEN, INTER)
    kw = CASES[case]
    if kw.get("shared_expert_intermediate_size"):
        w["mlp.shared_expert.gate_proj.weight"] = _randn(40, SHARED, HIDDEN)
        w["mlp.shared_expert.up_proj.weight"] = _randn(41, SHARED, HIDDEN)
        w["mlp.shared_expert.down_proj.weight"] = _randn(42, HIDDEN, SHARED)
        w["mlp.shared_expert_gate.weight"] = _randn(43, 1, HIDDEN)
    if kw["router"].get("score_correction_bias"):
        # Held in float32, as transformers holds it: values float32 represents, so it gathers back exactly.
        w["mlp.gate.e_score_correction_bias"] = _randn(44, EXPERTS, scale=0.1).float().to(DTYPE)
    return w


def _route(logits, case, w):
    """(weights [tokens, top_k], experts [tokens, top_k]) as transformers' routers compute them."""
    r = CASES[case]["router"]
    if r.get("scoring", "softmax") == "softmax":
        p = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(p, TOP_K, dim=-1)
        if r.get("normalize_top_k", True):
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, experts
    s = torch.sigmoid(logits.float())
    choice = s + w["mlp.gate.e_score_correction_bias"].float()
    groups, top_groups = r["num_groups"], r["top_k_groups"]
    per_group = choice.view(-1, groups, EXPERTS // groups)
    group_scores = per_group.topk(2, dim=-1)[0].sum(-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(top_groups, dim=-1)[1], 1.0)
    mask = keep.unsqueeze(-1).expand_as(per_group).reshape(-1, EXPERTS)
    experts = choice.masked_fill(mask == 0, 0.0).topk(TOP_K, dim=-1)[1]
    weights = s.gather(1, experts)
    if r.get("normalize_top_k", True):
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * r["scaling_factor"], experts


def reference(x, w, case):
    """y [tokens, hidden] of tokens x [tokens, hidden] from the global tensors w (float64)."""
    weights, experts = _route(x @ w["mlp.gate.weight"].T, case, w)
    y = torch.zeros_like(x)
    for slot in range(TOP_K):
        for e in range(EXPERTS):
            rows = (experts[:, slot] == e).nonzero().flatten()
            if rows.numel() == 0:
                continue
            xe = x[rows]
            h = F.silu(xe @ w[f"mlp.experts.{e}.gate_proj.weight"].T) * (xe @ w[f"mlp.experts.{e}.up_proj.weight"].T)
            out = h @ w[f"mlp.experts.{e}.down_proj.weight"].T
            y = y.index_add(0, rows, weights[rows, slot].to(x.dtype).unsqueeze(-1) * out)
    if "mlp.shared_expert_gate.weight" in w:
        h = F.silu(x @ w["mlp.shared_expert.gate_proj.weight"].T) * (x @ w["mlp.shared_expert.up_proj.weight"].T)
        shared = h @ w["mlp.shared_expert.down_proj.weight"].T
        y = y + torch.sigmoid(x @ w["mlp.shared_expert_gate.weight"].T) * shared
    return y


def _close(what, got, want, tol=TOL):
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)} != expected {tuple(want.shape)}")
    err = (got - want).abs().max().item() if got.numel() else 0.0
    if err > tol:
        raise AssertionError(f"{what}: max abs error {err:.3g} > {tol:.1g}")


def _expected_grads(moe, ref_grads, case):
    """{parameter name: the reference gradient of this rank's slice of it}."""
    out = {"router_weight": ref_grads["mlp.gate.weight"]}
    begin, end = moe.local_range
    first, last = moe.local_experts
    for e in range(first, last):
        g = f"mlp.experts.{e}."
        out[f"experts.{e}.gate_up.weight"] = torch.cat(
            [ref_grads[g + "gate_proj.weight"][begin:end], ref_grads[g + "up_proj.weight"][begin:end]])
        out[f"experts.{e}.down.weight"] = ref_grads[g + "down_proj.weight"][:, begin:end]
    if "mlp.shared_expert_gate.weight" in ref_grads:
        sb, se = moe._impl.shared_expert_range
        s = "mlp.shared_expert."
        out["shared_expert.gate_up.weight"] = torch.cat(
            [ref_grads[s + "gate_proj.weight"][sb:se], ref_grads[s + "up_proj.weight"][sb:se]])
        out["shared_expert.down.weight"] = ref_grads[s + "down_proj.weight"][:, sb:se]
        out["shared_expert_gate_weight"] = ref_grads["mlp.shared_expert_gate.weight"]
    return out


def check(rank, world, case, ep):
    w = global_weights(case)
    moe = tp.MoEParallelMLP(HIDDEN, INTER, EXPERTS, TOP_K, expert_parallel_size=ep, dtype=DTYPE, **CASES[case])
    moe.load_weights(w, "mlp")
    assert moe.expert_parallel_size == (world if ep == 0 else ep), moe.expert_parallel_size

    x = _randn(2, 2, 9, HIDDEN, scale=1.0).requires_grad_(True)  # [batch, seq, hidden]: 18 tokens
    g = _randn(3, 2, 9, HIDDEN, scale=1.0)
    y = moe(x)
    (y * g).sum().backward()

    ref_w = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    ref_x = x.detach().clone().requires_grad_(True)
    want = reference(ref_x.reshape(-1, HIDDEN), ref_w, case).reshape(ref_x.shape)
    (want * g).sum().backward()

    _close("forward", y.detach(), want.detach())
    _close("input gradient", x.grad, ref_x.grad)
    grads = _expected_grads(moe, {k: v.grad for k, v in ref_w.items() if v.grad is not None}, case)
    params = dict(moe.named_parameters())
    assert set(grads) <= set(params), sorted(set(grads) - set(params))
    for name, expected in grads.items():
        _close(f"gradient of {name}", params[name].grad, expected)

    # gather_weights gives back the global tensors under the names load_weights read.
    gathered = moe.gather_weights("mlp")
    assert set(gathered) == set(w), sorted(set(gathered) ^ set(w))
    for name, t in w.items():
        _close(f"gathered {name}", gathered[name].to(DTYPE), t, 0.0)


def cases(world):
    """(case, expert_parallel_size) pairs at `world` ranks: expert TP, EP, and both."""
    eps = sorted({1, world} | ({2} if world == 4 else set()))
    return [(case, ep) for case in CASES for ep in eps]


def run(rank, world):
    out = {}
    for case, ep in cases(world):
        try:
            check(rank, world, case, ep)
            out[(case, ep)] = None
        except Exception:  # noqa: BLE001 - reported per case
            out[(case, ep)] = traceback.format_exc()
    return out
