"""The vocabulary-parallel layers as torch.nn.Modules: the token embedding and the LM
head split over ranks along the vocabulary, and the loss and greedy decoding on the
local logits (no rank ever holds all of them).

As for the linear layers (tp.layers), each module holds the C++ module (``_impl``) and
registers its very tensors as parameters. A tied head holds no parameter of its own:
its weight IS the embedding's Parameter (one tensor, as transformers ties lm_head.weight:
an optimizer sees it once, both uses add to its gradient).
"""

from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _C
from . import ops
from .layers import CheckpointLike, _ParallelLinear, _sequence_share

__all__ = [
    "VocabParallelEmbedding",
    "ParallelLMHead",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_argmax",
]


class _VocabLayer(_ParallelLinear):
    """What the two vocabulary layers share with the linear ones: the C++ module, its
    tensors as parameters, load_weights, .to() in place."""

    def _setup(self, impl_type, options, dtype, device, group, communicator):
        options.dtype = torch.get_default_dtype() if dtype is None else dtype
        options.device = torch.device("cpu" if device is None else device)
        self._build(impl_type, options, group, communicator)

    def _adopt(self, impl) -> None:
        super()._adopt(impl)
        del self._parameters["bias"]  # no bias: _adopt registers None for the linear layers' sake

    _tp_gathers_at_path = True  # tp.gather_weights calls gather_weights(its path)

    def gather_weights(self, prefix: str) -> Dict[str, torch.Tensor]:
        """{prefix.weight: the whole [vocab, hidden] table} on every rank (an all-gather:
        every rank calls it), padding rows left out; a tied head gives nothing (the
        embedding writes the weight)."""
        return self._impl.gather_weights(prefix)

    @property
    def partition(self) -> "_C.VocabPartition":
        """Which rows of the (padded) vocabulary every rank owns."""
        return self._impl.partition

    def local_range(self) -> Tuple[int, int]:
        """This rank's rows of the padded vocabulary, (begin, end)."""
        return tuple(self._impl.local_range())

    def vocab_range(self) -> Tuple[int, int]:
        """This rank's real tokens, (begin, end) (local_range without the padding)."""
        return tuple(self._impl.vocab_range())


class VocabParallelEmbedding(_VocabLayer):
    """A token embedding table with its rows (the vocabulary) split over ranks.

    Input: integer ids [...] (the same on every rank), each in [0, num_embeddings) (an id
    outside is a ValueError on every rank). Output [..., embedding_dim] on every rank, or
    under sequence_parallel this rank's tokens of dim 0 (``tp.sequence_ranges``).
    Parameter: weight [local rows, embedding_dim] (padding rows zero, never looked up).
    The vocabulary is padded to a multiple of ``pad_to_multiple_of`` and split in whole
    units of it (uneven allowed; a rank may own none), by ``split_weights`` (one per rank)
    when given.
    """

    _impl_type = _C.VocabParallelEmbedding
    _options_type = _C.VocabParallelEmbeddingOptions

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        pad_to_multiple_of: int = 1,
        split_weights: Optional[Sequence[float]] = None,
        sequence_parallel: bool = False,
        dtype: Optional[torch.dtype] = None,
        device=None,
        group: Optional["dist.ProcessGroup"] = None,
        communicator: Optional["_C.Communicator"] = None,
    ):
        super(_ParallelLinear, self).__init__()
        options = _C.VocabParallelEmbeddingOptions(num_embeddings, embedding_dim)
        options.pad_to_multiple_of = pad_to_multiple_of
        options.split_weights = list(split_weights or [])
        options.sequence_parallel = sequence_parallel
        self._setup(_C.VocabParallelEmbedding, options, dtype, device, group, communicator)

    num_embeddings = property(lambda self: self._impl.options.num_embeddings)
    embedding_dim = property(lambda self: self._impl.options.embedding_dim)
    _op_name = "vocab_parallel_embedding"

    def _fake_output(self, ids: torch.Tensor) -> torch.Tensor:
        shape = [*ids.shape, self.embedding_dim]
        if self._impl.options.sequence_parallel:  # reduce-scattered along dim 0
            shape[0] = _sequence_share(shape[0], self.world_size, self.rank)
        return ids.new_empty(shape, dtype=self.weight.dtype)


class ParallelLMHead(_VocabLayer):
    """Vocabulary logits, column-parallel over the vocabulary (split like
    VocabParallelEmbedding, padding included).

    Input [..., hidden_size] (the same on every rank). Output: this rank's local logits
    [..., local rows], padding columns -inf (they never win an argmax and get no softmax
    weight), or all of them [..., vocab_size] with gather_output. ``cross_entropy`` and
    ``argmax`` work on the local logits.

    ``ParallelLMHead.tied(embedding)`` shares the embedding's weight.
    """

    _impl_type = _C.ParallelLMHead
    _options_type = _C.ParallelLMHeadOptions
    _op_name = "parallel_lm_head"

    def _op_output_features(self) -> int:
        if self._impl.options.gather_output:
            return self.vocab_size
        begin, end = self.local_range()
        return end - begin

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        *,
        pad_to_multiple_of: int = 1,
        split_weights: Optional[Sequence[float]] = None,
        gather_output: bool = False,
        dtype: Optional[torch.dtype] = None,
        device=None,
        group: Optional["dist.ProcessGroup"] = None,
        communicator: Optional["_C.Communicator"] = None,
    ):
        super(_ParallelLinear, self).__init__()
        options = _C.ParallelLMHeadOptions(hidden_size, vocab_size)
        options.pad_to_multiple_of = pad_to_multiple_of
        options.split_weights = list(split_weights or [])
        options.gather_output = gather_output
        self._setup(_C.ParallelLMHead, options, dtype, device, group, communicator)

    @classmethod
    def tied(cls, embedding: VocabParallelEmbedding, gather_output: bool = False) -> "ParallelLMHead":
        """A head whose weight is ``embedding.weight`` (sizes, padding, dtype, device and
        communicator are the embedding's)."""
        if not isinstance(embedding, VocabParallelEmbedding):
            raise TypeError(f"ParallelLMHead.tied: expected a tp.VocabParallelEmbedding, got {type(embedding).__name__}")
        return cls._tied_over(_C.ParallelLMHead(embedding._impl, gather_output), embedding)

    @classmethod
    def _tied_over(cls, impl: "_C.ParallelLMHead", embedding: VocabParallelEmbedding) -> "ParallelLMHead":
        """The module over a tied C++ head whose weight is ``embedding``'s."""
        head = cls.__new__(cls)
        torch.nn.Module.__init__(head)
        head._impl = impl
        # The embedding's very Parameter, as transformers ties lm_head.weight: named
        # twice in state_dict(), once in parameters() (which drops duplicates).
        head.register_parameter("weight", embedding.weight)
        ops.handle(head)
        return head

    is_tied = property(lambda self: self._impl.tied)
    hidden_size = property(lambda self: self._impl.options.hidden_size)
    vocab_size = property(lambda self: self._impl.options.vocab_size)

    def load_weights(self, checkpoint: CheckpointLike, prefix: str) -> None:
        """Loads ``prefix + '.weight'`` ([vocab_size, hidden_size]), this rank's rows. A
        tied head raises: load the embedding."""
        super().load_weights(checkpoint, prefix)

    def cross_entropy(self, local_logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100):
        """Per-row cross entropy [...] from this rank's local logits (forward's output
        without gather_output); the same on every rank. Differentiable."""
        if torch.compiler.is_compiling() and not self._impl.options.gather_output:
            return torch.ops.tp.vocab_parallel_cross_entropy(self._op_handle, local_logits, target, ignore_index)
        return self._impl.cross_entropy(local_logits, target, ignore_index)

    def argmax(self, local_logits: torch.Tensor) -> torch.Tensor:
        """The greedy token of every row over the whole vocabulary (ties: lowest id)."""
        return self._impl.argmax(local_logits)


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, target: torch.Tensor, partition: "_C.VocabPartition",
                                 communicator: "_C.Communicator", ignore_index: int = -100) -> torch.Tensor:
    """Megatron's vocab-parallel cross entropy: -log softmax(logits)[target] per row from
    this rank's columns ``partition.range(rank)`` of the padded vocabulary (padding
    columns ignored). Only the row max, sum of exponentials and target logit cross ranks.
    Returns [...] (float32; float64 for float64 logits), the same on every rank."""
    return _C.vocab_parallel_cross_entropy(local_logits, target, partition, communicator, ignore_index)


def vocab_parallel_argmax(local_logits: torch.Tensor, partition: "_C.VocabPartition",
                          communicator: "_C.Communicator") -> torch.Tensor:
    """The index of the largest logit of each row over the whole vocabulary (padding
    excluded, ties to the lowest id), int64 [...], the same on every rank."""
    return _C.vocab_parallel_argmax(local_logits, partition, communicator)
