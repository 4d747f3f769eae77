"""Per-rank steps of the strict-loading tests (test_strict_loading.py), run in each
rank's process by launcher.run. Each returns what the rank saw: the error type and
message (None when it did not raise) and how long the step took, so the test can check
that every rank failed alike and promptly.
"""

import time

import torch
import torch.distributed as dist

import tp

# A rank left waiting for the others would wait this long: finishing in seconds shows
# that no rank waited for a collective to time out.
LONG_TIMEOUT_S = 300.0


def _outcome(step):
    start = time.monotonic()
    error = None
    try:
        step()
    except Exception as e:  # noqa: BLE001 - the test checks the type
        error = (type(e).__name__, str(e))
    seconds = time.monotonic() - start
    # Every rank gets here and meets the others: a rank that had gone on (say, into a
    # forward's all_reduce) while another failed would block this.
    dist.barrier()
    return {"error": error, "seconds": seconds}


def _comm():
    return tp.communicator(timeout_s=LONG_TIMEOUT_S)


def load_column(rank, world, folder, prefix, in_features, out_features, bias, quant):
    """A ColumnParallelLinear loading `prefix` from the folder."""
    comm = _comm()

    def step():
        ckpt = tp.open_checkpoint(folder)
        layer = tp.ColumnParallelLinear(in_features, out_features, bias=bias, quant=quant, communicator=comm)
        layer.load_weights(ckpt, prefix)

    return _outcome(step)


def load_row(rank, world, folder, prefix, in_features, out_features, bias, quant):
    """A RowParallelLinear loading `prefix` from the folder."""
    comm = _comm()

    def step():
        ckpt = tp.open_checkpoint(folder)
        layer = tp.RowParallelLinear(in_features, out_features, bias=bias, quant=quant, communicator=comm)
        layer.load_weights(ckpt, prefix)

    return _outcome(step)


def load_qkv(rank, world, folder, prefix, hidden, head_dim, heads, kv_heads, bias, x, dtype, want=None):
    """A QKVParallelLinear (gathered output) loading `prefix`; with `want`, also the max
    |layer(x) - want| (a number: a tensor sent back would be fetched from this process
    after it has exited)."""
    comm = _comm()
    out = {}

    def step():
        ckpt = tp.open_checkpoint(folder)
        layer = tp.QKVParallelLinear(hidden, head_dim, heads, kv_heads, bias=bias, gather_output=True, dtype=dtype,
                                     communicator=comm)
        layer.load_weights(ckpt, prefix)
        if want is not None:
            with torch.no_grad():
                out["max_error"] = (layer(x.to(dtype)) - want).abs().max().item()

    result = _outcome(step)
    result["max_error"] = out.get("max_error")
    return result


def load_session_llama(rank, world, folder, spec, skip):
    """Every linear layer of the checkpoint through one LoadSession, plus the tensors
    outside the TP layers by name, except those in `skip`; then finish()."""
    comm = _comm()
    out = {}

    def step():
        session = tp.LoadSession(tp.open_checkpoint(folder), communicator=comm)
        d, h, kv = spec["head_dim"], spec["heads"], spec["kv_heads"]
        hidden, inter = spec["hidden"], spec["intermediate"]
        for i in range(spec["layers"]):
            p = f"model.layers.{i}"
            tp.QKVParallelLinear(hidden, d, h, kv, bias=False, dtype=torch.float64,
                                 communicator=comm).load_weights(session, f"{p}.self_attn")
            tp.RowParallelLinear(h * d, hidden, bias=False, dtype=torch.float64,
                                 communicator=comm).load_weights(session, f"{p}.self_attn.o_proj")
            tp.GateUpParallelLinear(hidden, inter, bias=False, dtype=torch.float64,
                                    communicator=comm).load_weights(session, f"{p}.mlp")
            tp.RowParallelLinear(inter, hidden, bias=False, dtype=torch.float64,
                                 communicator=comm).load_weights(session, f"{p}.mlp.down_proj")
        for name in session.checkpoint.names():
            if (".layers." not in name or "layernorm" in name) and name not in skip:
                session.checkpoint[name]  # norms, embeddings, lm_head: read by the caller
        out["unread"] = session.unread()
        session.finish()

    result = _outcome(step)
    result["unread"] = out.get("unread")
    return result


def expect_filled_layer(rank, world, load_bias):
    """A column layer built uninitialized (init_weights=False) and watched by its session:
    its weight loaded, its bias only when `load_bias`; then finish()."""
    comm = _comm()
    out = {}

    def step():
        torch.manual_seed(0)  # the same checkpoint on every rank
        ckpt = {"fc.weight": torch.randn(12, 8), "fc.bias": torch.randn(12)}
        layer = tp.ColumnParallelLinear(8, 12, bias=True, init_weights=False, communicator=comm)
        session = tp.LoadSession(ckpt if load_bias else {"fc.weight": ckpt["fc.weight"]}, communicator=comm)
        session.expect_filled(layer)
        out["before"] = session.unfilled()
        if load_bias:
            layer.load_weights(session, "fc")
        else:
            # Only the weight, the way a custom loader would write it (load_weights itself would
            # refuse a checkpoint without the bias); the bias is left as built.
            session.checkpoint["fc.weight"]
            with torch.no_grad():
                layer.weight.fill_(1.0)
        out["after"] = session.unfilled()
        session.finish()

    result = _outcome(step)
    result["before"] = out.get("before")
    result["after"] = out.get("after")
    return result
