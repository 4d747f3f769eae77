"""Per-rank checks of tp's operators (torch.ops.tp.*, tp/ops.py) under PyTorch's compiler
stack: torch.library.opcheck of every operator, torch.compile(fullgraph=True) of the
example decoder block against eager (forward and every gradient), and torch.export.

Each function runs in every rank's process (launcher.py) at world 1 or under a real
gloo process group, and raises on a mismatch.
"""

import os
import sys

import torch
from torch.library import opcheck

import tp

_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def _example():
    if _EXAMPLES not in sys.path:
        sys.path.insert(0, _EXAMPLES)
    import llama_block

    return llama_block


def _randn(seed, *shape, dtype=torch.float64, grad=False):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return t.requires_grad_(grad)


def _layer_cases(dtype):
    """(name, layer, input) for every layer op, with uneven shards at world 3 and 4 and
    replicated KV heads (2 KV heads) at world 3 and 4."""
    col = tp.ColumnParallelLinear(13, 10, dtype=dtype)
    gathered = tp.ColumnParallelLinear(13, 10, gather_output=True, dtype=dtype)
    row = tp.RowParallelLinear(11, 7, dtype=dtype)
    row_sp = tp.RowParallelLinear(11, 7, dtype=dtype, sequence_parallel=True)
    qkv = tp.QKVParallelLinear(16, 4, 6, 2, bias=True, dtype=dtype)
    gate_up = tp.GateUpParallelLinear(16, 9, dtype=dtype)
    embedding = tp.VocabParallelEmbedding(21, 8, pad_to_multiple_of=4, dtype=dtype)
    head = tp.ParallelLMHead(8, 21, dtype=dtype)
    tied = tp.ParallelLMHead.tied(embedding)
    rb, re = row.local_range()
    ids = torch.randint(0, 21, (3, 5), generator=torch.Generator().manual_seed(9))
    return [
        ("column", col, _randn(1, 3, 13, dtype=dtype, grad=True)),
        ("column gather_output", gathered, _randn(2, 2, 3, 13, dtype=dtype, grad=True)),
        ("row", row, _randn(3, 5, re - rb, dtype=dtype, grad=True)),
        ("row sequence_parallel", row_sp, _randn(4, 7, 2, re - rb, dtype=dtype, grad=True)),
        ("qkv", qkv, _randn(5, 2, 3, 16, dtype=dtype, grad=True)),
        ("gate_up", gate_up, _randn(6, 4, 16, dtype=dtype, grad=True)),
        ("vocab embedding", embedding, ids),
        ("lm head", head, _randn(7, 3, 8, dtype=dtype, grad=True)),
        ("tied lm head", tied, _randn(8, 3, 8, dtype=dtype, grad=True)),
    ]


def _quant_cases():
    """Quantized layers (frozen integer weights: only the input gradient)."""
    cases = []
    for quant in ("int8_w8a8", "int4_gptq", "fp8_block"):
        col = tp.ColumnParallelLinear(128, 48, quant=quant, dtype=torch.float32)
        row = tp.RowParallelLinear(256, 16, quant=quant, dtype=torch.float32)
        rb, re = row.local_range()
        cases.append((f"column {quant}", col, _randn(11, 5, 128, dtype=torch.float32, grad=True)))
        cases.append((f"row {quant}", row, _randn(12, 3, re - rb, dtype=torch.float32, grad=True)))
    return cases


def opcheck_every_op(rank, world):
    """torch.library.opcheck (schema, fake tensor, autograd registration, AOT dispatch
    with static and dynamic shapes) of every tp operator on this rank's shards."""
    checked = []
    for name, layer, x in _layer_cases(torch.float64) + _quant_cases():
        op = getattr(torch.ops.tp, layer._op_name)
        args = (layer._op_handle, x, layer._op_params())
        if any(p.dtype == torch.float8_e4m3fn for p in args[2]):
            # opcheck's test_schema compares arguments with allclose, which float8 lacks in
            # torch: the same no-mutation check on their bytes, then the other tests.
            before = [p.detach().view(torch.uint8).clone() for p in args[2]]
            op(*args)
            if not all(torch.equal(b, p.detach().view(torch.uint8)) for b, p in zip(before, args[2])):
                raise AssertionError(f"{name}: the op wrote into a parameter")
            opcheck(op, args, test_utils=("test_autograd_registration", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))
        else:
            opcheck(op, args)
        checked.append(name)
    head = _layer_cases(torch.float64)[7][1]
    logits = head(_randn(13, 4, 8)).detach().requires_grad_()
    target = torch.tensor([0, 5, 20, -100])
    opcheck(torch.ops.tp.vocab_parallel_cross_entropy, (head._op_handle, logits, target, -100))
    checked.append("vocab_parallel_cross_entropy")

    comm = tp.distributed.communicator(None)
    c = tp.ops.comm_handle(comm)
    x = _randn(14, 3, 5, grad=True)
    sizes = [2 + (r % 2) for r in range(world)]  # uneven pieces
    piece = _randn(15 + rank, 4, sizes[rank], grad=True)
    total = _randn(16, 4, sum(sizes), grad=True)
    for name, args in (
        ("copy_to_parallel", (c, x)),
        ("reduce_from_parallel", (c, x, 0, 0)),
        ("gather_from_parallel", (c, piece, -1, sizes)),
        ("scatter_to_parallel", (c, total, -1, sizes)),
        ("gather_from_sequence_parallel", (c, piece, 1, sizes)),
        ("reduce_scatter_to_sequence_parallel", (c, total, 1, sizes)),
    ):
        opcheck(getattr(torch.ops.tp, name), args)
        checked.append(name)
    return checked


def _block(llama_block, dtype, quant):
    torch.manual_seed(0)
    cfg = llama_block.CONFIG
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        block = llama_block.TPDecoderBlock(cfg, quant=quant)
    finally:
        torch.set_default_dtype(previous)
    sd = {k: v.to(dtype) for k, v in llama_block.hf_state_dict(cfg).items()}
    if quant is None:
        block.load_hf(sd, "model.layers.0.")
    else:  # the quantized projections keep their random initialisation; the norms load
        with torch.no_grad():
            for norm in ("input_layernorm", "post_attention_layernorm"):
                getattr(block, norm).weight.copy_(sd[f"model.layers.0.{norm}.weight"])
    return block


def _grads(block, x):
    return [x.grad] + [p.grad for p in block.parameters() if p.requires_grad]


def _run(block, fn, x0, g):
    block.zero_grad(set_to_none=True)
    x = x0.detach().clone().requires_grad_()
    y = fn(x)
    (y * g).sum().backward()
    return y.detach(), _grads(block, x)


def compiled_block_matches_eager(rank, world, dtype, quant, backend):
    """The example block under torch.compile(fullgraph=True): no graph break, and the
    output and every gradient (input, norms, projections) equal to eager: bitwise with
    aot_eager, within `tol` (relative to the largest value) with inductor."""
    llama_block = _example()
    cfg = llama_block.CONFIG
    block = _block(llama_block, dtype, quant)
    x0 = _randn(1, cfg["batch"], cfg["seq"], cfg["hidden"], dtype=dtype)
    g = _randn(2, cfg["batch"], cfg["seq"], cfg["hidden"], dtype=dtype)

    explanation = torch._dynamo.explain(block)(x0)
    if explanation.graph_break_count != 0 or explanation.graph_count != 1:
        raise AssertionError(f"{explanation.graph_count} graphs, {explanation.graph_break_count} breaks: "
                             f"{explanation.break_reasons}")

    y_eager, grads_eager = _run(block, block, x0, g)
    torch._dynamo.reset()
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    y_comp, grads_comp = _run(block, compiled, x0, g)
    worst = 0.0
    for name, got, want in [("y", y_comp, y_eager)] + [
        (f"grad {i}", a, b) for i, (a, b) in enumerate(zip(grads_comp, grads_eager))
    ]:
        if got is None or want is None or got.shape != want.shape:
            raise AssertionError(f"{name}: {None if got is None else got.shape} vs {None if want is None else want.shape}")
        scale = want.abs().max().item() or 1.0
        worst = max(worst, (got - want).abs().max().item() / scale)
    return worst


def export_matches_eager(rank, world, dtype):
    """torch.export of a tp layer and of the example block: the exported program runs and
    gives the eager output (bitwise: the same kernels)."""
    llama_block = _example()
    cfg = llama_block.CONFIG
    block = _block(llama_block, dtype, None)
    x = _randn(3, cfg["batch"], cfg["seq"], cfg["hidden"], dtype=dtype)
    for what, module in (("qkv layer", block.qkv), ("block", block)):
        with torch.no_grad():
            want = module(x)
        program = torch.export.export(module, (x,))
        names = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        if not any(n.startswith("tp.") for n in names):
            raise AssertionError(f"{what}: no tp operator in the exported graph: {sorted(names)}")
        got = program.module()(x)
        if not torch.equal(got, want):
            raise AssertionError(f"{what}: exported output differs by {(got - want).abs().max().item():.3g}")
    return True


def compiled_loss_matches_eager(rank, world):
    """Embedding -> LM head -> vocab-parallel cross entropy, compiled: the same loss and
    embedding gradient as eager (the vocab-parallel ops trace, padding included)."""
    torch.manual_seed(0)
    embedding = tp.VocabParallelEmbedding(21, 8, pad_to_multiple_of=4, dtype=torch.float64)
    head = tp.ParallelLMHead.tied(embedding)

    def loss_fn(ids, target):
        return head.cross_entropy(head(torch.tanh(embedding(ids))), target).mean()

    ids = torch.randint(0, 21, (3, 5), generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 21, (3, 5), generator=torch.Generator().manual_seed(2))
    target[0, 0] = -100
    results = []
    for fn in (loss_fn, torch.compile(loss_fn, backend="aot_eager", fullgraph=True)):
        embedding.zero_grad(set_to_none=True)
        loss = fn(ids, target)
        loss.backward()
        results.append((loss.detach(), embedding.weight.grad.clone()))
    (l0, g0), (l1, g1) = results
    if not (torch.equal(l0, l1) and torch.equal(g0, g1)):
        raise AssertionError(f"loss {l0.item()} vs {l1.item()}, grad diff {(g0 - g1).abs().max().item():.3g}")
    return True


def compiled_block_cases(rank, world, cases, backend):
    """compiled_block_matches_eager for each (dtype, quant) of `cases`."""
    return [compiled_block_matches_eager(rank, world, dtype, quant, backend) for dtype, quant in cases]


def _opcheck_model_ops(model, ids):
    """opcheck of the operators only a tp.CausalLM has: norm, decoder_attention (with
    Qwen3's q/k norm weights as parameters), rotary_cos_sin."""
    b, s = ids.shape
    positions = torch.arange(s).unsqueeze(0).expand(b, s)
    opcheck(torch.ops.tp.rotary_cos_sin, (model._op_handle, positions))
    with torch.no_grad():
        cos, sin = torch.ops.tp.rotary_cos_sin(model._op_handle, positions).unbind(0)[:2]
        x = model.embed_tokens(ids)
    layer = model.layers[0]
    norm = layer.input_layernorm
    opcheck(torch.ops.tp.norm, (norm._op_handle, x.clone().requires_grad_(), norm._op_params()))
    with torch.no_grad():
        q, k, v = (t.clone().requires_grad_() for t in layer.qkv.split(layer.qkv(norm(x))))
    opcheck(torch.ops.tp.decoder_attention, (layer._op_handle, q, k, v, cos, sin, layer._attention_params()))


def _same_grad(name, param, a, b) -> bool:
    """Equal gradients. Only a mixture of experts' expert may have none (no token reached it:
    None eagerly, where the compiled graph's backward may give zeros; both are a zero
    gradient); every other parameter must have one on both sides."""
    if (a is None or b is None) and ".experts." not in name:
        return False
    zeros = torch.zeros_like(param)
    return torch.equal(zeros if a is None else a, zeros if b is None else b)


def compiled_causal_lm_matches_eager(rank, world, folder, names, dtype):
    """tp.CausalLM from each Hugging Face folder: its module forward (children through the
    tp operators) equals the C++ model's forward bit for bit; compiled with
    fullgraph=True (aot_eager) it is one graph, and the logits, the vocab-parallel loss
    and every parameter's gradient equal eager's bit for bit. {name: "ok" | error}."""
    out = {}
    for name in names:
        try:
            model = tp.CausalLM.from_pretrained(f"{folder}/{name}", dtype=dtype)
        except ValueError as e:  # e.g. 2 KV heads over 3 ranks: refused on every rank
            out[name] = f"refused: {e}"
            continue
        ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(3))
        target = torch.roll(ids, -1, 1)
        with torch.no_grad():
            if not torch.equal(model(ids), model._impl.forward(ids)):
                raise AssertionError(f"{name}: the module forward differs from the C++ model's")
        _opcheck_model_ops(model, ids)
        explanation = torch._dynamo.explain(model)(ids)
        if explanation.graph_break_count != 0:
            raise AssertionError(f"{name}: {explanation.graph_break_count} graph breaks: {explanation.break_reasons}")
        torch._dynamo.reset()
        runs = []
        for fn in (model, torch.compile(model, backend="aot_eager", fullgraph=True)):
            model.zero_grad(set_to_none=True)
            logits = fn(ids)
            loss = model.lm_head.cross_entropy(logits, target).mean()
            loss.backward()
            runs.append((logits.detach(), loss.detach(), [p.grad for p in model.parameters()]))
        (l0, s0, g0), (l1, s1, g1) = runs
        if not (torch.equal(l0, l1) and torch.equal(s0, s1)):
            raise AssertionError(f"{name}: compiled logits / loss differ from eager")
        bad = [n for (n, p), a, b in zip(model.named_parameters(), g0, g1) if not _same_grad(n, p, a, b)]
        if bad:
            raise AssertionError(f"{name}: compiled gradients differ from eager for {bad}")
        out[name] = "ok"
    return out
