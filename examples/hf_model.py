#!/usr/bin/env python3
"""A whole Llama / Qwen2 / Qwen3 decoder from a Hugging Face folder with tp.CausalLM,
and greedy generation, at one or more TP sizes; optionally against transformers.

    PYTHONPATH=build/python python examples/hf_model.py FOLDER --tp 1 2 [--tokens 16]
        [--dtype float64] [--prompt 1,2,3] [--compare-transformers]

For each TP size, starts that many processes (gloo over 127.0.0.1); every rank reads
config.json (tp.ModelConfig) and only its shards of the safetensors, and generates
greedily with a KV cache. --compare-transformers loads the folder with transformers
in the same dtype and checks that its logits of the prompt and its
generate(do_sample=False) tokens are tp's (exit status 1 otherwise).
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tp

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def run_rank(rank, world, port, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = tp.CausalLM.from_pretrained(args.folder, dtype=DTYPES.get(args.dtype))
        prompt = torch.tensor([args.prompt])
        with torch.no_grad():
            logits = model.gather_logits(model(prompt))
        tokens = model.generate(prompt, args.tokens)
        if rank == 0:
            print(model)
            queue.put((logits.double().tolist(), tokens.tolist()))  # plain data: the process ends
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def transformers_reference(args):
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=DTYPES.get(args.dtype, "auto")).eval()
    prompt = torch.tensor([args.prompt])
    config = GenerationConfig(max_new_tokens=args.tokens, do_sample=False, eos_token_id=None, bos_token_id=None,
                              pad_token_id=0)
    with torch.no_grad():
        logits = model(prompt).logits
        tokens = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    return logits, tokens[:, prompt.shape[1]:]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--tp", type=int, nargs="+", default=[1])
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: the checkpoint's")
    p.add_argument("--prompt", type=lambda s: [int(t) for t in s.split(",")], default=[1, 2, 3, 4, 5, 6])
    p.add_argument("--compare-transformers", action="store_true")
    args = p.parse_args(argv)
    ref = transformers_reference(args) if args.compare_transformers else None
    ok = True
    ctx = mp.get_context("spawn")
    for world in args.tp:
        queue = ctx.SimpleQueue()
        mp.start_processes(run_rank, args=(world, free_port(), args, queue), nprocs=world, start_method="spawn")
        logits, tokens = queue.get()
        logits, tokens = torch.tensor(logits, dtype=torch.float64), torch.tensor(tokens)
        print(f"TP={world}: generated {tokens[0].tolist()}")
        if ref is not None:
            err = (logits.double() - ref[0].double()).abs().max().item()
            same = torch.equal(tokens, ref[1])
            print(f"TP={world}: max |logits - transformers| = {err:.3g}; greedy tokens "
                  f"{'equal to' if same else 'DIFFERENT from'} transformers' generate(do_sample=False)")
            ok = ok and same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
