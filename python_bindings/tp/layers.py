"""The tensor-parallel layers as torch.nn.Modules.

Each module holds the C++ module (``self._impl``) and registers the C++ module's own
tensors as its parameters: the very same tensors (one TensorImpl, not a copy), so
``parameters()``, ``state_dict()``, ``load_state_dict()``, optimizers and autograd
all act on what the C++ forward reads. ``.to()``, ``.half()``, ``.cuda()`` swap the
data of those tensors in place (as torch::nn::Module::to does), so both sides stay
in sync. Sizes are GLOBAL; parameters have this rank's LOCAL shapes.
"""

import functools
import inspect
from typing import Dict, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from . import _C, ops
from .distributed import all_reduce_strategy, communicator as make_communicator, wire_precision
from .loading import LoadSession

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "QKVParallelLinear",
    "GateUpParallelLinear",
    "gather_weights",
]

QuantLike = Union[None, str, "_C.QuantFormat", "_C.QuantConfig"]
CheckpointLike = Union["_C.Checkpoint", "LoadSession", Mapping[str, torch.Tensor]]


def _quant_config(quant: QuantLike) -> "_C.QuantConfig":
    if quant is None:
        return _C.QuantConfig()
    if isinstance(quant, _C.QuantConfig):
        return quant
    if isinstance(quant, _C.QuantFormat):
        return _C.QuantConfig(quant)
    if isinstance(quant, str):
        return _C.QuantConfig.parse(quant)  # "int4_gptq:g64:asym"; a ValueError lists the names
    raise TypeError(f"quant: expected None, a format name, QuantFormat or QuantConfig, got {type(quant).__name__}")


NumericsLike = Union[str, "_C.Numerics"]


def _numerics(numerics: NumericsLike) -> "_C.Numerics":
    """A layer's numerics: "auto" (TP_NUMERICS, else default), "default", "invariant" or a tp.Numerics."""
    if isinstance(numerics, _C.Numerics):
        return numerics
    if isinstance(numerics, str):
        return _C.parse_numerics(numerics)  # a ValueError names the three
    raise TypeError(f"numerics: expected \"auto\", \"default\", \"invariant\" or a tp.Numerics, "
                    f"got {type(numerics).__name__}")


# The keyword-only arguments the layers share, each (default, annotation), declared
# once: _layer_keywords adds them to a layer's __init__ and to its signature, so help(),
# IDEs and inspect.signature show every one, and a misspelt keyword is a TypeError that
# lists them.
_SEQUENCE_KEYWORDS = {
    "sequence_parallel": (False, bool),
    "sequence_dim": (0, int),
}
_GATHER_KEYWORDS = {"gather_output": (False, bool), **_SEQUENCE_KEYWORDS}
_COMMON_KEYWORDS = {
    "quant": (None, QuantLike),
    # The order of the layer's sums (tp/layers/numerics/numerics.h): "invariant" gives TP 1's
    # bits at every TP size and batch; "auto" reads TP_NUMERICS.
    "numerics": ("auto", NumericsLike),
    "split": (None, Optional["_C.SplitPolicy"]),
    "dtype": (None, Optional[torch.dtype]),
    "device": (None, inspect.Parameter.empty),
    "group": (None, Optional["dist.ProcessGroup"]),
    "communicator": (None, Optional["_C.Communicator"]),
    # False: the weights are allocated uninitialized (torch.empty), as torch.nn.utils.skip_init
    # leaves them, for load_weights to fill; True: drawn at random, as nn.Linear's are.
    "init_weights": (True, bool),
}


def _layer_keywords(*groups):
    """Decorates ``__init__(self, ..., **keywords)``: it receives exactly the keywords
    of ``groups`` beside its own, each filled with its default when not given."""
    shared = {name: spec for group in groups for name, spec in group.items()}

    def decorate(init):
        own = inspect.signature(init)
        params = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        taken = {p.name for p in params}
        params += [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            for name, (default, annotation) in shared.items()
            if name not in taken
        ]

        @functools.wraps(init)
        def wrapper(self, *args, **keywords):
            unknown = sorted(set(keywords) - set(shared) - taken)
            if unknown:
                accepted = ", ".join(p.name for p in params[1:])
                raise TypeError(
                    f"{type(self).__name__}: unexpected keyword argument(s) {', '.join(unknown)}; it takes {accepted}"
                )
            for name, (default, _) in shared.items():
                keywords.setdefault(name, default)
            return init(self, *args, **keywords)

        wrapper.__signature__ = own.replace(parameters=params)
        return wrapper

    return decorate


def _apply_in_place(module: nn.Module, fn) -> None:
    """``fn`` (what ``.to()``, ``.half()`` ... apply) on ``module``'s own parameters and
    buffers, each Parameter keeping its object: its data is swapped in place, so a C++
    module holding the same tensor sees the result (as torch::nn::Module::to does)."""
    for name, param in module._parameters.items():
        if param is None:
            continue
        with torch.no_grad():
            applied = fn(param)
        if applied is not param:
            if not torch._has_compatible_shallow_copy_type(param, applied):
                raise RuntimeError(
                    f"{type(module).__name__}: cannot convert parameter '{name}' in place "
                    f"({param.type()} -> {applied.type()}); the C++ module must keep its tensor"
                )
            param.data = applied
        if param.grad is not None:
            with torch.no_grad():
                grad = fn(param.grad)
            if grad is not param.grad:
                param.grad = grad
    for key, buf in module._buffers.items():
        if buf is not None:
            module._buffers[key] = fn(buf)


class _OnCommunicator:
    """The communicator of a module over a C++ module (``self._impl``), and its rank and size."""

    @property
    def communicator(self) -> "_C.Communicator":
        return self._impl.communicator

    @property
    def rank(self) -> int:
        return self._impl.communicator.rank

    @property
    def world_size(self) -> int:
        return self._impl.communicator.world_size


class _ParallelLinear(_OnCommunicator, nn.Module):
    """What the four layers share: the C++ module and its tensors as parameters."""

    def __init__(self, impl_type, options, *, bias, quant, numerics, split, dtype, device, group, communicator,
                 **fields):
        """Fills the C++ ``options`` from the keywords every layer takes (and the layer's
        own ``fields``), resolves the communicator, and builds ``impl_type(options, comm)``."""
        super().__init__()
        options.bias = bias
        options.quant = _quant_config(quant)
        options.numerics = _numerics(numerics)
        if split is not None:
            options.split = split
        options.dtype = torch.get_default_dtype() if dtype is None else dtype
        options.device = torch.device("cpu" if device is None else device)
        for name, value in fields.items():
            setattr(options, name, value)
        self._build(impl_type, options, group, communicator)

    def _build(self, impl_type, options, group, communicator):
        """Builds ``impl_type(options, comm)`` and registers its tensors as parameters."""
        if communicator is not None and group is not None:
            raise ValueError("pass either group= or communicator=, not both")
        comm = communicator if communicator is not None else make_communicator(group)
        self._adopt(impl_type(options, comm))

    def _adopt(self, impl) -> None:
        """Takes the C++ module ``impl``: its tensors become this module's parameters."""
        self._impl = impl
        for name, tensor in impl.named_parameters():
            if type(tensor) is not nn.Parameter:
                # The C++ tensor itself becomes the Parameter (same object, same TensorImpl).
                tensor.__class__ = nn.Parameter
            self.register_parameter(name, tensor)
        if "bias" not in self._parameters:
            self.register_parameter("bias", None)
        ops.handle(self)
        self._op_setup()

    @classmethod
    def _from_impl(cls, impl):
        """The module over an existing C++ layer (a tp.CausalLM's child)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._adopt(impl)
        return layer

    def _op_setup(self) -> None:
        """What the operator path needs to know eagerly (the fused layers' split)."""

    @classmethod
    def from_options(cls, options, *, group: Optional["dist.ProcessGroup"] = None,
                     communicator: Optional["_C.Communicator"] = None):
        """The layer from its C++ options, e.g. those tp.ModelConfig gives::

            opts = tp.ModelConfig.from_pretrained(folder).decoder_layer_options(0)
            qkv = tp.QKVParallelLinear.from_options(opts.qkv)
            o = tp.RowParallelLinear.from_options(opts.o_proj(qkv))
        """
        if not isinstance(options, cls._options_type):
            raise TypeError(f"{cls.__name__}.from_options: expected {cls._options_type.__name__}, "
                            f"got {type(options).__name__}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._build(cls._impl_type, options, group, communicator)
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The C++ forward (GIL released, collectives included). Under torch.compile /
        torch.export it is the operator torch.ops.tp.<layer> (tp/ops.py), one node of known
        shape; eagerly the C++ module runs with its own autograd nodes (no recompute)."""
        if torch.compiler.is_compiling():
            return getattr(torch.ops.tp, self._op_name)(self._op_handle, input, self._op_params())
        return self._impl.forward(input)

    def _op_params(self):
        """The layer's own tensors, in the C++ registration order (the op checks them), then
        its LoRA adapters' (the child ``lora``), so a traced graph's gradients reach them."""
        own = [p for p in self._parameters.values() if p is not None]
        lora = self._modules.get("lora")
        return own + list(lora.parameters()) if lora is not None else own

    def _fake_output(self, input: torch.Tensor) -> torch.Tensor:
        """What forward returns, as an empty tensor (the operator's fake kernel). Row
        and the embedding override it; this is the column layers' (and the LM head's)."""
        if getattr(self._impl.options, "sequence_parallel", False):
            raise NotImplementedError(
                f"{type(self).__name__}(sequence_parallel=True) under torch.compile / export: the gathered token "
                "count depends on the other ranks' pieces (exchanged at run time); run it eagerly, or gather the "
                "tokens with tp.gather_from_sequence_parallel(x, sizes=...) into a layer without sequence_parallel"
            )
        return input.new_empty((*input.shape[:-1], self._op_output_features()))

    def load_weights(self, checkpoint: CheckpointLike, prefix: str) -> None:
        """Loads this rank's slice of the checkpoint tensors named ``prefix`` + ...

        ``checkpoint`` is a tp.Checkpoint, a tp.LoadSession (its reads are recorded) or a
        dict of Hugging Face names to full (global) tensors, e.g.
        ``load_weights(hf_state_dict, "model.layers.0.mlp.down_proj")``. Strict: a tensor
        under ``prefix`` the layer would not read is a ValueError naming it and the fix.
        Collective: an error on any rank raises on every rank, naming the rank.
        """
        if isinstance(checkpoint, LoadSession):
            checkpoint = checkpoint.checkpoint
        if not isinstance(checkpoint, _C.Checkpoint):
            checkpoint = _C.Checkpoint(dict(checkpoint))
        self._impl.load_weights(checkpoint, prefix)

    def gather_weights(self, prefix: str) -> Dict[str, torch.Tensor]:
        """The whole (unsharded) tensors under the names ``load_weights(ckpt, prefix)`` reads,
        on every rank (it all-gathers: every rank must call it). Unquantized layers only."""
        return self._impl.gather_weights(prefix)

    def reset_parameters(self) -> None:
        """Fresh random weights, drawn with the GLOBAL fan-in."""
        self._impl.reset_parameters()

    @property
    def options(self):
        """The C++ options (global sizes, dtype and device at construction)."""
        return self._impl.options

    def _apply(self, fn, recurse=True):
        # nn.Module._apply may replace a Parameter with a new object (e.g. across
        # devices); the C++ module would keep the old one. Instead swap the data of
        # the shared tensor in place, as torch::nn::Module::to does in C++.
        if recurse:
            for module in self.children():
                module._apply(fn)
        _apply_in_place(self, fn)
        return self

    def extra_repr(self) -> str:
        text = repr(self._impl)  # "tp::Name(k=v, ...)", the C++ pretty_print
        return text[text.index("(") + 1 : text.rindex(")")]

    def __getstate__(self):
        raise TypeError(
            f"{type(self).__name__} holds a C++ module and a process group and cannot be pickled; "
            "save its state_dict() instead"
        )


class _SplitLinear(_ParallelLinear):
    """Column and Row: one weight [out_features, in_features] split along one dimension
    (the output rows for Column, the input columns for Row)."""

    in_features = property(lambda self: self._impl.options.in_features)
    out_features = property(lambda self: self._impl.options.out_features)

    def local_range(self) -> Tuple[int, int]:
        """This rank's (begin, end) of the split dimension: its rows of the output
        (Column), or its columns of the weight, i.e. its slice of the input (Row)."""
        return tuple(self._impl.local_range())

    def ranges(self):
        """Every rank's (begin, end) of the split dimension, in rank order."""
        return [tuple(r) for r in self._impl.ranges()]


def _sequence_share(tokens: int, world: int, rank: int) -> int:
    """This rank's token count under tp.sequence_ranges (the first tokens % world ranks
    get one more); symbolic sizes allowed."""
    return tokens // world + (1 if rank < tokens % world else 0)


def _column_output(layer, gathered_features: int, local_features: int) -> int:
    return gathered_features if layer._impl.options.gather_output else local_features


class _QuantizedInput:
    """The column layers' input handed over quantized: the fused boundary's codes
    (``Communicator.all_reduce_fusion(..., quant_out=...)``) instead of the activations."""

    def input_quant(self, input: torch.Tensor) -> "_C.TokenQuant":
        """The per-token quantization this layer's GEMM applies to an input like ``input``
        (int8_w8a8's, fp8_channel's on the CPU under the default numerics), which
        ``forward_quantized`` takes done already; ``TokenQuant.none`` when there is none."""
        return self._impl.input_quant(input)

    def forward_quantized(self, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """``forward`` of the input whose ``input_quant`` quantization is ``codes`` [..., in]
        and ``scales`` [..., 1] float32: the same output bit for bit, without the
        quantization pass. No backward (call it under ``torch.no_grad()``)."""
        return self._impl.forward_quantized(codes, scales)


class _FusedColumn(_QuantizedInput, _ParallelLinear):
    """QKV and GateUp: one column GEMM whose output holds several pieces."""

    def _op_setup(self) -> None:
        # The pieces' (offset, size) along the output's last dim, read once from the C++
        # split (on a meta tensor): split() is then narrow()s that the compiler traces.
        parts = self._impl.split(torch.empty(1, self._op_output_features(), device="meta"))
        self._split_pieces = tuple((p.storage_offset(), p.shape[-1]) for p in parts)

    def split(self, output: torch.Tensor):
        """The pieces of a forward output, as views."""
        return tuple(output.narrow(-1, offset, size) for offset, size in self._split_pieces)


class ColumnParallelLinear(_QuantizedInput, _SplitLinear):
    """y = x W^T + b with W's rows (output features) split over ranks.

    Input [..., in_features] (the same on every rank); output [..., local out] (this
    rank's slice, see ``local_range()``), or [..., out_features] with gather_output.
    Parameters: weight [local out, in_features], bias [local out].

    Differentiable at every TP size: the input gradient is summed over ranks.
    sequence_parallel: the input is this rank's piece of the tokens along
    ``sequence_dim`` (any counts; exchanged), all-gathered before the GEMM; the backward
    reduce-scatters the input gradient. The column layers (QKV and GateUp too) take it.
    """

    _impl_type = _C.ColumnParallelLinear
    _options_type = _C.ColumnParallelLinearOptions
    _op_name = "column_parallel_linear"

    def _op_output_features(self) -> int:
        begin, end = self._impl.local_range()
        return _column_output(self, self.out_features, end - begin)

    @_layer_keywords(_GATHER_KEYWORDS, _COMMON_KEYWORDS)
    def __init__(self, in_features: int, out_features: int, bias: bool = True, **keywords):
        super().__init__(
            _C.ColumnParallelLinear, _C.ColumnParallelLinearOptions(in_features, out_features), bias=bias, **keywords
        )


class RowParallelLinear(_SplitLinear):
    """y = x W^T + b with W's columns (input features) split over ranks.

    Input: this rank's slice [..., local in] (input_is_parallel, the output of a
    ColumnParallelLinear) or the whole [..., in_features]. Output [..., out_features],
    summed over ranks unless reduce_output=False (then a partial sum; rank 0 adds the
    bias, so it still sums to the right answer). Parameters: weight [out_features,
    local in], bias [out_features] (every rank's copy gets the full gradient).

    sequence_parallel: the partial sums are reduce-scattered along ``sequence_dim``
    instead of all-reduced: this rank gets its tokens, ``tp.sequence_ranges(tokens,
    world)[rank]``; the backward all-gathers the output gradient.
    """

    _impl_type = _C.RowParallelLinear
    _options_type = _C.RowParallelLinearOptions
    _op_name = "row_parallel_linear"

    def _fake_output(self, input: torch.Tensor) -> torch.Tensor:
        shape = [*input.shape[:-1], self.out_features]
        if self._impl.options.sequence_parallel:  # reduce-scattered: this rank's tokens
            dim = self._impl.options.sequence_dim % len(shape)
            shape[dim] = _sequence_share(shape[dim], self.world_size, self.rank)
        return input.new_empty(shape)

    @_layer_keywords(_SEQUENCE_KEYWORDS, _COMMON_KEYWORDS)
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        input_is_parallel: bool = True,
        reduce_output: bool = True,
        all_reduce: Union[str, "_C.AllReduceStrategy"] = "auto",
        wire: Union[str, "_C.WirePrecision"] = "default",
        **keywords,
    ):
        super().__init__(
            _C.RowParallelLinear, _C.RowParallelLinearOptions(in_features, out_features), bias=bias,
            input_is_parallel=input_is_parallel, reduce_output=reduce_output,
            all_reduce=all_reduce_strategy(all_reduce), wire=wire_precision(wire), **keywords,
        )


class QKVParallelLinear(_FusedColumn):
    """The fused [Q | K | V] projection, split over ranks by whole heads.

    With GQA a rank owns whole KV heads and the query heads that read them; with
    more ranks than KV heads each KV head is replicated. Output [..., (local_q_heads
    + 2 * local_kv_heads) * head_dim], or all heads with gather_output; ``split(y)``
    gives (q, k, v).
    """

    _impl_type = _C.QKVParallelLinear
    _options_type = _C.QKVParallelLinearOptions
    _op_name = "qkv_parallel_linear"

    def _op_output_features(self) -> int:
        o = self._impl.options
        return _column_output(self, (o.num_heads + 2 * o.num_kv_heads) * o.head_dim,
                              (self.local_q_heads + 2 * self.local_kv_heads) * o.head_dim)

    @_layer_keywords(_GATHER_KEYWORDS, _COMMON_KEYWORDS)
    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: Optional[int] = None,
        bias: bool = False,
        **keywords,
    ):
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        super().__init__(
            _C.QKVParallelLinear, _C.QKVParallelLinearOptions(hidden_size, head_dim, num_heads, num_kv_heads),
            bias=bias, **keywords,
        )

    def split(self, output: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) views of a forward output, each [..., heads * head_dim]."""
        return super().split(output)

    head_plan = property(lambda self: self._impl.head_plan, doc="Which heads this rank owns.")
    local_q_heads = property(lambda self: self._impl.local_q_heads)
    local_kv_heads = property(lambda self: self._impl.local_kv_heads)

    def attention_output_split(self) -> "_C.SplitPolicy":
        """The split for the O projection (RowParallelLinear(num_heads * head_dim, hidden,
        split=...)) that gives it exactly this rank's query heads."""
        return self._impl.attention_output_split()


class GateUpParallelLinear(_FusedColumn):
    """The fused [gate | up] projection of a gated MLP, column-parallel.

    Output [..., 2 * local intermediate] ([gate_local | up_local]); ``split(y)`` gives
    (gate, up), so SiLU(gate) * up needs no communication.
    """

    _impl_type = _C.GateUpParallelLinear
    _options_type = _C.GateUpParallelLinearOptions
    _op_name = "gate_up_parallel_linear"

    def _op_output_features(self) -> int:
        begin, end = self._impl.local_range()
        return _column_output(self, 2 * self._impl.options.intermediate_size, 2 * (end - begin))

    @_layer_keywords(_GATHER_KEYWORDS, _COMMON_KEYWORDS)
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, **keywords):
        super().__init__(
            _C.GateUpParallelLinear, _C.GateUpParallelLinearOptions(hidden_size, intermediate_size), bias=bias,
            **keywords,
        )

    def split(self, output: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(gate, up) views of a forward output."""
        return super().split(output)

    def local_range(self) -> Tuple[int, int]:
        """This rank's slice of the intermediate dimension (the down projection's input)."""
        return tuple(self._impl.local_range())


_FUSED = (QKVParallelLinear, GateUpParallelLinear)
_PLAIN = (_SplitLinear,)


def gather_weights(module: nn.Module, prefix: str = "") -> Dict[str, torch.Tensor]:
    """Every tensor of ``module`` and its descendants, whole (unsharded), by name, on every rank.

    Names are module paths after ``prefix``, as ``named_parameters`` gives them, except
    that the tp layers gather their shards (every rank must call this: it all-gathers)
    and write what their ``load_weights`` reads: Column/Row at path P give P.weight and
    P.bias; QKV at P gives parent(P).q_proj / k_proj / v_proj (replicated KV heads once),
    GateUp at P parent(P).gate_proj / up_proj, as vLLM names fused layers
    (``...self_attn.qkv_proj`` writes ``...self_attn.q_proj.weight``); the vocabulary
    layers at P give P.weight without padding rows (a tied head: nothing), and a
    ``tp.CausalLM`` its own Hugging Face names (``model.gather_weights()``). A module tree
    shaped like the Hugging Face model therefore gives its names, and
    ``tp.save_safetensors(path, gather_weights(model))`` on rank 0 writes a checkpoint
    that loads at any TP size. Other modules contribute their parameters and persistent
    buffers, copied. Quantized layers raise (their weights are frozen).
    """
    out: Dict[str, torch.Tensor] = {}

    def join(path, name):
        return f"{path}.{name}" if path else name

    def merge(tensors):
        for name, t in tensors.items():
            if name in out:
                raise ValueError(f"gather_weights: two tensors are named {name!r}")
            out[name] = t

    def visit(m, path, parent):
        if isinstance(m, _PLAIN) or getattr(m, "_tp_gathers_at_path", False):
            return merge(m.gather_weights(path))
        if getattr(m, "_tp_gathers_hf_names", False):  # tp.CausalLM: its own Hugging Face names
            return merge(m.gather_weights())
        if isinstance(m, _FUSED):
            return merge(m.gather_weights(parent))
        own = {}
        for name, p in m._parameters.items():
            if p is not None:
                own[join(path, name)] = p.detach().clone()
        for name, b in m._buffers.items():
            if b is not None and name not in m._non_persistent_buffers_set:
                own[join(path, name)] = b.detach().clone()
        merge(own)
        for name, child in m._modules.items():
            if child is not None:
                visit(child, join(path, name), path)

    visit(module, prefix, prefix)
    return out
