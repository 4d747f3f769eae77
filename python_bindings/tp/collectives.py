"""Differentiable collectives: Megatron's f / g and their sequence-parallel pair.

    function                               forward                      backward
    copy_to_parallel                       identity                     all-reduce
    reduce_from_parallel                   all-reduce                   identity
    gather_from_parallel                   all-gather along dim         this rank's piece
    scatter_to_parallel                    this rank's piece along dim  all-gather
    gather_from_sequence_parallel          all-gather along dim         reduce-scatter
    reduce_scatter_to_sequence_parallel    reduce-scatter along dim     all-gather

They are the C++ autograd functions (tp/comm/differentiable.h): ``loss.backward()``
runs their C++ backward. Under torch.compile (``fullgraph=True``) and torch.export each
is the operator ``torch.ops.tp.<name>`` (tp/ops.py), with its paired collective as the
autograd formula. Sizes may be uneven,
and a rank's piece may be empty; with world size 1 every function is the identity.
Under the compiler the gathers need ``sizes`` (exchanging them is a run-time value).

Every rank must call them in the same order, with the same shapes (up to the split
dimension) and the same ``requires_grad``, and must run the backward of each one it
called: a rank whose output does not reach its loss still has to connect it (e.g.
``loss = loss + 0 * y.sum()``), or the other ranks wait for it in a collective.

``group`` is a torch.distributed process group (None: the default group, or world
size 1 when torch.distributed is not initialized); ``communicator`` a tp.Communicator
to use instead. One Communicator is kept per process group.
"""

import weakref
from typing import List, Optional, Sequence, Union

import torch
import torch.distributed as dist

from . import _C, ops
from .distributed import all_reduce_strategy, communicator as make_communicator, wire_precision

__all__ = [
    "copy_to_parallel",
    "reduce_from_parallel",
    "gather_from_parallel",
    "scatter_to_parallel",
    "gather_from_sequence_parallel",
    "reduce_scatter_to_sequence_parallel",
    "scatter_to_sequence_parallel",
    "sequence_ranges",
    "sequence_sizes",
]

_by_group = weakref.WeakKeyDictionary()  # process group -> tp.Communicator
_single = None


def _comm(group, communicator) -> "_C.Communicator":
    global _single
    if communicator is not None:
        if group is not None:
            raise ValueError("pass either group= or communicator=, not both")
        return communicator
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            if _single is None:
                _single = _C.Communicator()
            return _single
        group = dist.group.WORLD
    comm = _by_group.get(group)
    if comm is None:
        comm = make_communicator(group)
        _by_group[group] = comm
    return comm


@torch.compiler.assume_constant_result
def _handle(group, communicator) -> int:
    """The communicator's op handle: a constant to the compiler (looked up when tracing)."""
    return ops.comm_handle(_comm(group, communicator))


@torch.compiler.assume_constant_result
def _world_rank(group, communicator):
    comm = _comm(group, communicator)
    return comm.world_size, comm.rank


@torch.compiler.assume_constant_result
def _reduce_codes(strategy, wire):
    return int(all_reduce_strategy(strategy)), int(wire_precision(wire))


def _gather_sizes(input, dim, sizes, group, communicator, what) -> List[int]:
    """``sizes``, or [] eagerly (the C++ gather exchanges them); under the compiler they
    must be given."""
    if sizes is not None:
        return [int(s) for s in sizes]
    if torch.compiler.is_compiling():
        raise ValueError(
            f"tp.{what} under torch.compile / export needs sizes= (every rank's extent along dim): "
            "exchanging them is a run-time value the graph cannot hold"
        )
    return []


def copy_to_parallel(input: torch.Tensor, group=None, *, communicator=None) -> torch.Tensor:
    """Identity forward; the backward all-reduces the gradient (Megatron's f)."""
    if torch.compiler.is_compiling():
        return torch.ops.tp.copy_to_parallel(_handle(group, communicator), input)  # a copy
    return _C.copy_to_parallel(input, _comm(group, communicator))


def reduce_from_parallel(
    input: torch.Tensor,
    group=None,
    *,
    strategy: Union[str, "_C.AllReduceStrategy"] = "auto",
    wire: Union[str, "_C.WirePrecision"] = "default",
    communicator=None,
) -> torch.Tensor:
    """All-reduce forward (a new tensor); identity backward (Megatron's g)."""
    if torch.compiler.is_compiling():
        return torch.ops.tp.reduce_from_parallel(_handle(group, communicator), input, *_reduce_codes(strategy, wire))
    return _C.reduce_from_parallel(input, _comm(group, communicator), all_reduce_strategy(strategy),
                                   wire_precision(wire))


def gather_from_parallel(
    input: torch.Tensor, dim: int = -1, sizes: Optional[Sequence[int]] = None, group=None, *, communicator=None
) -> torch.Tensor:
    """All-gather along ``dim``; ``sizes[r]`` is rank r's extent (None: exchanged, one small
    all-gather). Backward: this rank's piece of the gradient."""
    sizes = _gather_sizes(input, dim, sizes, group, communicator, "gather_from_parallel")
    return _call("gather_from_parallel", input, dim, sizes, group, communicator)


def scatter_to_parallel(
    input: torch.Tensor, dim: int = -1, sizes: Optional[Sequence[int]] = None, group=None, *, communicator=None
) -> torch.Tensor:
    """This rank's piece of a mirrored ``input`` along ``dim``: ``sizes[r]`` entries for rank r
    (None: the even split of ``sequence_sizes``). Backward: all-gathers the gradient."""
    sizes = _even_sizes(input, dim, sizes, group, communicator)
    return _call("scatter_to_parallel", input, dim, sizes, group, communicator)


def gather_from_sequence_parallel(
    input: torch.Tensor, dim: int = 0, sizes: Optional[Sequence[int]] = None, group=None, *, communicator=None
) -> torch.Tensor:
    """All-gather the token pieces along ``dim`` (None: sizes exchanged). Backward:
    reduce-scatters the gradient back to the pieces."""
    sizes = _gather_sizes(input, dim, sizes, group, communicator, "gather_from_sequence_parallel")
    return _call("gather_from_sequence_parallel", input, dim, sizes, group, communicator)


def reduce_scatter_to_sequence_parallel(
    input: torch.Tensor, dim: int = 0, sizes: Optional[Sequence[int]] = None, group=None, *, communicator=None
) -> torch.Tensor:
    """Sum over ranks, then this rank's tokens along ``dim``: ``sizes[r]`` for rank r
    (None: ``sequence_sizes``). Backward: all-gathers the gradient."""
    sizes = _even_sizes(input, dim, sizes, group, communicator)
    return _call("reduce_scatter_to_sequence_parallel", input, dim, sizes, group, communicator)


def scatter_to_sequence_parallel(input: torch.Tensor, dim: int = 0, group=None, *, communicator=None) -> torch.Tensor:
    """Enters a sequence-parallel region: this rank's tokens (``sequence_ranges``) of a
    mirrored ``input`` along ``dim``; backward all-gathers. To leave one,
    ``gather_from_parallel(x, dim)``."""
    sizes = _even_sizes(input, dim, None, group, communicator)
    return _call("scatter_to_parallel", input, dim, sizes, group, communicator)


def _call(name, input, dim, sizes, group, communicator):
    """The operator under the compiler; eagerly the C++ function with its own autograd."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.tp, name)(_handle(group, communicator), input, dim, sizes)
    return getattr(_C, name)(input, _comm(group, communicator), dim, sizes)


def _even_sizes(input, dim, sizes, group, communicator) -> List[int]:
    """``sizes``, or the even split of ``sequence_sizes`` (computed, never exchanged)."""
    if sizes is not None:
        return [int(s) for s in sizes]
    world, _ = _world_rank(group, communicator)
    tokens = input.shape[dim]
    return [tokens // world + (1 if r < tokens % world else 0) for r in range(world)]


def sequence_ranges(tokens: int, world_size: int):
    """Every rank's tokens ``(begin, end)`` of a sequence-parallel split: ``tokens //
    world_size`` each, and one more for the first ``tokens % world_size`` ranks
    (10 over 4: 3, 3, 2, 2). The same on every rank, computed without communicating."""
    return [tuple(r) for r in _C.sequence_ranges(tokens, world_size)]


def sequence_sizes(tokens: int, world_size: int) -> List[int]:
    """The sizes of ``sequence_ranges(tokens, world_size)``."""
    return list(_C.sequence_sizes(tokens, world_size))
