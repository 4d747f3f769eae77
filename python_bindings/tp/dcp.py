"""Sharded saving and loading through torch.distributed.checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    dcp.save(tp.dcp_state_dict(model), checkpoint_id="ckpt/")      # every rank: its shards
    dcp.load(tp.dcp_state_dict(other_model), checkpoint_id="ckpt/") # at any TP size, in place

``dcp_state_dict(module)`` describes every parameter by its GLOBAL tensor and this rank's
pieces of it, under the module's own parameter names (as ``state_dict()`` names them):
each rank writes only its pieces (a replicated piece — a mirrored norm or bias, a KV head
held by several ranks — is written once: DCP keeps one of identical pieces), and reading
fills this rank's parameters in place from whichever files hold their rows, so no rank
ever holds more than its shards plus DCP's read buffer for one saved piece.

tp's plans are not DTensor placements: shards are uneven and alignment-aware, a fused QKV
weight holds pieces of three regions of the global tensor, replicated KV heads are held by
several ranks, the vocabulary table has padding rows that are not part of the tensor. So
each entry is a ``ShardedParameter``: the hooks DCP's planners call on DTensor
(``__create_write_items__``, ``__create_chunk_list__``, ``__get_tensor_shard__``) over an
explicit list of (global offsets, local view) pieces. The global shape of a fused
parameter is the fused tensor's: ``layers.0.qkv.weight`` is [q | k | v] rows of all heads.

Quantized layers are described the same way, tensor by tensor, in tp's stored layout (not
the checkpoint format's): each tensor's output- and input-feature dimensions and how many
features one index covers (int32 words of eight codes, scale groups, FP8 blocks), as the
format table declares them (``tp._C.stored_tensors``); a piece that does not fall on whole indices, or a tensor without a declared split,
is an error naming it. A mixture of experts' expert e is ``...experts.<e>.gate_up.*`` /
``...experts.<e>.down.*``, declared by the ranks that hold it, each with its slice of the
expert's intermediate dimension: saved at one split (TP, EP, or both), loaded at another.
"""

from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from . import _C
from .causal_lm import DecoderLayer
from .layers import ColumnParallelLinear, GateUpParallelLinear, QKVParallelLinear, RowParallelLinear
from .moe import MoEParallelMLP
from .vocab import ParallelLMHead, VocabParallelEmbedding

__all__ = ["ShardedParameter", "dcp_state_dict"]

Piece = Tuple[Tuple[int, ...], torch.Tensor]  # (offsets in the global tensor, this rank's view)


class ShardedParameter(torch.Tensor):
    """This rank's pieces of one global tensor, for DCP. A tensor of the global shape
    without data (as DTensor is): only DCP's planner hooks and metadata work on it."""

    @staticmethod
    def __new__(cls, global_shape: Sequence[int], pieces: List[Piece], name: str):
        dtype = pieces[0][1].dtype if pieces else torch.float32
        device = pieces[0][1].device if pieces else torch.device("cpu")
        r = torch.Tensor._make_wrapper_subclass(cls, torch.Size(global_shape), dtype=dtype, device=device)
        r._pieces = pieces
        r._name = name
        return r

    def __init__(self, global_shape, pieces, name):
        for offsets, view in pieces:
            if len(offsets) != len(global_shape) or any(
                o < 0 or o + s > g for o, s, g in zip(offsets, view.shape, global_shape)
            ):
                raise ValueError(f"tp.dcp: {name}: piece at {offsets} of shape {tuple(view.shape)} is outside "
                                 f"the global {tuple(global_shape)}")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:
            return args[0]
        raise TypeError(f"tp.dcp.ShardedParameter describes shards for torch.distributed.checkpoint; "
                        f"{func} cannot run on it (use the module's parameters)")

    def __repr__(self):
        return f"ShardedParameter({self._name}, global {tuple(self.shape)}, {len(self._pieces)} piece(s) here)"

    # -- DCP's hooks (the _Checkpointable protocol DTensor implements) --

    def __create_write_items__(self, fqn: str, obj):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        items = []
        for offsets, view in self._pieces:
            items.append(WriteItem(
                index=MetadataIndex(fqn, torch.Size(offsets)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=view.shape),
                    properties=TensorProperties.create_from_tensor(view),
                    size=self.shape,
                ),
            ))
        return items

    def __create_chunk_list__(self):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return [ChunkStorageMetadata(offsets=torch.Size(o), sizes=v.shape) for o, v in self._pieces]

    def __get_tensor_shard__(self, index):
        for offsets, view in self._pieces:
            if torch.Size(offsets) == index.offset:
                return view
        raise ValueError(f"tp.dcp: {self._name} has no piece at {tuple(index.offset)} on this rank")


# (n_dim, n_div, k_dim, k_div) of a layer parameter: the dimension that carries the output
# features N and how many features one index of it covers (8 for codes packed eight to an
# int32, the group size for a group's scale, ...), the same for the input features K; None:
# the tensor has no such dimension (a per-row scale has no K, a per-tensor scale neither).
# A format's tensors are declared once, in its row of the format table
# (tp/quant/stored_tensors.h, tp._C.stored_tensors); the bias is the layer's own, in every format.
_BIAS_AXES = (0, 1, None, None)


def _axes(layer, name, path, quant=None):
    quant = layer._impl.options.quant if quant is None else quant
    if name == "bias":
        return _BIAS_AXES
    for stored, n_dim, n_div, k_dim, k_div in _C.stored_tensors(quant):
        if stored == name:
            return n_dim, n_div, k_dim, k_div
    fmt = str(quant.format).split(".")[-1]
    raise NotImplementedError(f"tp.dcp_state_dict: {path}{name} ({type(layer).__name__}, {fmt}) has no "
                              "declared split; it is not described for torch.distributed.checkpoint")


def _cut(what, offset, size, div):
    if offset % div or size % div:
        raise ValueError(f"tp.dcp: {what}: the piece [{offset}, {offset + size}) does not fall on whole "
                         f"indices of {div} features")
    return offset // div, size // div


def _split_along(t, dim, pieces, total, name) -> ShardedParameter:
    """t's pieces along `dim`: (local index, global index, size) each, of `total` indices."""
    if sum(size for _, _, size in pieces) != t.shape[dim]:
        raise ValueError(f"tp.dcp: {name}: pieces of {sum(p[2] for p in pieces)} along dim {dim}, the tensor "
                         f"has {t.shape[dim]}")
    shape = list(t.shape)
    shape[dim] = total
    views = []
    for local, glob, size in pieces:
        if size:
            offsets = [0] * t.dim()
            offsets[dim] = glob
            views.append((tuple(offsets), t.detach().narrow(dim, local, size)))
    return ShardedParameter(shape, views, name)


def _column_pieces(layer, path) -> Dict[str, ShardedParameter]:
    """Column, QKV and GateUp: this rank's pieces of the output features of the fused
    global [out, in] (and of every quantized tensor along its N dimension)."""
    if isinstance(layer, QKVParallelLinear):
        plan, o = layer.head_plan, layer._impl.options
        d, hq, hkv = o.head_dim, o.num_heads, o.num_kv_heads
        q, kv = plan.q_heads, plan.kv_heads
        # (global offset, size) in features of each of the local output's pieces, in split() order.
        globals_ = [(q.begin * d, (q.end - q.begin) * d), (hq * d + kv.begin * d, (kv.end - kv.begin) * d),
                    ((hq + hkv) * d + kv.begin * d, (kv.end - kv.begin) * d)]
        total = (hq + 2 * hkv) * d
    elif isinstance(layer, GateUpParallelLinear):
        begin, end = layer.local_range()
        inter = layer._impl.options.intermediate_size
        globals_ = [(begin, end - begin), (inter + begin, end - begin)]
        total = 2 * inter
    else:
        begin, end = layer.local_range()
        globals_ = [(begin, end - begin)]
        total = layer.out_features
    locals_ = [off for off, _ in layer._split_pieces] if isinstance(layer, (QKVParallelLinear, GateUpParallelLinear)) \
        else [0]
    out = {}
    for name, t in layer._parameters.items():
        if t is None:
            continue
        n_dim, n_div, _, _ = _axes(layer, name, path)
        if n_dim is None:
            out[f"{path}{name}"] = _whole(t, f"{path}{name}")
            continue
        what = f"{path}{name}"
        pieces = []
        for local, (glob, size) in zip(locals_, globals_):
            l_idx, n = _cut(what, local, size, n_div)
            g_idx, _ = _cut(what, glob, size, n_div)
            pieces.append((l_idx, g_idx, n))
        out[what] = _split_along(t, n_dim, pieces, total // n_div, what)
    return out


def _row_pieces(layer, path) -> Dict[str, ShardedParameter]:
    """Row: this rank's piece of the input features (of every tensor along its K
    dimension); tensors without one (the bias, per-row scales) are mirrored."""
    begin, end = layer.local_range()
    out = {}
    for name, t in layer._parameters.items():
        if t is None:
            continue
        _, _, k_dim, k_div = _axes(layer, name, path)
        what = f"{path}{name}"
        if k_dim is None:
            out[what] = _whole(t, what)
            continue
        g_idx, n = _cut(what, begin, end - begin, k_div)
        out[what] = _split_along(t, k_dim, [(0, g_idx, n)], -(-layer.in_features // k_div), what)
    return out


def _expert_pieces(moe, expert, path, local, inter, quant) -> Dict[str, ShardedParameter]:
    """One expert this rank holds (or the shared expert): gate_up's [gate | up] rows of the
    expert's [2 * intermediate, hidden] as GateUp's, down's columns of [hidden,
    intermediate] as a row layer's; biases (GPT-OSS) along their features."""
    begin, end = local
    out = {}
    for part in ("gate_up", "down"):
        for name, t in expert._modules[part]._parameters.items():
            what = f"{path}{part}.{name}"
            n_dim, n_div, k_dim, k_div = _axes(moe, name, f"{path}{part}.", quant)
            if part == "gate_up":
                if n_dim is None:
                    out[what] = _whole(t, what)
                    continue
                pieces = []
                for local_off, glob in ((0, begin), (end - begin, inter + begin)):
                    l_idx, n = _cut(what, local_off, end - begin, n_div)
                    g_idx, _ = _cut(what, glob, end - begin, n_div)
                    pieces.append((l_idx, g_idx, n))
                out[what] = _split_along(t, n_dim, pieces, 2 * inter // n_div, what)
            elif k_dim is None:
                out[what] = _whole(t, what)  # the down bias, per-row scales: whole on every rank of the group
            else:
                g_idx, n = _cut(what, begin, end - begin, k_div)
                out[what] = _split_along(t, k_dim, [(0, g_idx, n)], -(-inter // k_div), what)
    return out


def _lora_pieces(layer, path) -> Dict[str, ShardedParameter]:
    """A linear layer's LoRA adapters (its child ``lora``), cut as the layer is: a column
    layer's A whole and B by the segment's rows this rank holds, a row layer's A by its
    input columns and B whole. Global shapes are PEFT's: A [r, in], B [segment rows, r]."""
    lora = layer._modules.get("lora")
    if lora is None:
        return {}
    row = isinstance(layer, RowParallelLinear)
    if row:
        begin, end = layer.local_range()
    elif isinstance(layer, QKVParallelLinear):
        plan, o = layer.head_plan, layer._impl.options
        d, q, kv = o.head_dim, plan.q_heads, plan.kv_heads
        kv_piece = (kv.begin * d, (kv.end - kv.begin) * d, o.num_kv_heads * d)
        segments = {"q": (q.begin * d, (q.end - q.begin) * d, o.num_heads * d), "k": kv_piece, "v": kv_piece}
    else:
        begin, end = layer.local_range()
        total = layer._impl.options.intermediate_size if isinstance(layer, GateUpParallelLinear) else layer.out_features
        segments = {name: (begin, end - begin, total) for name in ("gate", "up", "linear")}
    out = {}
    for adapter, factors in lora.named_children():
        for segment, f in factors.named_children():
            base = f"{path}lora.{adapter}.{segment}."
            if row:
                out[base + "lora_A"] = _split_along(f.lora_A, 1, [(0, begin, end - begin)], layer.in_features,
                                                    base + "lora_A")
                out[base + "lora_B"] = _whole(f.lora_B, base + "lora_B")
            else:
                glob, size, total = segments[segment]
                out[base + "lora_A"] = _whole(f.lora_A, base + "lora_A")
                out[base + "lora_B"] = _split_along(f.lora_B, 0, [(0, glob, size)], total, base + "lora_B")
    return out


def _vocab_lora_pieces(layer, path) -> Dict[str, ShardedParameter]:
    """The embedding's or the LM head's LoRA adapters (its child ``lora``), cut with the
    vocabulary: the embedding's A [r, vocab] by this rank's real token columns (its padding
    columns are not part of the tensor) and B whole; the head's A whole and B [vocab, r] by
    this rank's real rows (a tied head's adapters are its own)."""
    lora = layer._modules.get("lora")
    if lora is None:
        return {}
    begin, end = layer.vocab_range()
    embedding = isinstance(layer, VocabParallelEmbedding)
    out = {}
    for adapter, factors in lora.named_children():
        for segment, f in factors.named_children():
            base = f"{path}lora.{adapter}.{segment}."
            if embedding:  # the real columns only (a view: a load writes into the parameter)
                offset = begin - layer.local_range()[0] if end > begin else 0
                out[base + "lora_A"] = _split_along(f.lora_A.narrow(1, offset, end - begin), 1,
                                                    [(0, begin, end - begin)], layer.num_embeddings, base + "lora_A")
                out[base + "lora_B"] = _whole(f.lora_B, base + "lora_B")
            else:
                out[base + "lora_A"] = _whole(f.lora_A, base + "lora_A")
                out[base + "lora_B"] = _split_along(f.lora_B, 0, [(0, begin, end - begin)], layer.vocab_size,
                                                    base + "lora_B")
    return out


def _moe_pieces(moe, path) -> Dict[str, ShardedParameter]:
    """A mixture of experts: the router (and the shared expert's gate) mirrored; each expert
    this rank holds under its global id (experts.<e>: only its holders declare it), in its
    rank's slice of the intermediate dimension; the shared expert's slice."""
    impl = moe._impl
    out = {}
    for name, t in moe._parameters.items():
        if t is not None:
            out[f"{path}{name}"] = _whole(t, f"{path}{name}")
    for name, b in moe._buffers.items():
        if b is not None and name not in moe._non_persistent_buffers_set:
            out[f"{path}{name}"] = _whole(b, f"{path}{name}")
    experts = moe._modules.get("experts")
    for e, expert in (experts._modules.items() if experts is not None else ()):
        out.update(_expert_pieces(moe, expert, f"{path}experts.{e}.", impl.local_range, impl.intermediate_size,
                                  impl.quant_config))
    if "shared_expert" in moe._modules:
        out.update(_expert_pieces(moe, moe.shared_expert, f"{path}shared_expert.", impl.shared_expert_range,
                                  impl.shared_expert_intermediate_size, impl.shared_expert_quant_config))
        out.update(_shared_lora_pieces(moe.shared_expert, f"{path}shared_expert.", impl.shared_expert_range,
                                       impl.shared_expert_intermediate_size))
    out.update(_expert_lora_pieces(moe, path))
    return out


def _shared_lora_pieces(expert, path, local, inter) -> Dict[str, ShardedParameter]:
    """The shared expert's LoRA adapters: gate_up's (segments gate and up) as a column
    layer's, A whole and B by this rank's rows of [intermediate, r]; down's as a row
    layer's, A by this rank's columns of [r, intermediate] and B whole."""
    begin, end = local
    out = {}
    for part in ("gate_up", "down"):
        lora = expert._modules[part]._modules.get("lora")
        for adapter, segments in (lora.named_children() if lora is not None else ()):
            for segment, f in segments.named_children():
                base = f"{path}{part}.lora.{adapter}.{segment}."
                a, b = f.lora_A.detach(), f.lora_B.detach()
                if part == "gate_up":
                    out[base + "lora_A"] = _whole(a, base + "lora_A")
                    pieces = [((begin, 0), b)] if end > begin else []
                    out[base + "lora_B"] = ShardedParameter((inter, b.shape[1]), pieces, base + "lora_B")
                else:
                    pieces = [((0, begin), a)] if end > begin else []
                    out[base + "lora_A"] = ShardedParameter((a.shape[0], inter), pieces, base + "lora_A")
                    out[base + "lora_B"] = _whole(b, base + "lora_B")
    return out


def _expert_lora_pieces(moe, path) -> Dict[str, ShardedParameter]:
    """The routed experts' LoRA adapters (the block's child ``lora``), stacked over all
    experts: gate_up_A [experts, r, hidden] and down_B [experts, hidden, r] by this rank's
    experts (mirrored in its group); gate_up_B [experts, 2 * intermediate, r] (gate rows,
    then up rows) and down_A [experts, r, intermediate] also by its slice of the rows."""
    lora = moe._modules.get("lora")
    if lora is None:
        return {}
    impl = moe._impl
    first, _ = impl.local_experts
    begin, stop = impl.local_range
    experts, inter, rows = impl.options.num_experts, impl.intermediate_size, stop - begin
    out = {}
    for adapter, factors in lora.named_children():
        base = f"{path}lora.{adapter}."
        for name, t in factors._parameters.items():
            t = t.detach()
            if name in ("gate_up_A", "down_B"):
                shape, pieces = (experts,) + tuple(t.shape[1:]), [((first, 0, 0), t)]
            elif name == "gate_up_B":
                shape = (experts, 2 * inter, t.shape[2])
                pieces = [((first, begin, 0), t.narrow(1, 0, rows)), ((first, inter + begin, 0), t.narrow(1, rows, rows))]
            else:  # down_A
                shape, pieces = (experts, t.shape[1], inter), [((first, 0, begin), t)]
            pieces = [p for p in pieces if p[1].numel() > 0]
            out[base + name] = ShardedParameter(shape, pieces, base + name)
    return out


def _vocab_pieces(layer, path) -> Dict[str, ShardedParameter]:
    """Embedding / untied head: this rank's real vocabulary rows (padding rows are not
    part of the tensor)."""
    begin, end = layer.vocab_range()
    w = layer.weight.detach()
    rows = layer.num_embeddings if isinstance(layer, VocabParallelEmbedding) else layer.vocab_size
    pieces = [((begin, 0), w.narrow(0, 0, end - begin))] if end > begin else []
    return {f"{path}weight": ShardedParameter((rows, w.shape[1]), pieces, f"{path}weight")}


def _whole(t: torch.Tensor, name: str) -> ShardedParameter:
    """A mirrored tensor: every rank holds all of it (DCP writes it once)."""
    t = t.detach()
    return ShardedParameter(t.shape, [((0,) * t.dim(), t)], name)


def dcp_state_dict(module: nn.Module) -> Dict[str, ShardedParameter]:
    """{parameter name: ShardedParameter} for ``torch.distributed.checkpoint.save`` and
    ``load`` (see the module docstring). Names are ``module.state_dict()``'s; a tied LM
    head contributes nothing (its weight is the embedding's)."""
    out: Dict[str, ShardedParameter] = {}

    def visit(m, path):
        if isinstance(m, (ColumnParallelLinear, QKVParallelLinear, GateUpParallelLinear)):
            out.update(_lora_pieces(m, path))
            return out.update(_column_pieces(m, path))
        if isinstance(m, RowParallelLinear):
            out.update(_lora_pieces(m, path))
            return out.update(_row_pieces(m, path))
        if isinstance(m, (VocabParallelEmbedding, ParallelLMHead)):
            out.update(_vocab_lora_pieces(m, path))
            if isinstance(m, ParallelLMHead) and m.is_tied:
                return None
            return out.update(_vocab_pieces(m, path))
        if isinstance(m, MoEParallelMLP):
            return out.update(_moe_pieces(m, path))
        for name, p in m._parameters.items():  # mirrored: norms and plain modules
            if p is None:
                continue
            if isinstance(m, DecoderLayer) and name == "sinks":  # GPT-OSS: per query head, this rank's heads
                begin, _ = m.q_heads
                heads = m.qkv._impl.options.num_heads
                out[f"{path}{name}"] = ShardedParameter((heads,), [((begin,), p.detach())] if p.numel() else [],
                                                        f"{path}{name}")
                continue
            out[f"{path}{name}"] = _whole(p, f"{path}{name}")
        for name, b in m._buffers.items():
            if b is not None and name not in m._non_persistent_buffers_set:
                out[f"{path}{name}"] = _whole(b, f"{path}{name}")
        for name, child in m._modules.items():
            if child is not None:
                visit(child, f"{path}{name}.")

    visit(module, "")
    return out

