"""Per-rank checks at TP 2 that need real processes: the state_dict round trip, the
GIL being released while a forward waits on its peers, and a collective timeout
arriving as RuntimeError. Run through launcher.py; each returns a dict of facts
the test asserts on (a failure raises, and the launcher reports the traceback).
"""

import os
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tp


class MLP(torch.nn.Module):
    """gate_up -> SiLU(gate) * up -> down, from the tp layers."""

    def __init__(self, hidden=16, inter=24):
        super().__init__()
        self.gate_up = tp.GateUpParallelLinear(hidden, inter)
        self.down = tp.RowParallelLinear(inter, hidden)

    def forward(self, x):
        gate, up = self.gate_up.split(self.gate_up(x))
        return self.down(F.silu(gate) * up)


def state_dict_round_trip(rank, world, directory):
    """Save from TP=world, load into fresh modules at TP=world, same outputs."""
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    saved = MLP()
    y_saved = saved(x)
    path = os.path.join(directory, f"mlp_tp{world}_rank{rank}.pt")
    torch.save(saved.state_dict(), path)
    torch.manual_seed(2)
    loaded = MLP()
    differed = not torch.equal(loaded(x), y_saved)
    result = loaded.load_state_dict(torch.load(path, weights_only=True))
    return {
        "keys": sorted(saved.state_dict()),
        "differed_before": differed,
        "missing": list(result.missing_keys),
        "unexpected": list(result.unexpected_keys),
        "equal_after": torch.equal(loaded(x), y_saved),
        "cpp_sees_loaded": torch.equal(loaded.down._impl.weight, saved.down.weight),
    }


def gil_released_during_forward(rank, world, delay_s):
    """Rank 1 joins the forward's AllReduce `delay_s` late; meanwhile rank 0's other
    Python thread must keep running (it could not if forward held the GIL)."""
    layer = tp.RowParallelLinear(8, 4)
    x = torch.randn(2, layer.local_range()[1] - layer.local_range()[0])
    dist.barrier()
    if rank != 0:
        time.sleep(delay_s)
        layer(x)
        return {}
    ticks = 0
    stop = threading.Event()

    def tick():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.005)

    thread = threading.Thread(target=tick)
    thread.start()
    time.sleep(0.05)  # let the thread start
    start_ticks, start = ticks, time.monotonic()
    layer(x)
    elapsed, during = time.monotonic() - start, ticks - start_ticks
    stop.set()
    thread.join()
    return {"elapsed": elapsed, "ticks_during_forward": during}


def collective_timeout(rank, world):
    """A collective that no peer joins raises RuntimeError with the C++ message."""
    group = dist.new_group(list(range(world)))
    out = {}
    if rank == 0:
        comm = tp.communicator(group, timeout_s=0.5, verify_calls=False)
        t = torch.ones(4)
        try:
            comm.all_reduce(t)
            out["error"] = None
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            out["error"] = (type(e).__name__, str(e))
    # The timed-out group is not used again (its connections are in an unknown
    # state); the default group still works.
    dist.barrier()
    return out


def layer_outlives_process_group(rank, world):
    """A layer deleted after destroy_process_group (as at interpreter exit) must not
    hang: the group's destructor joins Gloo's thread, which may need the GIL."""
    layer = tp.RowParallelLinear(8, 4)
    y = layer(torch.randn(2, layer.local_range()[1] - layer.local_range()[0]))
    dist.destroy_process_group()
    start = time.monotonic()
    del layer
    return {"seconds": time.monotonic() - start, "y": tuple(y.shape)}
