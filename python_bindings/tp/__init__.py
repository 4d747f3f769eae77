"""tp: Megatron-style tensor-parallel linear layers, as torch.nn.Modules.

The layers are the C++ library's own modules (``tp._C``); each rank holds and
computes only its shard, and partial sums meet in an AllReduce over a
torch.distributed process group (gloo on CPU, nccl on GPUs)::

    import torch, torch.distributed as dist, tp
    dist.init_process_group("gloo")                    # torchrun's variables
    up = tp.ColumnParallelLinear(4096, 11008, bias=False)            # default group
    down = tp.RowParallelLinear(11008, 4096, bias=False)
    y = down(torch.relu(up(x)))                        # [..., 4096] on every rank

Errors from C++ arrive as ValueError (bad arguments), TypeError (wrong dtype),
IndexError, or RuntimeError (e.g. a collective that timed out), with the C++ message.

A Hugging Face folder describes its layers itself (config.json)::

    cfg = tp.ModelConfig.from_pretrained("/models/Qwen3-8B")     # sizes, biases, RoPE, quant
    ckpt = tp.open_checkpoint("/models/Qwen3-8B")
    opts = cfg.decoder_layer_options(0)                           # layer 0's four projections
    qkv = tp.QKVParallelLinear.from_options(opts.qkv)
    qkv.load_weights(ckpt, opts.qkv_prefix)

Training: the layers are differentiable at every TP size (their collectives are
autograd functions, also available as ``tp.copy_to_parallel`` etc.), and
``tp.gather_weights(model)`` gathers what was trained into full tensors under Hugging
Face names for ``tp.save_safetensors``.
"""

import torch  # noqa: F401  (loads libtorch and torch's pybind11 casters before _C)

from . import _C
from ._C import (
    AllReduceFusionNorm,
    AllReduceFusionQuant,
    AllReduceFusionResult,
    AllReduceStrategy,
    BlockScaleName,
    Checkpoint,
    CheckpointQuantization,
    CommunicatorOptions,
    DecoderLayerOptions,
    GptqFormat,
    HeadPlan,
    ModelConfig,
    ModelFamily,
    ModelType,
    MoECheckpointLayout,
    MoERouterOptions,
    MoEScoring,
    Numerics,
    QuantConfig,
    QuantFormat,
    Range,
    RopeParameters,
    RopeType,
    SplitPolicy,
    TokenQuant,
    WirePrecision,
    model_families,
    open_checkpoint,
    save_safetensors,
    save_sharded_safetensors,
    split,
)
from .collectives import (
    copy_to_parallel,
    gather_from_parallel,
    gather_from_sequence_parallel,
    reduce_from_parallel,
    reduce_scatter_to_sequence_parallel,
    scatter_to_parallel,
    scatter_to_sequence_parallel,
    sequence_ranges,
    sequence_sizes,
)
from .distributed import Communicator, communicator
from .loading import LoadSession
from .layers import (
    ColumnParallelLinear,
    GateUpParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    gather_weights,
)
from .moe import MoEParallelMLP
from .causal_lm import CausalLM
from .dcp import ShardedParameter, dcp_state_dict
from .vocab import ParallelLMHead, VocabParallelEmbedding, vocab_parallel_argmax, vocab_parallel_cross_entropy
from ._C import VocabPartition, partition_vocab

__all__ = [
    "AllReduceFusionNorm",
    "AllReduceFusionQuant",
    "AllReduceFusionResult",
    "AllReduceStrategy",
    "BlockScaleName",
    "CausalLM",
    "Checkpoint",
    "CheckpointQuantization",
    "ColumnParallelLinear",
    "Communicator",
    "CommunicatorOptions",
    "DecoderLayerOptions",
    "GateUpParallelLinear",
    "GptqFormat",
    "HeadPlan",
    "LoadSession",
    "ModelConfig",
    "ModelFamily",
    "ModelType",
    "MoECheckpointLayout",
    "MoEParallelMLP",
    "MoERouterOptions",
    "MoEScoring",
    "Numerics",
    "ParallelLMHead",
    "QKVParallelLinear",
    "QuantConfig",
    "QuantFormat",
    "Range",
    "RopeParameters",
    "RopeType",
    "RowParallelLinear",
    "ShardedParameter",
    "SplitPolicy",
    "TokenQuant",
    "VocabParallelEmbedding",
    "VocabPartition",
    "WirePrecision",
    "communicator",
    "copy_to_parallel",
    "dcp_state_dict",
    "gather_from_parallel",
    "gather_from_sequence_parallel",
    "gather_weights",
    "model_families",
    "open_checkpoint",
    "partition_vocab",
    "reduce_from_parallel",
    "reduce_scatter_to_sequence_parallel",
    "save_safetensors",
    "save_sharded_safetensors",
    "scatter_to_parallel",
    "scatter_to_sequence_parallel",
    "sequence_ranges",
    "sequence_sizes",
    "split",
    "vocab_parallel_argmax",
    "vocab_parallel_cross_entropy",
]
