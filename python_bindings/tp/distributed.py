"""Communicators from torch.distributed process groups.

A process group crosses into C++ by name (``group.group_name``, resolved there with
``c10d::resolve_process_group``), so no pybind11 object of torch's crosses modules.
"""

from typing import Optional, Union

import torch.distributed as dist

from . import _C

Communicator = _C.Communicator

__all__ = ["Communicator", "communicator"]


def communicator(
    group: Optional["dist.ProcessGroup"] = None,
    *,
    timeout_s: Optional[float] = None,
    all_reduce: Union[str, "_C.AllReduceStrategy"] = "auto",
    verify_calls: Optional[bool] = None,
    wire: Union[str, "_C.WirePrecision"] = "native",
    all_reduce_table: Optional[str] = None,
) -> "_C.Communicator":
    """A tp.Communicator over ``group``.

    ``group=None`` means torch.distributed's default group when one is initialized,
    else a world-size-1 communicator whose collectives are no-ops (TP = 1 without
    any torch.distributed setup).

    timeout_s: a collective not complete by then raises RuntimeError (default
    TP_COMM_TIMEOUT_MS or 300 s). all_reduce: the default AllReduce strategy.
    verify_calls: ranks check that they agree on every collective (default on).
    wire: 'native' or 'bf16' (float32 all_reduce data travels as bfloat16; TP_ALLREDUCE_WIRE
    overrides). all_reduce_table: a tuning table written by ``tp-allreduce-bench --tune``
    (default TP_ALLREDUCE_TABLE, else the built-in one).
    """
    options = _C.CommunicatorOptions(
        timeout_s=timeout_s, all_reduce=all_reduce_strategy(all_reduce), verify_calls=verify_calls,
        wire=wire_precision(wire), all_reduce_table=all_reduce_table,
    )
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return _C.Communicator()
        group = dist.group.WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"tp.communicator: this rank ({dist.get_rank()}) is not a member of the given process group"
        )
    name = getattr(group, "group_name", None)
    if not isinstance(name, str):
        raise TypeError(
            f"tp.communicator: expected a torch.distributed ProcessGroup, got {type(group).__name__}"
        )
    return _C.Communicator.from_group_name(name, options)


def all_reduce_strategy(value: Union[str, "_C.AllReduceStrategy"]) -> "_C.AllReduceStrategy":
    """``value`` as an AllReduceStrategy; a name ('auto', 'process_group', 'shm_one_shot', 'shm_two_shot',
    'recursive_doubling') is parsed."""
    if isinstance(value, _C.AllReduceStrategy):
        return value
    if isinstance(value, str):
        return _C.parse_all_reduce_strategy(value)
    raise TypeError(f"expected an AllReduceStrategy or its name, got {type(value).__name__}")


def wire_precision(value: Union[str, "_C.WirePrecision"]) -> "_C.WirePrecision":
    """``value`` as a WirePrecision; a name ('default', 'native', 'bf16') is parsed."""
    if isinstance(value, _C.WirePrecision):
        return value
    if isinstance(value, str):
        return _C.parse_wire_precision(value)
    raise TypeError(f"expected a WirePrecision or its name, got {type(value).__name__}")
