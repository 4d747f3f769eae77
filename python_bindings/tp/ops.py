"""tp's operators for PyTorch's compiler stack: the fake kernels and autograd formulas of
the ``torch.ops.tp.*`` operators defined in C++ (python_bindings/src/ops.cpp).

The tp modules call these operators in their ``forward``, so ``torch.compile`` (also with
``fullgraph=True``), ``torch.export`` and AOTAutograd see each layer as one node whose
output shape they know, and the graph around the layers (norms, attention, residuals)
is traced and fused instead of being cut at every layer.

    op                                   forward                         backward
    tp.<layer>(module, x, params)        the layer's C++ forward         module_backward
    tp.vocab_parallel_cross_entropy      the vocab-parallel loss         module_backward
    tp.norm(module, x, params)           a model's norm                  module_backward
    tp.decoder_attention(module, q, k,   a decoder layer's attention     module_backward
        v, cos, sin, params)             (q/k norms, RoPE, GQA)
    tp.rotary_cos_sin(module, positions) a model's RoPE table            (positions: none)
    tp.copy_to_parallel(comm, x)         a copy                          reduce_from_parallel
    tp.reduce_from_parallel(comm, x)     all-reduce                      identity
    tp.gather_from_parallel              all-gather along dim            scatter_to_parallel
    tp.scatter_to_parallel               this rank's piece               gather_from_parallel
    tp.gather_from_sequence_parallel     all-gather the tokens           reduce_scatter_...
    tp.reduce_scatter_to_sequence_...    sum, this rank's tokens         gather_from_sequence_...

``module`` and ``comm`` are integer handles (``handle(module)``, ``comm_handle(comm)``):
a compiled graph holds them as constants, so it runs in the process that traced it,
while its modules live. ``module_backward`` reruns the layer's C++ forward with autograd
on and differentiates it: the same bits as the eager backward, for one more forward.
"""

import weakref
from typing import Dict

import torch

from . import _C

__all__ = ["handle", "comm_handle", "LAYER_OPS"]

LAYER_OPS = (
    "column_parallel_linear",
    "row_parallel_linear",
    "qkv_parallel_linear",
    "gate_up_parallel_linear",
    "vocab_parallel_embedding",
    "parallel_lm_head",
    "norm",
    "moe_parallel_mlp",
)

# handle -> the Python module, whose _fake_output(input) gives the op's output (fake).
_modules: Dict[int, "weakref.ref"] = {}
_comms: Dict[int, "weakref.ref"] = {}  # handle -> tp.Communicator (its world size and rank)


def handle(module) -> int:
    """The op handle of a tp layer module (made once, kept on the module)."""
    h = module.__dict__.get("_op_handle")
    if h is None:
        h = _C.op_module(module._impl)
        module.__dict__["_op_handle"] = h
        _modules[h] = weakref.ref(module)
    return h


def comm_handle(comm: "_C.Communicator") -> int:
    """The op handle of a tp.Communicator (one per communicator object)."""
    for h, ref in _comms.items():
        if ref() is comm:
            return h
    h = _C.op_communicator(comm)
    _comms[h] = weakref.ref(comm)
    return h


def _module(h: int):
    module = _modules.get(h)
    module = module() if module is not None else None
    if module is None:
        raise ValueError(f"tp op: no live tp module has handle {h}")
    return module


def _comm(h: int) -> "_C.Communicator":
    comm = _comms.get(h)
    comm = comm() if comm is not None else None
    if comm is None:
        raise ValueError(f"tp op: no live tp.Communicator has handle {h}")
    return comm


# ---- the layers -------------------------------------------------------------------------


def _layer_fake(module, input, params):
    return _module(module)._fake_output(input)


def _attention_fake(module, q, k, v, cos, sin, params):
    return _module(module)._fake_output(q)


def _rotary_fake(module, positions):
    return _module(module)._fake_output(positions)


def _module_autograd(method: str, count: int):
    """setup_context and backward of an op (module, <count> tensors, params): the
    gradients of every input and parameter that requires one, by module_backward."""

    def setup(ctx, inputs, output):
        module, *tensors, params = inputs
        ctx.module = module
        ctx.tp_count = count
        ctx.needs = [t.requires_grad for t in tensors] + [p.requires_grad for p in params]
        ctx.save_for_backward(*tensors, *params)

    def backward(ctx, grad):
        saved = ctx.saved_tensors
        tensors, params = list(saved[: ctx.tp_count]), list(saved[ctx.tp_count :])
        if not any(ctx.needs):
            return (None, *[None] * ctx.tp_count, [None] * len(params))
        grads = iter(torch.ops.tp.module_backward(ctx.module, method, tensors, [], params, grad, ctx.needs))
        picked = [next(grads) if need else None for need in ctx.needs]
        return (None, *picked[: ctx.tp_count], picked[ctx.tp_count :])

    return setup, backward


def _backward_fake(module, method, inputs, ints, params, grad_output, needs):
    return [torch.empty_like(t) for t, need in zip(list(inputs) + list(params), needs) if need]


def _cross_entropy_fake(module, local_logits, target, ignore_index):
    dtype = torch.float64 if local_logits.dtype == torch.float64 else torch.float32
    return local_logits.new_empty(local_logits.shape[:-1], dtype=dtype)


def _cross_entropy_setup(ctx, inputs, output):
    module, logits, target, ignore_index = inputs
    ctx.module, ctx.ignore_index = module, ignore_index
    ctx.save_for_backward(logits, target)
    ctx.need = logits.requires_grad


def _cross_entropy_backward(ctx, grad):
    logits, target = ctx.saved_tensors
    if not ctx.need:
        return None, None, None, None
    (g,) = torch.ops.tp.module_backward(ctx.module, "cross_entropy", [logits, target], [ctx.ignore_index], [],
                                        grad, [True, False])
    return None, g, None, None


# ---- the collectives ----------------------------------------------------------------------


def _with_dim(x, dim, size):
    shape = list(x.shape)
    shape[dim] = size
    return x.new_empty(shape)


def _copy_fake(comm, input):
    return torch.empty_like(input)


def _copy_backward(ctx, grad):
    # strategy 0 / wire 0: kAuto and kDefault, as the C++ copy_to_parallel's backward.
    return None, torch.ops.tp.reduce_from_parallel(ctx.comm, grad, 0, 0)


def _reduce_fake(comm, input, strategy, wire):
    return torch.empty_like(input)


def _reduce_backward(ctx, grad):
    return None, grad, None, None


def _gather_fake(comm, input, dim, sizes):
    return _with_dim(input, dim, sum(sizes))


def _gather_backward(ctx, grad):
    return None, torch.ops.tp.scatter_to_parallel(ctx.comm, grad, ctx.dim, ctx.sizes), None, None


def _scatter_fake(comm, input, dim, sizes):
    return _with_dim(input, dim, sizes[_comm(comm).rank])


def _scatter_backward(ctx, grad):
    return None, torch.ops.tp.gather_from_parallel(ctx.comm, grad, ctx.dim, ctx.sizes), None, None


def _gather_sequence_backward(ctx, grad):
    return None, torch.ops.tp.reduce_scatter_to_sequence_parallel(ctx.comm, grad, ctx.dim, ctx.sizes), None, None


def _reduce_scatter_backward(ctx, grad):
    return None, torch.ops.tp.gather_from_sequence_parallel(ctx.comm, grad, ctx.dim, ctx.sizes), None, None


def _setup_comm(ctx, inputs, output):
    ctx.comm = inputs[0]


def _setup_split(ctx, inputs, output):
    ctx.comm, _, ctx.dim, ctx.sizes = inputs


def _register():
    for name in LAYER_OPS:
        torch.library.register_fake(f"tp::{name}")(_layer_fake)
        setup, backward = _module_autograd("forward", 1)
        torch.library.register_autograd(f"tp::{name}", backward, setup_context=setup)
    torch.library.register_fake("tp::decoder_attention")(_attention_fake)
    setup, backward = _module_autograd("attention", 5)
    torch.library.register_autograd("tp::decoder_attention", backward, setup_context=setup)
    torch.library.register_fake("tp::rotary_cos_sin")(_rotary_fake)
    torch.library.register_fake("tp::module_backward")(_backward_fake)
    torch.library.register_fake("tp::vocab_parallel_cross_entropy")(_cross_entropy_fake)
    torch.library.register_autograd("tp::vocab_parallel_cross_entropy", _cross_entropy_backward,
                                    setup_context=_cross_entropy_setup)
    torch.library.register_fake("tp::copy_to_parallel")(_copy_fake)
    torch.library.register_autograd("tp::copy_to_parallel", _copy_backward, setup_context=_setup_comm)
    torch.library.register_fake("tp::reduce_from_parallel")(_reduce_fake)
    torch.library.register_autograd("tp::reduce_from_parallel", _reduce_backward, setup_context=_setup_comm)
    for name, fake, backward in (
        ("gather_from_parallel", _gather_fake, _gather_backward),
        ("scatter_to_parallel", _scatter_fake, _scatter_backward),
        ("gather_from_sequence_parallel", _gather_fake, _gather_sequence_backward),
        ("reduce_scatter_to_sequence_parallel", _scatter_fake, _reduce_scatter_backward),
    ):
        torch.library.register_fake(f"tp::{name}")(fake)
        torch.library.register_autograd(f"tp::{name}", backward, setup_context=_setup_split)


_register()
