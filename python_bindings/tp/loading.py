"""Strict loading of a module tree from one checkpoint.

A LoadSession records every tensor read through it (by the layers' load_weights and
by the caller's own ``session.checkpoint[name]``); ``finish()`` then raises, on every
rank, if any checkpoint tensor was read by nothing::

    ckpt = tp.open_checkpoint("/models/Qwen2-7B")
    with tp.LoadSession(ckpt) as session:              # torch.distributed's default group
        qkv.load_weights(session, "model.layers.0.self_attn")
        o.load_weights(session, "model.layers.0.self_attn.o_proj")
        norm = session.checkpoint["model.norm.weight"]
    # leaving the block without an exception calls finish()
"""

from typing import Iterable, Mapping, Optional, Union

import torch
import torch.distributed as dist

from . import _C
from .distributed import communicator as make_communicator

__all__ = ["LoadSession"]

CheckpointLike = Union["_C.Checkpoint", Mapping[str, torch.Tensor]]


class LoadSession:
    """One rank's load of a module tree from ``checkpoint``.

    allow_unread: glob patterns ('*' any run of characters, dots included; '?' one
    character) of tensors that may stay unread; None keeps the default,
    ``["*rotary_emb.inv_freq"]``. group / communicator: the ranks that agree in
    ``finish()`` (default: torch.distributed's default group when initialized, else
    this process alone).
    """

    def __init__(self, checkpoint: CheckpointLike, *, allow_unread: Optional[Iterable[str]] = None,
                 group: Optional["dist.ProcessGroup"] = None, communicator: Optional["_C.Communicator"] = None):
        if communicator is not None and group is not None:
            raise ValueError("pass either group= or communicator=, not both")
        if not isinstance(checkpoint, _C.Checkpoint):
            checkpoint = _C.Checkpoint(dict(checkpoint))
        comm = communicator if communicator is not None else make_communicator(group)
        allow = None if allow_unread is None else [str(p) for p in allow_unread]
        self._impl = _C.LoadSession(checkpoint, comm, allow)

    @property
    def checkpoint(self) -> "_C.Checkpoint":
        """The checkpoint to load from: the same tensors, every read recorded here."""
        return self._impl.checkpoint

    def read(self) -> list:
        """Names read so far, sorted."""
        return self._impl.read()

    def unread(self) -> list:
        """Names nothing has read and no allow_unread pattern matches, sorted."""
        return self._impl.unread()

    def expect_filled(self, module: "torch.nn.Module") -> None:
        """Watches every parameter and buffer of ``module``: ``finish()`` then fails naming each
        one no load has written since this call (a module built with ``init_weights=False`` is
        never used unfilled). Call it after building the module and before loading it::

            layer = tp.ColumnParallelLinear(4096, 11008, init_weights=False)
            with tp.LoadSession(checkpoint) as session:
                session.expect_filled(layer)
                layer.load_weights(session.checkpoint, "model.layers.0.mlp.up_proj")
        """
        named = list(module.named_parameters()) + list(module.named_buffers())
        self._impl.expect_filled([(name, t) for name, t in named])

    def unfilled(self) -> list:
        """Names of the watched tensors no load has written yet, in the module's order."""
        return self._impl.unfilled()

    def finish(self) -> None:
        """Raises ValueError on every rank if any rank has unread tensors or unfilled watched
        ones (a collective)."""
        self._impl.finish()

    def __enter__(self) -> "LoadSession":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
