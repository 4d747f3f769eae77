#!/usr/bin/env python3
"""Puts tp-bench's and vllm_cpu_bench.py's JSON results side by side: tp ms / vLLM ms per (row, TP, M).

usage: peer_compare.py TP_BENCH_JSON VLLM_JSON

tp-bench's figure is its `TP ms` (the forward as a user runs it, the slowest rank per iteration;
the dtype and AllReduce strategy of the run: one of each is expected), vLLM's the same measure of
vLLM-CPU's layers, matched per (format, row, TP, M), with the kernel each side ran. A ratio below 1
means tp is faster.
"""

import json
import sys

from block_problem import rel_err_bound

ROWS = ("qkv", "o", "gate_up", "down", "block")


def canonical_format(name: str) -> str:
    """tp-bench spells a format as parsed (INT4 gains its default ':sym'); the vLLM bench as asked."""
    return name[:-len(":sym")] if name.endswith(":sym") else name


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        tp = json.load(f)
    with open(sys.argv[2]) as f:
        vl = json.load(f)
    tp_rows = tp["results"]
    combos = {(r["dtype"], r["allreduce"]) for r in tp_rows}
    if len(combos) != 1:
        print(f"peer_compare: expected one (dtype, allreduce) in tp-bench's results, found {sorted(combos)}",
              file=sys.stderr)
        return 1
    (dtype, allreduce), = combos
    if dtype != vl["settings"]["dtype"]:
        print(f"peer_compare: tp-bench ran {dtype}, the vLLM bench {vl['settings']['dtype']}", file=sys.stderr)
        return 1
    ts, vs = tp["settings"], vl["settings"]["shape"]
    for k in ("hidden", "intermediate", "heads", "kv_heads", "head_dim"):
        if ts[k] != vs[k]:
            print(f"peer_compare: the shapes differ ({k}: tp-bench {ts[k]}, vLLM {vs[k]})", file=sys.stderr)
            return 1
    formats = vl["settings"].get("formats", ["none"])
    tpd = {(canonical_format(r["format"]), r["row"], r["tp"], r["m"]): r for r in tp_rows}
    vld = {(r.get("format", "none"), r["row"], r["tp"], r["m"]): r for r in vl["results"]}
    order = {f: n for n, f in enumerate(formats)}
    keys = sorted(set(tpd) & set(vld), key=lambda k: (order.get(k[0], len(order)), ROWS.index(k[1]), k[2], k[3]))
    per_tp = {int(k): v for k, v in vl["settings"]["per_tp"].items()}
    for t, info in sorted(per_tp.items()):
        for fmt, fi in info.get("formats", {}).items():
            if "unsupported" in fi:
                print(f"  vLLM-CPU, TP {t}, {fmt}: no linear method here ({fi['unsupported']})")
    if not keys:
        print("peer_compare: no (format, row, TP, M) in common", file=sys.stderr)
        return 1

    def vllm_kernel(fmt: str, row: str, t: int) -> str:
        kernels = per_tp.get(t, {}).get("formats", {}).get(fmt, {}).get("kernel", {})
        return kernels.get(row, "(the four layers')") if row != "block" else "(the four layers')"

    header = ["format", "row", "TP", "M", "tp ms", "vLLM ms", "tp/vLLM", "tp rel_err", "vLLM rel_err", "tp allreduce",
              "vLLM allreduce", "tp kernel", "vLLM kernel"]
    rows = []
    for k in keys:
        a, b = tpd[k], vld[k]
        ratio = a["tp_ms"] / b["ms"] if b["ms"] > 0 else float("inf")
        comm = k[1] in ("o", "down", "block") and k[2] > 1
        rows.append([k[0], k[1], str(k[2]), str(k[3]), f"{a['tp_ms']:.3f}", f"{b['ms']:.3f}", f"{ratio:.2f}",
                     f"{a['rel_err']:.1e}{' !' if a.get('suspicious') else ''}",
                     f"{b['rel_err']:.1e}{' !' if b['rel_err'] > rel_err_bound(k[0], dtype) else ''}",
                     a["allreduce_taken"] if comm else "-",
                     short_allreduce(per_tp.get(k[2], {}).get("allreduce", "?")) if comm else "-",
                     a.get("kernel", "?") or "-", vllm_kernel(k[0], k[1], k[2])])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def fmt_row(cells):
        return "  ".join(c.ljust(w) if i in (0, 1, 11, 12) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    print(f"== tp ms / vLLM ms ({dtype}, tp-bench --allreduce {allreduce}; < 1: tp is faster). rel_err: each side's "
          "against its own float64 reference, ! above tp-bench's bound; vLLM's block of an activation-quantized "
          "format: its worst layer on the inputs it got")
    print("\n".join([fmt_row(header), fmt_row(["-" * w for w in widths])] + [fmt_row(r) for r in rows]))
    for name, only in (("tp-bench's", set(tpd) - set(vld)), ("vLLM's", set(vld) - set(tpd))):
        counts: dict = {}
        for k in only:
            counts[k[0]] = counts.get(k[0], 0) + 1
        if counts:
            print(f"  only in {name} run: " + ", ".join(f"{f} ({n} rows)" for f, n in sorted(counts.items())))
    return 0


def short_allreduce(text: str) -> str:
    if "shm" in text.lower():
        return "vllm_shm"
    if "gloo" in text:
        return "gloo"
    return text


if __name__ == "__main__":
    sys.exit(main())
