"""Runs a function on N ranks, one process each, over torch.distributed's gloo backend.

    results = launcher.run(world, fn, *args)    # fn(rank, world, *args) on every rank

Each rank is a fresh process (start method "spawn"), joins a gloo group
(init_process_group on 127.0.0.1 and a free port), calls ``fn`` and sends back its
return value. If any rank fails, RankError carries every failing rank's traceback.

A return value travels as torch.save bytes, never as a pickled tensor: torch's
multiprocessing pickler shares a CPU tensor's storage by a file descriptor that the
parent fetches from the sending process, and a rank that has already exited is no
longer there to hand it over (FileNotFoundError in rebuild_storage_fd, seen in a fresh-clone test run).
"""

import datetime
import io
import multiprocessing
import os
import queue as queue_module
import socket
import traceback

__all__ = ["RankError", "free_port", "run"]

# Collectives of a broken run fail after this instead of hanging the suite.
COMM_TIMEOUT_S = 60


class RankError(RuntimeError):
    """One or more ranks raised; the message holds their tracebacks."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, results):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        TP_COMM_TIMEOUT_MS=str(COMM_TIMEOUT_S * 1000),
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # N ranks share the machine's cores
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=COMM_TIMEOUT_S)
        )
        try:
            value = io.BytesIO()
            torch.save(fn(rank, world, *args), value)
            results.put((rank, True, value.getvalue()))
        finally:
            if dist.is_initialized():  # fn may have destroyed it itself
                dist.destroy_process_group()
    except BaseException:  # noqa: B902 - report everything to the parent
        results.put((rank, False, traceback.format_exc()))


def run(world: int, fn, *args, timeout: float = 180.0):
    """fn(rank, world, *args) on ``world`` processes; returns the values in rank order."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, results)) for r in range(world)]
    for p in procs:
        p.start()
    values, errors = {}, {}
    try:
        for _ in range(world):
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue_module.Empty:
                missing = sorted(set(range(world)) - set(values) - set(errors))
                raise RankError(f"ranks {missing} of world_size {world} did not finish within {timeout} s")
            if ok:
                import torch

                values[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                errors[rank] = value
            if errors:
                break  # the other ranks may be blocked on the failed one
    finally:
        for p in procs:
            p.join(timeout=10 if not errors else 1)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RankError("\n".join(f"--- rank {r} of {world} ---\n{tb}" for r, tb in sorted(errors.items())))
    return [values[r] for r in range(world)]
