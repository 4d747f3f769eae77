"""tp.MoEParallelMLP: a mixture-of-experts MLP (the C++ tp::MoEParallelMLP) as a
torch.nn.Module, built from GLOBAL sizes like the linear layers::

    moe = tp.MoEParallelMLP(2048, 768, num_experts=128, top_k=8,          # Qwen3-30B-A3B's block
                            router=dict(normalize_top_k=True), expert_parallel_size=2)
    moe.load_weights(hf_state_dict, "model.layers.0.mlp")                  # this rank's experts' slices
    y = moe(x)                                                              # [..., 2048] on every rank

The router is mirrored (every rank routes every token alike); the world is
``expert_parallel_size`` groups of consecutive ranks, the experts split over the groups and
each expert's intermediate dimension over its group's ranks; every rank's output is a
partial sum and the block ends in one all-reduce. Its parameters are the C++ module's own
tensors, by the same names: ``router_weight`` (``router_bias``; the
``score_correction_bias`` buffer), the experts this rank holds as ``experts.<e>.gate_up.*``
/ ``experts.<e>.down.*`` (global expert ids), ``shared_expert.*`` and
``shared_expert_gate_weight`` where the block has them.
"""

from typing import Dict, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from . import _C, ops
from .distributed import communicator as make_communicator
from .layers import CheckpointLike, QuantLike, _apply_in_place, _OnCommunicator, _quant_config
from .loading import LoadSession

__all__ = ["MoEParallelMLP"]

RouterLike = Union[None, "_C.MoERouterOptions", Mapping[str, object]]
LayoutLike = Union[None, "_C.MoECheckpointLayout", Mapping[str, object]]


def _as_parameter(tensor: torch.Tensor) -> nn.Parameter:
    if type(tensor) is not nn.Parameter:
        tensor.__class__ = nn.Parameter  # the C++ tensor itself
    return tensor


def _filled(what: str, options, fields: Mapping[str, object], enums: Mapping[str, type]):
    """``options`` with ``fields`` set on it by name; a string for an enum field is its value's name."""
    for name, value in fields.items():
        if not hasattr(options, name):
            known = ", ".join(n for n in dir(options) if not n.startswith("_"))
            raise TypeError(f"tp.MoEParallelMLP: {what} has no field {name!r}; its fields are {known}")
        if name in enums and isinstance(value, str):
            members = enums[name].__members__
            if value not in members:
                raise ValueError(f"tp.MoEParallelMLP: {what}.{name}={value!r}; expected one of {', '.join(members)}")
            value = members[value]
        setattr(options, name, value)
    return options


def _router_options(router: RouterLike) -> "_C.MoERouterOptions":
    if router is None:
        return _C.MoERouterOptions()
    if isinstance(router, _C.MoERouterOptions):
        return router
    if isinstance(router, Mapping):
        return _filled("router", _C.MoERouterOptions(), router, {"scoring": _C.MoEScoring})
    raise TypeError(f"tp.MoEParallelMLP: router: expected None, a tp.MoERouterOptions or a dict of its fields, "
                    f"got {type(router).__name__}")


def _layout(layout: LayoutLike) -> "_C.MoECheckpointLayout":
    if layout is None:
        return _C.MoECheckpointLayout()
    if isinstance(layout, _C.MoECheckpointLayout):
        return layout
    if isinstance(layout, Mapping):
        return _filled("layout", _C.MoECheckpointLayout(), layout, {"experts": _C.ExpertLayout})
    raise TypeError(f"tp.MoEParallelMLP: layout: expected None, a tp.MoECheckpointLayout or a dict of its fields, "
                    f"got {type(layout).__name__}")


def _owner(module: nn.Module, name: str) -> nn.Module:
    """The module that holds the tensor ``name`` ("experts.3.gate_up.weight") under
    ``module``, its plain nn.Module parents made on the way (as the C++ children are)."""
    for part in name.split(".")[:-1]:
        child = module._modules.get(part)
        if child is None:
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module


class MoEParallelMLP(_OnCommunicator, nn.Module):
    """A mixture-of-experts MLP, experts split by expert tensor and expert parallelism.

    y = sum over a token's top_k experts e of weight_e * down_e(act(gate_e(x)) * up_e(x))
    [+ sigmoid(x W_gate^T)] * shared(x). Input [..., hidden_size] (the same on every rank);
    output [..., hidden_size], the same on every rank (all-reduced).

    ``router``: a tp.MoERouterOptions or a dict of its fields (``scoring`` "softmax",
    "softmax_of_top_k" or "sigmoid", ``normalize_top_k``, ``weights_in_input_dtype``,
    ``logits_in_float32``, ``bias``, ``score_correction_bias``, ``num_groups``,
    ``top_k_groups``, ``scaling_factor``). ``expert_parallel_size``: how many groups of
    consecutive ranks the experts are distributed over (1: every rank holds a slice of
    every expert; 0: one group per rank); it divides the world size. ``quant``: the
    experts' format, as the linear layers take it. ``expert_bias``: biases on every expert's
    projections (GPT-OSS); ``activation`` "silu", "gelu", "gelu_tanh" or "swiglu_oai"
    (``swiglu_alpha``, ``swiglu_limit``). ``shared_expert_intermediate_size`` > 0: a shared
    expert every token goes through, split over every rank, its output scaled by
    sigmoid(x W_gate^T) with ``shared_expert_gate`` (Qwen-MoE), in ``shared_expert_quant``.

    Differentiable at every split: gradients reach the input, the router, the shared gate
    and every unquantized expert weight. Construction and load_weights are collective.
    """

    _op_name = "moe_parallel_mlp"
    _tp_gathers_at_path = True  # tp.gather_weights: its experts whole, under the per-expert names

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        *,
        router: RouterLike = None,
        expert_parallel_size: int = 1,
        quant: QuantLike = None,
        expert_bias: bool = False,
        activation: str = "silu",
        swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
        shared_expert_intermediate_size: int = 0,
        shared_expert_gate: bool = False,
        shared_expert_quant: QuantLike = None,
        dtype: Optional[torch.dtype] = None,
        device=None,
        group: Optional["dist.ProcessGroup"] = None,
        communicator: Optional["_C.Communicator"] = None,
    ):
        super().__init__()
        if communicator is not None and group is not None:
            raise ValueError("tp.MoEParallelMLP: pass either group= or communicator=, not both")
        options = _C.MoEParallelMLPOptions(hidden_size, intermediate_size, num_experts, top_k)
        options.router = _router_options(router)
        options.expert_parallel_size = int(expert_parallel_size)
        options.quant = _quant_config(quant)
        options.expert_bias = expert_bias
        options.activation = activation
        options.swiglu_alpha = swiglu_alpha
        options.swiglu_limit = swiglu_limit
        options.shared_expert_intermediate_size = shared_expert_intermediate_size
        options.shared_expert_gate = shared_expert_gate
        options.shared_expert_quant = _quant_config(shared_expert_quant)
        options.dtype = torch.get_default_dtype() if dtype is None else dtype
        options.device = torch.device("cpu" if device is None else device)
        comm = communicator if communicator is not None else make_communicator(group)
        self._adopt(_C.MoEParallelMLP(options, comm))

    @classmethod
    def _from_impl(cls, impl: "_C.MoEParallelMLP") -> "MoEParallelMLP":
        """The module over an existing C++ block (a tp.CausalLM's child)."""
        moe = cls.__new__(cls)
        nn.Module.__init__(moe)
        moe._adopt(impl)
        return moe

    def _adopt(self, impl: "_C.MoEParallelMLP") -> None:
        """Takes the C++ module ``impl``: its tensors become this module's parameters and
        buffers, in child modules named as the C++ children are."""
        self._impl = impl
        for name, tensor in impl.named_parameters():
            _owner(self, name).register_parameter(name.rsplit(".", 1)[-1], _as_parameter(tensor))
        for name, tensor in impl.named_buffers():
            _owner(self, name).register_buffer(name.rsplit(".", 1)[-1], tensor)
        ops.handle(self)

    def _mirror_lora(self) -> None:
        """The C++ block's LoRA adapters mirrored again, after adapters came or went: its child
        ``lora`` (the routed experts', ``lora.<adapter>.gate_up_A`` ...) and the shared
        expert's (``shared_expert.gate_up.lora.<adapter>.gate.lora_A`` ...)."""
        for module in list(self.modules()):
            module._modules.pop("lora", None)
        for name, tensor in self._impl.named_parameters():
            if name.startswith("lora.") or ".lora." in name:
                _owner(self, name).register_parameter(name.rsplit(".", 1)[-1], _as_parameter(tensor))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The C++ forward (GIL released, the all-reduce included); under torch.compile the
        operator torch.ops.tp.moe_parallel_mlp."""
        if torch.compiler.is_compiling():
            return torch.ops.tp.moe_parallel_mlp(self._op_handle, input, list(self.parameters()))
        return self._impl.forward(input)

    def route(self, input: torch.Tensor):
        """(weights [tokens, top_k], expert ids [tokens, top_k]) for tokens [tokens, hidden]."""
        return self._impl.route(input)

    def load_weights(self, checkpoint: CheckpointLike, prefix: str, layout: LayoutLike = None) -> None:
        """Loads the router (whole), this rank's experts' slices and the shared expert's slice
        from the tensors named ``prefix`` + ... in ``layout`` (a tp.MoECheckpointLayout or a
        dict of its fields; default: transformers' per-expert names,
        ``<prefix>.gate.weight``, ``<prefix>.experts.<e>.gate_proj.weight``, ...,
        ``<prefix>.shared_expert.*``, ``<prefix>.shared_expert_gate.weight``).

        ``checkpoint``: a tp.Checkpoint, a tp.LoadSession or a dict of names to full
        (global) tensors. Strict and collective: every tensor under ``prefix`` must be read
        by some rank, and an error on any rank raises on every rank."""
        if isinstance(checkpoint, LoadSession):
            checkpoint = checkpoint.checkpoint
        if not isinstance(checkpoint, _C.Checkpoint):
            checkpoint = _C.Checkpoint(dict(checkpoint))
        self._impl.load_weights(checkpoint, prefix, _layout(layout))

    def gather_weights(self, prefix: str, layout: LayoutLike = None) -> Dict[str, torch.Tensor]:
        """Every tensor whole (the router, every expert, the shared expert) under the names
        load_weights reads below ``prefix`` in ``layout``, on every rank (it all-gathers:
        every rank calls it). Unquantized experts only."""
        return self._impl.gather_weights(prefix, _layout(layout))

    def reset_parameters(self) -> None:
        """Fresh random weights, drawn with the GLOBAL fan-in."""
        self._impl.reset_parameters()

    @property
    def options(self) -> "_C.MoEParallelMLPOptions":
        """The C++ options (global sizes, router, dtype and device at construction)."""
        return self._impl.options

    @property
    def local_experts(self):
        """(begin, end): the experts this rank holds."""
        return self._impl.local_experts

    @property
    def local_range(self):
        """(begin, end): this rank's slice of each of its experts' intermediate dimension."""
        return self._impl.local_range

    @property
    def expert_parallel_size(self) -> int:
        """The resolved number of expert groups (the options' 0 is the world size)."""
        return self._impl.expert_parallel_size

    def _fake_output(self, input: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(input)

    def _apply(self, fn, recurse=True):
        # Every tensor is the C++ module's (the experts' in plain child modules): swapped in
        # place, never replaced, so the C++ forward reads what .to() / .half() made.
        for module in self.modules():
            _apply_in_place(module, fn)
        return self

    def extra_repr(self) -> str:
        text = repr(self._impl).splitlines()[0]
        return text[text.index("(") + 1 : text.rindex(")")] if "(" in text and ")" in text else ""

    def __getstate__(self):
        raise TypeError(
            "MoEParallelMLP holds a C++ module and a process group and cannot be pickled; save its state_dict() instead"
        )
