"""What sampling costs in tp's generate (issue 51, part 3), at TP 1.

    PYTHONPATH=build/python .venv/bin/python benchmarks/sampling_bench.py [--dir D] [--vocab 128256]

Writes (once) a one-layer Llama folder with a large vocabulary and a tiny hidden size (so the
model's own step is small) with transformers' save_pretrained, then times generate's tokens
greedy and with each sampling filter (median of 5 runs of 32 tokens, after a warm-up), and
prints what sampling adds per token. Random weights make nearly flat logits: a top-p nucleus
then holds most of the vocabulary (the expensive case; a trained model's is small), and every
token is near the maximum, so the draw takes its logarithms for all of them; temperature 0.05
spreads the same logits 20 times, as a trained model's are spread, and the draw prunes.

Also prints, per TP size, the bytes each rank contributes to sampling's all-gathers per row
and token (from the algorithm in src/layers/vocab/sampling.cpp: float64 values) against an
all-gather of its logits slice in bfloat16.
"""

import argparse
import os
import time

import torch

import tp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tp-sampling-bench"))
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    folder = f"{args.dir}-V{args.vocab}"
    if not os.path.exists(os.path.join(folder, "config.json")):
        import transformers

        cfg = transformers.LlamaConfig(
            vocab_size=args.vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            tie_word_embeddings=False,
        )
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(folder)
    model = tp.CausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = torch.tensor([[1, 2, 3, 4]])
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"tp sampling bench: vocab {args.vocab}, TP 1, {torch.get_num_threads()} threads, load {load}")

    def per_token_ms(**kw):
        model.generate(prompt, 4, **kw)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            model.generate(prompt, args.tokens, **kw)
            times.append(time.perf_counter() - t0)
        return sorted(times)[2] / args.tokens * 1e3

    greedy = per_token_ms()
    print(f"{'filter':<24} {'ms/token':>9} {'sampling adds ms':>17}")
    print(f"{'greedy (argmax)':<24} {greedy:>9.3f} {'-':>17}")
    for name, kw in [
        ("temperature 1", dict(do_sample=True)),
        ("temperature 0.05", dict(do_sample=True, temperature=0.05)),
        ("top_k 50", dict(do_sample=True, top_k=50)),
        ("top_p 0.9", dict(do_sample=True, top_p=0.9)),
        ("top_k 50, top_p 0.9", dict(do_sample=True, top_k=50, top_p=0.9)),
        ("min_p 0.05", dict(do_sample=True, min_p=0.05)),
    ]:
        ms = per_token_ms(**kw)
        print(f"{name:<24} {ms:>9.3f} {ms - greedy:>17.3f}")

    print("\nbytes each rank contributes to the all-gathers, per row and token:")
    print(f"{'TP':>3} {'plain':>7} {'top_k 50':>9} {'top_p, 1 round':>15} {'logits (bf16)':>14}")
    for world in (1, 2, 4, 8):
        plain = 8 + 16  # the row maximum; the winner (value, id)
        top_k = plain + 8 * 50
        top_p = plain + 8 + 8 * (2 * 64 + 1)  # the normalizer; 64 candidates (value, id) and the frontier
        logits = 2 * -(-args.vocab // world)
        print(f"{world:>3} {plain:>7} {top_k:>9} {top_p:>15} {logits:>14}")


if __name__ == "__main__":
    main()
