"""tp.CausalLM: a whole decoder (Llama, Qwen2, Qwen3, Mistral, Phi-3, GPT-NeoX, Gemma 2,
Gemma 3 text) built from a Hugging Face folder
(config.json through tp.ModelConfig, the safetensors loaded strictly, each rank reading
only its shards), as a torch.nn.Module whose parameters are the C++ model's tensors.

    model = tp.CausalLM.from_pretrained("/models/Qwen3-0.6B", dtype=torch.bfloat16)
    tokens = model.generate(prompt_ids, max_new_tokens=16)      # greedy, with a KV cache
    logits = model.gather_logits(model(prompt_ids))             # [batch, seq, vocab]

Its children are the tp modules over the C++ model's own children (``embed_tokens``,
``layers[i]`` with ``input_layernorm``, ``post_attention_layernorm``, Gemma's
``pre_feedforward_layernorm`` / ``post_feedforward_layernorm``, the ``q_norm`` / ``k_norm``
of Qwen3 and Gemma 3, ``qkv``, ``o_proj``, ``gate_up`` (or GPT-NeoX's ``up_proj``),
``down_proj``; ``norm``, ``lm_head``), and
``forward`` (without a cache) composes them through the ``torch.ops.tp`` operators: print,
named_modules, forward hooks and torch.compile see the structure, and the result is the
C++ model's, bit for bit. With a KV cache (``generate``) the C++ model runs whole.
"""

import math
from typing import Dict, Optional, Sequence, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import _C, ops
from .collectives import reduce_from_parallel
from .distributed import all_reduce_strategy, communicator as make_communicator, wire_precision
from .layers import ColumnParallelLinear, GateUpParallelLinear, QKVParallelLinear, RowParallelLinear
from .moe import MoEParallelMLP
from .vocab import ParallelLMHead, VocabParallelEmbedding

__all__ = ["CausalLM", "DecoderLayer", "Norm"]


def _as_parameter(tensor: torch.Tensor) -> nn.Parameter:
    if type(tensor) is not nn.Parameter:
        tensor.__class__ = nn.Parameter  # the C++ tensor itself
    return tensor


class Norm(nn.Module):
    """A model's norm (the C++ tp::Norm: RMSNorm, Gemma's (1 + w) RMSNorm or LayerNorm;
    its weight and bias mirrored on every rank)."""

    _op_name = "norm"

    def __init__(self, impl: "_C.Norm"):
        super().__init__()
        self._impl = impl
        self.weight = _as_parameter(impl.weight)
        self._has_bias = impl.bias is not None  # a constant for torch.compile
        if self._has_bias:
            self.bias = _as_parameter(impl.bias)
        ops.handle(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.tp.norm(self._op_handle, input, self._op_params())
        return self._impl.forward(input)

    def _op_params(self):
        return [self.weight, self.bias] if self._has_bias else [self.weight]

    def _fake_output(self, input: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(input)

    def extra_repr(self) -> str:
        text = repr(self._impl).splitlines()[0]  # the C++ summary line; the children print below
        return text[text.index("(") + 1 : text.rindex(")")] if "(" in text and ")" in text else ""


_ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    # transformers' NewGELUActivation and FastGELUActivation, as the C++ layer computes them
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0)))),
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
}


class DecoderLayer(nn.Module):
    """One decoder block of a tp.CausalLM, composed of its children as the C++ layer is:

        q, k, v = qkv.split(qkv(input_layernorm(x)))
        a = o_proj(attention(q, k, v))            # q/k norms, RoPE, causal GQA, window, soft cap
        out = x + a + mlp(post_attention_layernorm(x))       # parallel residual: one all-reduce
        h = x + post_attention_layernorm(a);  out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))   # Gemma
        h = x + a;  out = h + mlp(post_attention_layernorm(h))                                                         # the rest
        mlp(y) = down_proj(act(gate) * up), gate, up = gate_up.split(gate_up(y));  or down_proj(act(up_proj(y)))

    ``attention`` is the operator torch.ops.tp.decoder_attention (the C++ layer's own)."""

    def __init__(self, impl: "_C.DecoderLayer"):
        super().__init__()
        self._impl = impl
        # In the C++ module's registration order, so parameters() lists what it does.
        self.input_layernorm = Norm(impl.input_layernorm)
        self.post_attention_layernorm = Norm(impl.post_attention_layernorm)
        if impl.sandwich_norms:
            self.pre_feedforward_layernorm = Norm(impl.pre_feedforward_layernorm)
            self.post_feedforward_layernorm = Norm(impl.post_feedforward_layernorm)
        if impl.qk_norm:
            self.q_norm = Norm(impl.q_norm)
            self.k_norm = Norm(impl.k_norm)
        self._sinks = impl.attention_sinks  # a constant for torch.compile
        if self._sinks:
            self.sinks = _as_parameter(impl.sinks)  # this rank's query heads' (GPT-OSS)
        self.qkv = QKVParallelLinear._from_impl(impl.qkv)
        self.o_proj = RowParallelLinear._from_impl(impl.o_proj)
        moe = impl.moe
        self._moe = moe is not None
        if self._moe:
            self.moe = MoEParallelMLP._from_impl(moe)
        elif impl.gated_mlp:
            self.gate_up = GateUpParallelLinear._from_impl(impl.gate_up)
        else:
            self.up_proj = ColumnParallelLinear._from_impl(impl.up_proj)
        if not self._moe:
            self.down_proj = RowParallelLinear._from_impl(impl.down_proj)
        # The block's form as plain attributes: torch.compile reads them as constants (a
        # pybind11 property inside forward would break the graph).
        self._act = _ACTIVATIONS[impl.hidden_act]
        self._gated = impl.gated_mlp
        self._sandwich = impl.sandwich_norms
        self._qk_norm = impl.qk_norm
        self._communicator = impl.communicator if impl.parallel_residual else None
        if self._communicator is not None:  # the op handle and codes, constants for torch.compile
            self._comm_handle = ops.comm_handle(self._communicator)
            self._reduce_codes = (int(all_reduce_strategy("auto")), int(wire_precision("default")))
        ops.handle(self)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [batch, seq, hidden] (mirrored); cos, sin [batch, seq, rotary_dim]."""
        q, k, v = self.qkv.split(self.qkv(self.input_layernorm(x)))
        if torch.compiler.is_compiling():
            a = torch.ops.tp.decoder_attention(self._op_handle, q, k, v, cos, sin, self._attention_params())
        else:
            a = self._impl.attention(q, k, v, cos, sin)
        a = self.o_proj(a)
        if self._communicator is not None:  # O and down hand on partial sums: one all-reduce for both
            partial = a + self.mlp(self.post_attention_layernorm(x))
            if torch.compiler.is_compiling():
                return x + torch.ops.tp.reduce_from_parallel(self._comm_handle, partial, *self._reduce_codes)
            return x + reduce_from_parallel(partial, communicator=self._communicator)
        if self._sandwich:
            h = x + self.post_attention_layernorm(a)
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """down(act(gate) * up), down(act(up)) for an ungated MLP (GPT-NeoX), or the
        mixture of experts."""
        if self._moe:
            return self.moe(x)
        if not self._gated:
            return self.down_proj(self._act(self.up_proj(x)))
        gate, up = self.gate_up.split(self.gate_up(x))
        return self.down_proj(self._act(gate) * up)

    def _attention_params(self):
        params = [self.q_norm.weight, self.k_norm.weight] if self._qk_norm else []
        return params + [self.sinks] if self._sinks else params

    @property
    def q_heads(self):
        """(begin, end): the query heads this rank holds (its sinks' global offset)."""
        return self._impl.q_heads

    def _fake_output(self, q: torch.Tensor) -> torch.Tensor:
        # [batch, seq, local q heads * head_dim]: q's own shape.
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    def extra_repr(self) -> str:
        return f"index={self._impl.index}"


class _LoRA(nn.Module):
    """A layer's adapters (the C++ tp::LoRA): ``<adapter>.<segment>.lora_A`` / ``lora_B``,
    the C++ tensors themselves, under the C++ names."""

    def __init__(self, impl: "_C.LoRA"):
        super().__init__()
        self._impl = impl
        for name in impl.names():
            adapter = nn.Module()
            for segment in impl.segment_names():
                a = impl.lora_A(name, segment)
                if a is None:
                    continue
                factors = nn.Module()
                factors.lora_A = _as_parameter(a)
                factors.lora_B = _as_parameter(impl.lora_B(name, segment))
                adapter.add_module(segment, factors)
            self.add_module(name, adapter)

    def extra_repr(self) -> str:
        text = repr(self._impl)
        return text[text.index("(") + 1 : text.rindex(")")]


class CausalLM(nn.Module):
    """The C++ tp::CausalLM. ``forward(ids)`` gives this rank's local logits
    [batch, seq, local vocab rows] (padding columns -inf); ``gather_logits`` all of them;
    ``cross_entropy`` and ``generate`` work on the local slices."""

    def __init__(self, impl: "_C.CausalLM"):
        super().__init__()
        self._impl = impl
        self.embed_tokens = VocabParallelEmbedding._from_impl(impl.embed_tokens)
        self.layers = nn.ModuleList(DecoderLayer(layer) for layer in impl.layers)
        self.norm = Norm(impl.norm)
        # What forward reads of the C++ model, as constants for torch.compile.
        self._embedding_scale = impl.embedding_scale
        self._rotary_table_of = [impl.rotary_table_of(i) for i in range(len(impl.layers))]
        self._final_cap = impl.final_logit_softcapping
        self._attention_dp = impl.attention_data_parallel_size
        self._has_adapters = bool(impl.adapter_names)  # a constant for torch.compile
        self._local_vocab = impl.local_vocab
        head = impl.lm_head
        self.lm_head = (ParallelLMHead._tied_over(head, self.embed_tokens) if head.tied
                        else ParallelLMHead._from_impl(head))
        ops.handle(self)
        if self._has_adapters:  # a C++ model that holds adapters already
            self._mirror_adapters()
        self._check_parameters()

    def _check_parameters(self) -> None:
        mine = [(name, id(p)) for name, p in self.named_parameters()]
        cpp = [(name, id(t)) for name, t in self._impl.named_parameters()]
        if mine != cpp:  # the children must hold exactly the C++ model's tensors, by the same names
            raise RuntimeError(f"tp.CausalLM: the modules' parameters {[n for n, _ in mine]} are not the C++ "
                               f"model's {[n for n, _ in cpp]}")

    @classmethod
    def from_pretrained(cls, folder: str, *, dtype: Optional[torch.dtype] = None, pad_vocab_to_multiple_of: int = 1,
                        num_layers: int = 0, expert_parallel: Union[bool, int] = False, numerics: str = "auto",
                        split_weights: Optional[Sequence[float]] = None, attention_data_parallel: int = 1,
                        group: Optional["dist.ProcessGroup"] = None,
                        communicator: Optional["_C.Communicator"] = None,
                        adapters: Optional[Dict[str, str]] = None) -> "CausalLM":
        """The model of ``folder`` in ``dtype`` (None: the checkpoint's), tensor-parallel over
        ``group`` (default: the default process group, or one rank without one).
        ``num_layers`` > 0 keeps only the first layers (their tensors alone are read).
        ``expert_parallel``: how a mixture of experts' experts are split. False (1): each
        split over every rank (expert tensor parallelism); True: distributed over the ranks,
        each whole on one (expert parallelism: each rank reads only its experts); an integer
        n dividing the world size: n groups of ranks, each splitting its share of experts.
        ``numerics``: "invariant" sums every reduction in one canonical order, so logits,
        losses and gradients have the bits of TP 1 at every TP size and a prompt's logits
        the same bits alone or in any batch (docs/numerics.md); "default" the
        fastest order; "auto" reads TP_NUMERICS. ``split_weights``: one weight per rank for
        unequal devices (e.g. [3, 1]): every layer's heads, rows, experts and vocabulary cut
        within one alignment unit of them, the leftovers rotating over the layers
        (``split_plan()`` shows the result; a weight no layer can honour is refused naming
        weights that work). ``attention_data_parallel`` D > 1: D groups of world / D
        consecutive ranks, each with its own batch (the ids each rank passes are its group's:
        any prompt count, zero included, and length), attention, KV cache, embedding and LM
        head; the MLP and experts over every rank (docs/models.md; training calls
        ``reduce_data_parallel_grads()`` after the backward). ``adapters``: {name: PEFT adapter
        folder}, each loaded as ``load_adapter`` loads it, the first selected for every row.
        Collective: every rank calls it."""
        if communicator is not None and group is not None:
            raise ValueError("pass either group= or communicator=, not both")
        comm = communicator if communicator is not None else make_communicator(group)
        ep = (0 if expert_parallel else 1) if isinstance(expert_parallel, bool) else int(expert_parallel)
        model = cls(_C.CausalLM.from_pretrained(folder, comm, dtype, pad_vocab_to_multiple_of, num_layers, ep,
                                                numerics, list(split_weights or []), attention_data_parallel))
        for name, adapter_folder in (adapters or {}).items():
            model.load_adapter(adapter_folder, name)
        return model

    @property
    def attention_data_parallel_size(self) -> int:
        return self._impl.attention_data_parallel_size

    @property
    def attention_group(self) -> int:
        """This rank's attention group (0 without attention data parallelism)."""
        return self._impl.attention_group

    def reduce_data_parallel_grads(self) -> None:
        """Attention data parallelism, after a backward: the parameters outside the MLPs and
        experts (one copy per group) get the sum of the groups' gradients, as a single device
        computing every group's loss would. Collective; a no-op without it."""
        self._impl.reduce_data_parallel_grads()

    def split_plan(self) -> "_C.SplitPlan":
        """What every rank holds: heads, MLP rows, experts and vocabulary rows per layer, and
        the bytes of each rank's parameters (measured; collective: every rank calls it).
        ``print(model.split_plan())`` shows the table."""
        return self._impl.split_plan()

    # LoRA adapters (tp/models/adapters.h): PEFT's folders, each layer's adapter cut by its own plan.

    def load_adapter(self, folder: str, adapter_name: str = "default") -> None:
        """Adapter ``adapter_name`` from PEFT's ``folder`` (adapter_config.json and
        adapter_model.safetensors), each rank reading its slices, strictly (a tensor nothing
        reads, a target tp cannot adapt, a wrong shape: ValueError on every rank). The first
        adapter is active for every row. Collective."""
        self._impl.load_adapter(str(folder), adapter_name)
        self._mirror_adapters()

    def add_adapter(self, adapter_name: str, *, r: int = 8, lora_alpha: float = 8.0,
                    target_modules: Union[str, Sequence[str]] = ("q_proj", "v_proj"), use_rslora: bool = False,
                    target_parameters: Sequence[str] = ()) -> None:
        """A fresh adapter (PEFT's LoraConfig fields; A random and the same on every rank, B
        zeros) on the modules ``target_modules`` names (a list of name suffixes, a regular
        expression, or "all-linear") and a mixture of experts' stacked tensors
        ``target_parameters`` names ("experts.gate_up_proj", "experts.down_proj"), for
        training. Collective."""
        targets, regex = ([], target_modules) if isinstance(target_modules, str) else (list(target_modules), "")
        self._impl.add_adapter(adapter_name, r, lora_alpha, use_rslora, targets, regex, list(target_parameters))
        self._mirror_adapters()

    @property
    def adapters(self):
        """The adapters' names."""
        return list(self._impl.adapter_names)

    def set_adapter(self, adapter_name: Union[None, str, Sequence[Optional[str]]]) -> None:
        """Every row takes ``adapter_name`` (None: the base model alone); a list: row i takes
        adapter_name[i] (what ``adapter_names=`` does for one call, and how a compiled model
        is told, since a graph cannot change the selection)."""
        selection = self._impl.adapter_selection
        if adapter_name is None or isinstance(adapter_name, str):
            selection.select(adapter_name or "")
        else:
            selection.select_rows([name or "" for name in adapter_name])

    def adapter_parameters(self, adapter_name: Optional[str] = None):
        """(name, parameter) of every adapter's A and B (or of ``adapter_name``'s): what an
        optimizer trains while the base stays frozen."""
        return [(n, p) for n, p in self.named_parameters()
                if ".lora." in n and (adapter_name is None or f".lora.{adapter_name}." in n)]

    def gather_adapter(self, adapter_name: str) -> Dict[str, torch.Tensor]:
        """The adapter's whole tensors under PEFT's names, on every rank (collective)."""
        return self._impl.gather_adapter(adapter_name)

    def save_adapter(self, folder: str, adapter_name: str) -> None:
        """The adapter as a PEFT folder (written by rank 0) that loads at any TP size, into tp
        or into PEFT's PeftModel. Collective."""
        self._impl.save_adapter(str(folder), adapter_name)

    def merge_adapter(self, adapter_name: str) -> None:
        """Merges the adapter into the (unquantized) base weights, each rank its slices, and
        selects it for every row: the base computes it at the base's cost (PEFT's
        merge_adapter). ``unmerge_adapter`` takes it back out."""
        self._impl.merge_adapter(adapter_name)

    def unmerge_adapter(self, adapter_name: str) -> None:
        self._impl.unmerge_adapter(adapter_name)

    def _mirror_adapters(self) -> None:
        """Each layer's adapters as its child ``lora`` (the C++ tensors as Parameters)."""
        self.embed_tokens.lora = _LoRA(self.embed_tokens._impl.lora)
        for layer in self.layers:
            for attr in ("qkv", "o_proj", "gate_up", "up_proj", "down_proj"):
                module = getattr(layer, attr, None)
                if module is not None:
                    module.lora = _LoRA(module._impl.lora)
            if layer._moe:
                layer.moe._mirror_lora()
        self.lm_head.lora = _LoRA(self.lm_head._impl.lora)
        self._has_adapters = True
        self._check_parameters()

    def _with_adapters(self, adapter_names, run):
        """run() with each row taking adapter_names[i] ("" or None: none), then the selection as before."""
        if adapter_names is None:
            return run()
        selection = self._impl.adapter_selection
        whole, per_row = selection.whole, selection.per_row
        selection.select_rows([name or "" for name in adapter_names])
        try:
            return run()
        finally:
            selection.select_rows(per_row) if per_row else selection.select(whole)

    def forward(self, ids: torch.Tensor, cache: Optional["_C.KVCache"] = None, logits_to_keep: int = 0, *,
                adapter_names: Optional[Sequence[Optional[str]]] = None):
        """ids int64 [batch, seq] (the same on every rank) -> local logits. With a cache the
        tokens continue the cached sequence (and advance it): the C++ model runs whole.
        Without one the children run in turn (traceable by torch.compile / export).
        ``adapter_names``: row i takes adapter adapter_names[i] (None: the base alone) for
        this call; otherwise the selection set_adapter made. With adapters the C++ model runs
        whole eagerly; under torch.compile the children run, each layer's operator taking its
        adapters as parameters and reading the selection when it runs (so one graph serves
        every selection; set it with set_adapter before the call)."""
        if self._has_adapters and not torch.compiler.is_compiling():
            return self._with_adapters(adapter_names, lambda: self._impl.forward(ids, cache, logits_to_keep))
        if self._has_adapters and (adapter_names is not None or cache is not None):
            raise NotImplementedError("tp.CausalLM under torch.compile: choose the adapters with set_adapter before "
                                      "the call (adapter_names would change the selection inside the graph), and "
                                      "run a cache eagerly")
        if adapter_names is not None and any(adapter_names):
            raise ValueError(f"tp.CausalLM: adapter_names {list(adapter_names)} but the model holds no adapter")
        if cache is not None:
            return self._impl.forward(ids, cache, logits_to_keep)
        if self._attention_dp > 1:
            # The MLP's collectives span the groups (tp/models/attention_dp.h): the C++ model
            # runs whole (differentiable), not the children in turn.
            if torch.compiler.is_compiling():
                raise NotImplementedError("tp.CausalLM: torch.compile does not trace attention data parallelism; "
                                          "run it eagerly")
            return self._impl.forward(ids, None, logits_to_keep)
        if ids.dim() != 2:
            raise ValueError(f"CausalLM: ids must be [batch, seq]; got {list(ids.shape)}")
        b, s = ids.shape
        positions = torch.arange(s, device=ids.device).unsqueeze(0).expand(b, s)
        if torch.compiler.is_compiling():
            cos0, sin0, cos1, sin1 = torch.ops.tp.rotary_cos_sin(self._op_handle, positions).unbind(0)
            tables = [(cos0, sin0), (cos1, sin1)]
        else:
            tables = self._impl.rotary_tables(positions)
        h = self.embed_tokens(ids)
        scale = self._embedding_scale
        if scale != 1.0:  # Gemma: sqrt(hidden) rounded to the model's dtype, as the C++ model does
            h = h * torch.tensor(scale, dtype=h.dtype, device=h.device)
        for i, layer in enumerate(self.layers):
            h = layer(h, *tables[self._rotary_table_of[i]])
        if 0 < logits_to_keep < s:
            h = h.narrow(1, s - logits_to_keep, logits_to_keep)
        return self._finish_logits(self.lm_head(self.norm(h)))

    def _finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma 2's final soft cap on the real vocabulary columns (the padding stays -inf)."""
        cap = self._final_cap
        if cap <= 0:
            return logits
        real = self._local_vocab
        capped = torch.tanh(logits.narrow(-1, 0, real) / cap) * cap
        if real == logits.shape[-1]:
            return capped
        return torch.cat([capped, logits.narrow(-1, real, logits.shape[-1] - real)], -1)

    def _fake_output(self, positions: torch.Tensor) -> torch.Tensor:
        """rotary_cos_sin's output: [4, batch, seq, rotary_dim] in the model's dtype."""
        return positions.new_empty((4, *positions.shape, self._impl.rotary_dim), dtype=self._impl.dtype)

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
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int = 0,
        eos_token_id: Optional[Union[int, Sequence[int]]] = None,
        pad_token_id: int = 0,
        return_lengths: bool = False,
        adapter_names: Optional[Sequence[Optional[str]]] = None,
    ):
        """Decoding with a KV cache: int64 [batch, steps] new tokens, the same on every rank.

        Greedy unless ``do_sample`` (the argmax, after ``repetition_penalty``); sampling
        applies transformers' warpers (``temperature``, ``top_k``, ``top_p``, ``min_p``, the
        names and defaults of its GenerationConfig) on each rank's slice of the vocabulary
        and draws with randomness fixed by ``seed`` per token id, so the logits are never
        gathered and the tokens are the same at every TP size where the logits are
        (``numerics="invariant"``). A row ends at its first ``eos_token_id`` (then
        ``pad_token_id``), and generation once every row has ended: ``steps`` <=
        ``max_new_tokens``. ``return_lengths``: also each row's count of tokens, its stop
        token included. ``adapter_names``: row i's adapter, as in forward."""
        stops = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        tokens, lengths = self._with_adapters(adapter_names, lambda: self._impl.generate(
            prompt,
            max_new_tokens,
            temperature if do_sample else 0.0,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            seed,
            stops,
            pad_token_id,
        ))
        return (tokens, lengths) if return_lengths else tokens

    def extra_repr(self) -> str:
        text = repr(self._impl).splitlines()[0]  # the C++ summary line; the children print below
        return text[text.index("(") + 1 : text.rindex(")")] if "(" in text and ")" in text else ""
