"""tp.CausalLM: a whole Llama / Qwen2 / Qwen3 decoder built from a Hugging Face folder
(config.json through tp.ModelConfig, the safetensors loaded strictly, each rank reading
only its shards), as a torch.nn.Module whose parameters are the C++ model's tensors.

    model = tp.CausalLM.from_pretrained("/models/Qwen3-0.6B", dtype=torch.bfloat16)
    tokens = model.generate(prompt_ids, max_new_tokens=16)      # greedy, with a KV cache
    logits = model.gather_logits(model(prompt_ids))             # [batch, seq, vocab]
"""

from typing import Dict, Optional

import torch
import torch.distributed as dist
from torch import nn

from . import _C
from .distributed import communicator as make_communicator

__all__ = ["CausalLM"]


class CausalLM(nn.Module):
    """The C++ tp::CausalLM. ``forward(ids)`` gives this rank's local logits
    [batch, seq, local vocab rows] (padding columns -inf); ``gather_logits`` all of them;
    ``cross_entropy`` and ``generate`` work on the local slices."""

    def __init__(self, impl: "_C.CausalLM"):
        super().__init__()
        self._impl = impl
        seen = {}
        for name, tensor in impl.named_parameters():
            if type(tensor) is not nn.Parameter:
                tensor.__class__ = nn.Parameter  # the C++ tensor itself (same TensorImpl)
            seen[name] = tensor
        # The C++ paths ("layers.0.qkv.weight") on placeholder child modules that mirror
        # the C++ tree, so that named_parameters() gives the same names.
        for name, tensor in seen.items():
            *path, leaf = name.split(".")
            module = self
            for part in path:
                if part not in module._modules:
                    module.add_module(part, nn.Module())
                module = module._modules[part]
            module.register_parameter(leaf, tensor)

    @classmethod
    def from_pretrained(cls, folder: str, *, dtype: Optional[torch.dtype] = None, pad_vocab_to_multiple_of: int = 1,
                        num_layers: int = 0, group: Optional["dist.ProcessGroup"] = None,
                        communicator: Optional["_C.Communicator"] = None) -> "CausalLM":
        """The model of ``folder`` in ``dtype`` (None: the checkpoint's), tensor-parallel over
        ``group`` (default: the default process group, or one rank without one).
        ``num_layers`` > 0 keeps only the first layers (their tensors alone are read).
        Collective: every rank calls it."""
        if communicator is not None and group is not None:
            raise ValueError("pass either group= or communicator=, not both")
        comm = communicator if communicator is not None else make_communicator(group)
        return cls(_C.CausalLM.from_pretrained(folder, comm, dtype, pad_vocab_to_multiple_of, num_layers))

    def forward(self, ids: torch.Tensor, cache: Optional["_C.KVCache"] = None, logits_to_keep: int = 0):
        """ids int64 [batch, seq] (the same on every rank) -> local logits. With a cache the
        tokens continue the cached sequence (and advance it)."""
        return self._impl.forward(ids, cache, logits_to_keep)

    def gather_logits(self, local_logits: torch.Tensor) -> torch.Tensor:
        """[..., vocab_size] on every rank (an all-gather; padding left out)."""
        return self._impl.gather_logits(local_logits)

    def cross_entropy(self, local_logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100):
        """Per-token loss from the local logits (vocab-parallel; never gathers them)."""
        return self._impl.cross_entropy(local_logits, target, ignore_index)

    _tp_gathers_hf_names = True  # tp.gather_weights(model) gives gather_weights()'s names

    def gather_weights(self) -> Dict[str, torch.Tensor]:
        """Every tensor the model loads, whole, under its Hugging Face name, on every rank
        (the shards all-gathered: every rank calls it): rank 0 can save them next to
        config.json as a folder that loads at any TP size."""
        return self._impl.gather_weights()

    def make_cache(self, batch: int, capacity: int) -> "_C.KVCache":
        return self._impl.make_cache(batch, capacity)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding with a KV cache: int64 [batch, max_new_tokens], the same on every rank."""
        return self._impl.generate_greedy(prompt, max_new_tokens)

    def extra_repr(self) -> str:
        text = repr(self._impl)
        return text[text.index("(") + 1 : text.rindex(")")]
