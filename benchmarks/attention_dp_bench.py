"""Attention data parallelism against tensor parallelism at decode (issue 51): a
Qwen3-30B-A3B-shaped mixture of experts (hidden 2048, 32 query / 4 KV heads of 128, 128
experts of 768, top 8, vocabulary 151936; `--layers` decoder layers, random bfloat16
weights) over two ranks, 8 requests:

  TP 2: both ranks run all 8 requests, the attention's heads split over them;
  DP 2: each rank runs 4 requests with whole heads (attention_data_parallel=2);

the experts distributed over both ranks (expert parallelism 2) alike. Prints the median time
of a decode step (one token per request into the KV cache, after a prompt of `--prompt`
tokens; the median over `--steps` steps) and each rank's KV-cache bytes, with the CPU flags.

    PYTHONPATH=build/python .venv/bin/python benchmarks/attention_dp_bench.py [--layers 2]
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import launcher  # noqa: E402


def write_folder(folder, layers, vocab):
    import transformers

    cfg = transformers.Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False,
        max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder)


def _rank(rank, world, folder, dp, requests, prompt, steps):
    import tp

    torch.set_num_threads(1)
    model = tp.CausalLM.from_pretrained(folder, dtype=torch.bfloat16, expert_parallel=True,
                                        attention_data_parallel=dp)
    batch = requests // dp
    g = torch.Generator().manual_seed(model.attention_group)
    ids = torch.randint(0, 151936, (batch, prompt), generator=g)
    times = []
    with torch.no_grad():
        cache = model.make_cache(batch, prompt + steps + 1)
        model(ids, cache, 1)
        token = ids[:, -1:]
        for _ in range(steps):
            t0 = time.perf_counter()
            model(token, cache, 1)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), cache.bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tp-attention-dp-bench"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    folder = f"{args.dir}-L{args.layers}"
    if not os.path.exists(os.path.join(folder, "config.json")):
        write_folder(folder, args.layers, args.vocab)
    flags = sorted(f for f in open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
                   if f.startswith(("avx", "amx", "fma")))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"attention DP bench: Qwen3-30B-A3B shape, {args.layers} layers, {args.requests} requests, prompt "
          f"{args.prompt}, bfloat16, 2 ranks x 1 thread, EP 2; load {load}\nflags: {' '.join(flags)}")
    print(f"{'layout':8} {'step ms (rank 0, rank 1)':28} {'KV cache bytes per rank':26}")
    for name, dp in (("TP 2", 1), ("DP 2", 2)):
        res = launcher.run(2, _rank, folder, dp, args.requests, args.prompt, args.steps, timeout=1200)
        ms = ", ".join(f"{t * 1e3:.1f}" for t, _ in res)
        kv = ", ".join(str(b) for _, b in res)
        print(f"{name:8} {ms:28} {kv:26}")


if __name__ == "__main__":
    main()
