#!/usr/bin/env python3
"""Plots tp-bench's JSON: time vs M (tokens) per TP size, one panel per row.

    build/benchmarks/tp-bench --tp 1,2,4 --m 1,4,16,64,256 --json build/tp-bench.json
    .venv/bin/python benchmarks/plot_bench.py build/tp-bench.json docs/tp-bench.png

Each panel: the TP forward's median time (solid, one line per TP size) and the
single-device reference (dashed; the median over the runs that measured it), both
on log axes. With several formats, AllReduce strategies or dtypes in one file,
--format / --allreduce / --dtype pick one (default: the first in the file).
"""

import argparse
import json
import statistics
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROWS = ["qkv", "o", "gate_up", "down", "block"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json_file")
    ap.add_argument("png_file")
    ap.add_argument("--format", help="quant format to plot (default: the first)")
    ap.add_argument("--allreduce", help="AllReduce strategy to plot (default: the first)")
    ap.add_argument("--dtype", help="dtype to plot (default: the first)")
    ap.add_argument("--dpi", type=int, default=72)
    args = ap.parse_args(argv)

    with open(args.json_file) as f:
        data = json.load(f)
    results = data["results"]
    if not results:
        sys.exit(f"plot_bench: {args.json_file} has no results")
    first = results[0]
    pick = {k: getattr(args, k) or first[k] for k in ("format", "allreduce", "dtype")}
    results = [r for r in results if all(r[k] == v for k, v in pick.items())]
    if not results:
        sys.exit(f"plot_bench: no results for {pick} in {args.json_file}")

    rows = [row for row in ROWS if any(r["row"] == row for r in results)]
    tps = sorted({r["tp"] for r in results})
    fig, axes = plt.subplots(1, len(rows), figsize=(3.1 * len(rows), 3.2), squeeze=False)
    for ax, row in zip(axes[0], rows):
        mine = [r for r in results if r["row"] == row]
        for tp in tps:
            pts = sorted((r["m"], r["tp_ms"]) for r in mine if r["tp"] == tp)
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=f"TP={tp}")
        ms = sorted({r["m"] for r in mine})
        ref = [statistics.median(r["ref_ms"] for r in mine if r["m"] == m) for m in ms]
        ax.plot(ms, ref, "k--", linewidth=1, label="one device")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(row, fontsize=10)
        ax.set_xlabel("M (tokens)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", linewidth=0.3)
    axes[0][0].set_ylabel("median ms", fontsize=8)
    axes[0][-1].legend(fontsize=7)
    s = data["settings"]
    fig.suptitle(
        f"tp-bench: {s['preset']} (hidden {s['hidden']}, intermediate {s['intermediate']}), {pick['dtype']}, "
        f"format {pick['format']}, allreduce {pick['allreduce']}, {s['device']}; {s['machine']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(args.png_file, dpi=args.dpi)
    print(f"wrote {args.png_file}")


if __name__ == "__main__":
    main()
