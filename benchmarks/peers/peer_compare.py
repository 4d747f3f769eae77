#!/usr/bin/env python3
"""Puts tp-bench's and vllm_cpu_bench.py's JSON results side by side: tp ms / vLLM ms per (row, TP, M).

usage: peer_compare.py TP_BENCH_JSON VLLM_JSON

tp-bench's figure is its `TP ms` (the forward as a user runs it, the slowest rank per iteration;
format none, the dtype and AllReduce strategy of the run: one of each is expected), vLLM's the
same measure of vLLM-CPU's layers. A ratio below 1 means tp is faster.
"""

import json
import sys

ROWS = ("qkv", "o", "gate_up", "down", "block")


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        tp = json.load(f)
    with open(sys.argv[2]) as f:
        vl = json.load(f)
    tp_rows = [r for r in tp["results"] if r["format"] == "none"]
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
    tpd = {(r["row"], r["tp"], r["m"]): r for r in tp_rows}
    vld = {(r["row"], r["tp"], r["m"]): r for r in vl["results"]}
    keys = sorted(set(tpd) & set(vld), key=lambda k: (ROWS.index(k[0]), k[1], k[2]))
    if not keys:
        print("peer_compare: no (row, TP, M) in common", file=sys.stderr)
        return 1
    vl_ar = {int(k): v["allreduce"] for k, v in vl["settings"]["per_tp"].items()}
    header = ["row", "TP", "M", "tp ms", "vLLM ms", "tp/vLLM", "tp allreduce", "vLLM allreduce"]
    rows = []
    for k in keys:
        a, b = tpd[k], vld[k]
        ratio = a["tp_ms"] / b["ms"] if b["ms"] > 0 else float("inf")
        comm = k[0] in ("o", "down", "block") and k[1] > 1
        rows.append([k[0], str(k[1]), str(k[2]), f"{a['tp_ms']:.3f}", f"{b['ms']:.3f}", f"{ratio:.2f}",
                     a["allreduce_taken"] if comm else "-", short_allreduce(vl_ar.get(k[1], "?")) if comm else "-"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    def fmt(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(f"== tp ms / vLLM ms ({dtype}, tp-bench --allreduce {allreduce}; < 1: tp is faster)")
    print("\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]))
    missing = sorted(set(tpd) ^ set(vld))
    if missing:
        print(f"  (only in one of the two runs: {missing})")
    return 0


def short_allreduce(text: str) -> str:
    if "shm" in text.lower():
        return "vllm_shm"
    if "gloo" in text:
        return "gloo"
    return text


if __name__ == "__main__":
    sys.exit(main())
