"""tp's from_pretrained against transformers' on the same folder, in one run (issue 46).

    PYTHONPATH=build/python .venv/bin/python benchmarks/load_vs_transformers.py [--dir D] [--rounds 3]

Writes (once) a Llama-shaped folder with transformers' own save_pretrained (bfloat16,
safetensors), then loads it, each load in a fresh process, alternating, `rounds` times:
  transformers  AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
  tp TP 1       tp.CausalLM.from_pretrained(folder, dtype=torch.bfloat16)
  tp TP 2       the same in two processes over a Gloo group (each rank its shard)
and prints the median load time (slowest rank) and the peak RSS the load added per
process (VmHWM after the load minus VmRSS before it, the peak reset through
/proc/self/clear_refs: the imports are not counted).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    what, folder = sys.argv[1], sys.argv[2]

    def status_kib(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])

    def start():  # the peak reset to the current RSS (Linux >= 4.0), and that RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_kib("VmRSS")

    if what == "transformers":
        from transformers import AutoModelForCausalLM
        before = start()
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        seconds = time.perf_counter() - t0
    else:
        import torch.distributed as dist
        import tp
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.init_process_group("gloo")
            dist.barrier()
        before = start()
        t0 = time.perf_counter()
        model = tp.CausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak_rss_kib": status_kib("VmHWM") - before}))
    """
)


def write_folder(folder: str, args) -> None:
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(46)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    print(f"wrote {folder}", file=sys.stderr)


def run(what: str, folder: str, world: int, port: int):
    env = dict(os.environ)
    procs = []
    for rank in range(world):
        if world > 1:
            env.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            # The cores shared out, as tp-load-bench does for its ranks.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // world))
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, what, folder], env=dict(env),
                                      stdout=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{what} at world {world} failed (exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return max(o["seconds"] for o in out), max(o["peak_rss_kib"] for o in out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = os.path.join(args.dir, f"tp-hf-llama-h{args.hidden}-i{args.intermediate}-L{args.layers}-V{args.vocab}")
    write_folder(folder, args)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
    for f in os.listdir(folder):  # warm the page cache: every side reads from memory
        with open(os.path.join(folder, f), "rb") as fh:
            while fh.read(64 << 20):
                pass
    sides = [("transformers", 1), ("tp", 1), ("tp", 2)]
    times = {s: [] for s in sides}
    rss = {s: [] for s in sides}
    port = 29900
    for _ in range(args.rounds):
        for side in sides:
            port += 1
            t, r = run(side[0], folder, side[1], port)
            times[side].append(t)
            rss[side].append(r)
    print(f"folder {folder}: {size / 2**20:.1f} MiB of bfloat16 safetensors written by transformers; "
          f"medians of {args.rounds} alternating rounds, each load a fresh process, page cache warm")
    print(f"{'loader':<34}{'load s':>9}{'peak RSS - before, MiB':>24}")
    names = {("transformers", 1): "transformers AutoModelForCausalLM", ("tp", 1): "tp TP 1",
             ("tp", 2): "tp TP 2 (slowest rank; per rank)"}
    for side in sides:
        print(f"{names[side]:<34}{statistics.median(times[side]):>9.3f}{statistics.median(rss[side]) / 1024:>24.0f}")


if __name__ == "__main__":
    main()
