#!/usr/bin/env python3
"""What torch.compile buys around tp's layers: the examples/llama_block.py decoder block,
eager vs torch.compile(fullgraph=True) (inductor), forward time per call.

    PYTHONPATH=build/python .venv/bin/python benchmarks/compile_bench.py [--tp 1 2] [--m 1 256] [--backward]

Each TP size runs that many processes over gloo (one thread each); every rank times
the same calls, rank 0 prints the median of --reps calls after --warmup (the compile
happens in the warm-up). The block is Llama-shaped but small enough for a 2-core
machine (hidden 1024, 16 heads / 4 KV heads of 64, intermediate 2816); M is the token
count (batch 1). The CPU flags are printed first: compare ratios within one run only.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "examples"))

import llama_block  # noqa: E402

CONFIG = dict(llama_block.CONFIG, hidden=1024, heads=16, kv_heads=4, head_dim=64, intermediate=2816)


def cpu_flags() -> str:
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":")[1].split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(flag for flag in wanted if flag in flags) or "none of " + " ".join(wanted)


def _median_ms(fn, x, warmup, reps, backward):
    """Median ms of fn(x) (no grad), or with `backward` of fn(x).sum().backward()."""

    def call():
        if backward:
            fn(x).sum().backward()
        else:
            with torch.no_grad():
                fn(x)

    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run_rank(rank, world, port, dtypes, ms, warmup, reps, backward, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = []
        for dtype in dtypes:
            torch.set_default_dtype(dtype)
            block = llama_block.TPDecoderBlock(CONFIG)
            torch.set_default_dtype(torch.float32)
            block.load_hf({k: v.to(dtype) for k, v in llama_block.hf_state_dict(CONFIG).items()}, "model.layers.0.")
            torch._dynamo.reset()
            compiled = torch.compile(block, fullgraph=True, dynamic=False)
            for m in ms:
                x = torch.randn(1, m, CONFIG["hidden"], dtype=dtype, requires_grad=backward)
                eager = _median_ms(block, x, warmup, reps, backward)
                comp = _median_ms(compiled, x, warmup, reps, backward)
                rows.append((str(dtype).replace("torch.", ""), m, eager, comp))
        if rank == 0:
            queue.put(rows)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--backward", action="store_true",
                        help="time forward + backward (the compiled layers' backward reruns their forward)")
    args = parser.parse_args(argv)
    dtypes = [getattr(torch, d) for d in args.dtypes]
    print(f"# cpu flags: {cpu_flags()}; {os.cpu_count()} cores; torch {torch.__version__}")
    print(f"# block: hidden {CONFIG['hidden']}, heads {CONFIG['heads']}/{CONFIG['kv_heads']} x {CONFIG['head_dim']}, "
          f"intermediate {CONFIG['intermediate']}; {'forward + backward' if args.backward else 'forward'}, "
          f"median of {args.reps} after {args.warmup} warm-up calls")
    print("| TP | dtype | M | eager ms | compiled ms | compiled / eager |")
    print("|---|---|---|---|---|---|")
    ctx = mp.get_context("spawn")
    for world in args.tp:
        queue = ctx.SimpleQueue()
        mp.start_processes(run_rank, args=(world, llama_block.free_port(), dtypes, args.m, args.warmup, args.reps, args.backward, queue),
                           nprocs=world, start_method="spawn")
        for dtype, m, eager, comp in queue.get():
            print(f"| {world} | {dtype} | {m} | {eager:.3f} | {comp:.3f} | {comp / eager:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
