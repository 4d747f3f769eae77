"""Per-rank checks of every layer against torch.nn.functional.linear on the full weights.

``all_checks(rank, world)`` runs in each rank's process (see launcher.py) and returns
{check name: None if it passed, else what went wrong}. Every rank regenerates the
same global weights and inputs from a seed, so the single-device reference needs no
communication.
"""

import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tp

DTYPE = torch.float64
TOL = 1e-10


def _randn(seed, *shape, dtype=DTYPE):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def _close(name, got, want, tol=TOL):
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != expected {tuple(want.shape)}")
    err = (got - want).abs().max().item() if got.numel() else 0.0
    if err > tol:
        raise AssertionError(f"{name}: max abs error {err:.3g} > {tol:.1g}")


def check_column(rank, world, bias, gather):
    in_f, out_f = 13, 10  # 10 over 3 or 4 ranks: uneven
    w, b, x = _randn(1, out_f, in_f), _randn(2, out_f), _randn(3, 5, in_f)
    layer = tp.ColumnParallelLinear(in_f, out_f, bias=bias, gather_output=gather, dtype=DTYPE)
    layer.load_weights({"fc.weight": w, **({"fc.bias": b} if bias else {})}, "fc")  # strict: no unread bias
    ref = F.linear(x, w, b if bias else None)
    begin, end = layer.local_range()
    assert layer.ranges()[rank] == (begin, end)
    assert tuple(layer.weight.shape) == (end - begin, in_f)
    _close("y", layer(x), ref if gather else ref[..., begin:end])


def check_row(rank, world, bias, input_is_parallel, reduce_output):
    in_f, out_f = 11, 7
    w, b, x = _randn(4, out_f, in_f), _randn(5, out_f), _randn(6, 2, 3, in_f)
    layer = tp.RowParallelLinear(in_f, out_f, bias=bias, input_is_parallel=input_is_parallel,
                                 reduce_output=reduce_output, dtype=DTYPE)
    layer.load_weights({"o.weight": w, **({"o.bias": b} if bias else {})}, "o")
    begin, end = layer.local_range()
    y = layer(x[..., begin:end] if input_is_parallel else x)
    if not reduce_output:
        # A partial sum; rank 0 added the bias, so any later reduction is right.
        dist.all_reduce(y)
    _close("y", y, F.linear(x, w, b if bias else None))


def check_qkv(rank, world, num_heads, num_kv_heads, bias, gather):
    hidden, head_dim = 16, 4
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    wq, wk, wv = _randn(7, q_size, hidden), _randn(8, kv_size, hidden), _randn(9, kv_size, hidden)
    bq, bk, bv = _randn(10, q_size), _randn(11, kv_size), _randn(12, kv_size)
    x = _randn(13, 3, hidden)
    layer = tp.QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads, bias=bias, gather_output=gather,
                                 dtype=DTYPE)
    ckpt = {"attn.q_proj.weight": wq, "attn.k_proj.weight": wk, "attn.v_proj.weight": wv}
    if bias:  # a bias-free layer refuses a checkpoint with biases (strict loading)
        ckpt.update({"attn.q_proj.bias": bq, "attn.k_proj.bias": bk, "attn.v_proj.bias": bv})
    layer.load_weights(ckpt, "attn")
    q, k, v = layer.split(layer(x))
    rq, rk, rv = (F.linear(x, w_, b_ if bias else None) for w_, b_ in ((wq, bq), (wk, bk), (wv, bv)))
    plan = layer.head_plan
    if world > num_kv_heads:
        assert plan.kv_replicas == world // num_kv_heads, plan
        assert plan.kv_heads.size() == 1, plan
    if not gather:
        qh, kh = plan.q_heads, plan.kv_heads
        rq = rq[..., qh.begin * head_dim : qh.end * head_dim]
        rk = rk[..., kh.begin * head_dim : kh.end * head_dim]
        rv = rv[..., kh.begin * head_dim : kh.end * head_dim]
    _close("q", q, rq)
    _close("k", k, rk)
    _close("v", v, rv)


def check_attention_output(rank, world):
    """QKV, then an O projection split by attention_output_split(), on GQA heads (uneven at 3)."""
    hidden, head_dim, heads, kv = 16, 4, 8, 4
    qkv = tp.QKVParallelLinear(hidden, head_dim, heads, kv, dtype=DTYPE)
    wq, wo, x = _randn(14, heads * head_dim, hidden), _randn(15, hidden, heads * head_dim), _randn(16, 2, hidden)
    qkv.load_weights({"a.q_proj.weight": wq, "a.k_proj.weight": _randn(17, kv * head_dim, hidden),
                      "a.v_proj.weight": _randn(18, kv * head_dim, hidden)}, "a")
    o = tp.RowParallelLinear(heads * head_dim, hidden, bias=False, split=qkv.attention_output_split(), dtype=DTYPE)
    o.load_weights({"o.weight": wo}, "o")
    q, _, _ = qkv.split(qkv(x))
    _close("o(q)", o(q), F.linear(F.linear(x, wq), wo))


def check_gate_up(rank, world, gather):
    hidden, inter = 12, 10
    wg, wu, x = _randn(19, inter, hidden), _randn(20, inter, hidden), _randn(21, 4, hidden)
    layer = tp.GateUpParallelLinear(hidden, inter, gather_output=gather, dtype=DTYPE)
    layer.load_weights({"mlp.gate_proj.weight": wg, "mlp.up_proj.weight": wu}, "mlp")
    gate, up = layer.split(layer(x))
    begin, end = (0, inter) if gather else layer.local_range()
    _close("gate", gate, F.linear(x, wg)[..., begin:end])
    _close("up", up, F.linear(x, wu)[..., begin:end])


def check_mlp(rank, world, dtype, quant):
    """gate_up -> SiLU(gate) * up -> down, float32 and float64, through an explicit group."""
    hidden, inter = 16, 24
    wg, wu, wd = _randn(22, inter, hidden), _randn(23, inter, hidden), _randn(24, hidden, inter)
    x = _randn(25, 3, hidden)
    group = dist.new_group(list(range(world)))  # not the default group: crosses by its own name
    comm = tp.communicator(group)
    gate_up = tp.GateUpParallelLinear(hidden, inter, dtype=dtype, quant=quant, communicator=comm)
    down = tp.RowParallelLinear(inter, hidden, bias=False, dtype=dtype, quant=quant, communicator=comm)
    ckpt = tp.Checkpoint({"m.gate_proj.weight": wg, "m.up_proj.weight": wu, "m.down_proj.weight": wd})
    gate_up.load_weights(ckpt, "m")
    down.load_weights(ckpt, "m.down_proj")
    gate, up = gate_up.split(gate_up(x.to(dtype)))
    y = down(F.silu(gate) * up)
    ref = F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)
    _close("y", y.double(), ref, tol=TOL if dtype == torch.float64 else 1e-4)
    assert comm.world_size == world and comm.rank == rank
    counts = comm.all_reduce_counts()
    # One reduction (the row layer's). The ranks share this host (their host ids agree),
    # so auto takes shared memory even for a group handed in from torch.distributed.
    # (At world 1 there is nothing to reduce: the process group's no-op.)
    assert comm.ranks_on_one_host and sum(counts.values()) == 1, counts
    expected = {"process_group"} if world == 1 else {"shm_one_shot", "shm_two_shot"}
    assert set(counts) <= expected, counts


def _cases(world):
    for bias in (True, False):
        for gather in (False, True):
            yield f"column bias={bias} gather_output={gather}", check_column, (bias, gather)
    for bias in (True, False):
        for parallel in (True, False):
            for reduce in (True, False):
                yield (f"row bias={bias} input_is_parallel={parallel} reduce_output={reduce}", check_row,
                       (bias, parallel, reduce))
    qkv_configs = [(4, 4, False), (12, 4, True)]  # MHA; GQA (4 KV heads over 3 ranks: uneven)
    if world in (1, 2, 4):
        qkv_configs.append((8, 2, False))  # GQA, KV heads replicated at world 4
    qkv_configs.append((6, 1, True))  # MQA: the KV head replicated on every rank
    for heads, kv, bias in qkv_configs:
        for gather in (False, True):
            yield (f"qkv heads={heads} kv_heads={kv} bias={bias} gather_output={gather}", check_qkv,
                   (heads, kv, bias, gather))
    yield "qkv + o attention_output_split", check_attention_output, ()
    for gather in (False, True):
        yield f"gate_up gather_output={gather}", check_gate_up, (gather,)
    for dtype in (torch.float64, torch.float32):
        for quant in ("none",):  # the quantized formats join here as they land
            yield f"mlp {dtype} quant={quant} explicit group", check_mlp, (dtype, quant)


def case_names(world):
    return [name for name, _, _ in _cases(world)]


def all_checks(rank, world):
    """{name: None | failure text} for every case at this world size."""
    out = {}
    for name, fn, args in _cases(world):
        try:
            fn(rank, world, *args)
            out[name] = None
        except Exception:  # noqa: BLE001 - reported per case by the test
            out[name] = traceback.format_exc()
    return out
