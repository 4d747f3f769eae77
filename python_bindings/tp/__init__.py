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
"""

import torch  # noqa: F401  (loads libtorch and torch's pybind11 casters before _C)

from . import _C
from ._C import (
    AllReduceStrategy,
    Checkpoint,
    CommunicatorOptions,
    HeadPlan,
    QuantConfig,
    QuantFormat,
    Range,
    SplitPolicy,
    WirePrecision,
    open_checkpoint,
    save_safetensors,
    split,
)
from .distributed import Communicator, communicator
from .loading import LoadSession
from .layers import (
    ColumnParallelLinear,
    GateUpParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)

__all__ = [
    "AllReduceStrategy",
    "Checkpoint",
    "ColumnParallelLinear",
    "Communicator",
    "CommunicatorOptions",
    "GateUpParallelLinear",
    "HeadPlan",
    "LoadSession",
    "QKVParallelLinear",
    "QuantConfig",
    "QuantFormat",
    "Range",
    "RowParallelLinear",
    "SplitPolicy",
    "WirePrecision",
    "communicator",
    "open_checkpoint",
    "save_safetensors",
    "split",
]
