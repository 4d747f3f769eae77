"""tp.CausalLM: a whole Llama / Qwen2 / Qwen3 decoder built from a Hugging Face folder
(config.json through tp.ModelConfig, the safetensors loaded strictly, each rank reading
only its shards), as a torch.nn.Module whose parameters are the C++ model's tensors.

    model = tp.CausalLM.from_pretrained("/models/Qwen3-0.6B", dtype=torch.bfloat16)
    tokens = model.generate(prompt_ids, max_new_tokens=16)      # greedy, with a KV cache
    logits = model.gather_logits(model(prompt_ids))             # [batch, seq, vocab]

Its children are the tp modules over the C++ model's own children (``embed_tokens``,
``layers[i]`` with ``input_layernorm``, ``qkv``, ``o_proj``, ``post_attention_layernorm``,
``gate_up``, ``down_proj`` and Qwen3's ``q_norm`` / ``k_norm``, ``norm``, ``lm_head``), and
``forward`` (without a cache) composes them through the ``torch.ops.tp`` operators: print,
named_modules, forward hooks and torch.compile see the structure, and the result is the
C++ model's, bit for bit. With a KV cache (``generate``) the C++ model runs whole.
"""

from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import _C, ops
from .distributed import communicator as make_communicator
from .layers import GateUpParallelLinear, QKVParallelLinear, RowParallelLinear
from .vocab import ParallelLMHead, VocabParallelEmbedding

__all__ = ["CausalLM", "DecoderLayer", "RMSNorm"]


class RMSNorm(nn.Module):
    """A model's RMSNorm (the C++ tp::RMSNorm; its weight mirrored on every rank)."""

    _op_name = "rms_norm"

    def __init__(self, impl: "_C.RMSNorm"):
        super().__init__()
        self._impl = impl
        weight = impl.weight
        if type(weight) is not nn.Parameter:
            weight.__class__ = nn.Parameter  # the C++ tensor itself
        self.weight = weight
        ops.handle(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.tp.rms_norm(self._op_handle, input, [self.weight])
        return self._impl.forward(input)

    def _fake_output(self, input: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(input)

    def extra_repr(self) -> str:
        text = repr(self._impl).splitlines()[0]  # the C++ summary line; the children print below
        return text[text.index("(") + 1 : text.rindex(")")] if "(" in text and ")" in text else ""


class DecoderLayer(nn.Module):
    """One decoder block of a tp.CausalLM, composed of its children:

        q, k, v = qkv.split(qkv(input_layernorm(x)))
        h = x + o_proj(attention(q, k, v))        # q/k norms (Qwen3), RoPE, causal GQA
        out = h + down_proj(silu(gate) * up)     # gate, up = gate_up.split(gate_up(post_attention_layernorm(h)))

    ``attention`` is the operator torch.ops.tp.decoder_attention (the C++ layer's own)."""

    def __init__(self, impl: "_C.DecoderLayer"):
        super().__init__()
        self._impl = impl
        # In the C++ module's registration order, so parameters() lists what it does.
        self.input_layernorm = RMSNorm(impl.input_layernorm)
        self.post_attention_layernorm = RMSNorm(impl.post_attention_layernorm)
        if impl.qk_norm:
            self.q_norm = RMSNorm(impl.q_norm)
            self.k_norm = RMSNorm(impl.k_norm)
        self.qkv = QKVParallelLinear._from_impl(impl.qkv)
        self.o_proj = RowParallelLinear._from_impl(impl.o_proj)
        self.gate_up = GateUpParallelLinear._from_impl(impl.gate_up)
        self.down_proj = RowParallelLinear._from_impl(impl.down_proj)
        ops.handle(self)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [batch, seq, hidden] (mirrored); cos, sin [batch, seq, head_dim]."""
        q, k, v = self.qkv.split(self.qkv(self.input_layernorm(x)))
        if torch.compiler.is_compiling():
            a = torch.ops.tp.decoder_attention(self._op_handle, q, k, v, cos, sin, self._attention_params())
        else:
            a = self._impl.attention(q, k, v, cos, sin)
        h = x + self.o_proj(a)
        gate, up = self.gate_up.split(self.gate_up(self.post_attention_layernorm(h)))
        return h + self.down_proj(F.silu(gate) * up)

    def _attention_params(self):
        return [self.q_norm.weight, self.k_norm.weight] if self._impl.qk_norm else []

    def _fake_output(self, q: torch.Tensor) -> torch.Tensor:
        # [batch, seq, local q heads * head_dim]: q's own shape.
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    def extra_repr(self) -> str:
        return f"index={self._impl.index}"


class CausalLM(nn.Module):
    """The C++ tp::CausalLM. ``forward(ids)`` gives this rank's local logits
    [batch, seq, local vocab rows] (padding columns -inf); ``gather_logits`` all of them;
    ``cross_entropy`` and ``generate`` work on the local slices."""

    def __init__(self, impl: "_C.CausalLM"):
        super().__init__()
        self._impl = impl
        self.embed_tokens = VocabParallelEmbedding._from_impl(impl.embed_tokens)
        self.layers = nn.ModuleList(DecoderLayer(layer) for layer in impl.layers)
        self.norm = RMSNorm(impl.norm)
        head = impl.lm_head
        self.lm_head = (ParallelLMHead._tied_over(head, self.embed_tokens) if head.tied
                        else ParallelLMHead._from_impl(head))
        ops.handle(self)
        mine = [(name, id(p)) for name, p in self.named_parameters()]
        cpp = [(name, id(t)) for name, t in impl.named_parameters()]
        if mine != cpp:  # the children must hold exactly the C++ model's tensors, by the same names
            raise RuntimeError(f"tp.CausalLM: the modules' parameters {[n for n, _ in mine]} are not the C++ "
                               f"model's {[n for n, _ in cpp]}")

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
        tokens continue the cached sequence (and advance it): the C++ model runs whole.
        Without one the children run in turn (traceable by torch.compile / export)."""
        if cache is not None:
            return self._impl.forward(ids, cache, logits_to_keep)
        if ids.dim() != 2:
            raise ValueError(f"CausalLM: ids must be [batch, seq]; got {list(ids.shape)}")
        b, s = ids.shape
        positions = torch.arange(s, device=ids.device).unsqueeze(0).expand(b, s)
        if torch.compiler.is_compiling():
            cos, sin = torch.ops.tp.rotary_cos_sin(self._op_handle, positions).unbind(0)
        else:
            cos, sin = self._impl.rotary_cos_sin(positions)
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h, cos, sin)
        if 0 < logits_to_keep < s:
            h = h.narrow(1, s - logits_to_keep, logits_to_keep)
        return self.lm_head(self.norm(h))

    def _fake_output(self, positions: torch.Tensor) -> torch.Tensor:
        """rotary_cos_sin's output: [2, batch, seq, head_dim] in the model's dtype."""
        return positions.new_empty((2, *positions.shape, self._impl.head_dim), dtype=self._impl.dtype)

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
        text = repr(self._impl).splitlines()[0]  # the C++ summary line; the children print below
        return text[text.index("(") + 1 : text.rindex(")")] if "(" in text and ")" in text else ""
