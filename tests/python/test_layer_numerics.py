"""numerics= on the four Python linear layers: with numerics="invariant" a layer's float32
output and input gradient at TP 2, 3 and 4 have TP 1's bits (torch.equal), for the
shapes of the models test_invariant.py checks (hf_fixtures.py's llama and qwen2: hidden
128 / 192, intermediate 256, 8 / 12 heads over 4 / 6 KV heads, head_dim 32 / 16); and the
option reaches the C++ layer (options.numerics), spelt as a string or a tp.Numerics."""

import numpy as np
import pytest
import torch

import launcher
import tp

# (hidden, intermediate, heads, kv heads, head_dim), as hf_fixtures.py's llama and qwen2.
SHAPES = {"llama": (128, 256, 8, 4, 32), "qwen2": (192, 256, 12, 6, 16)}
TOKENS = (1, 7)


def _randn(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def _run(layer, x, local_input=None):
    """(output, input gradient) of layer on x; the output gathered where the layer's is a slice."""
    x = x.clone().requires_grad_(True)
    y = layer(x if local_input is None else local_input(x))
    (y * _randn(99, *y.shape)).sum().backward()  # seeded by shape only: the same on every rank and TP size
    return y.detach().numpy(), x.grad.numpy()


def _rank(rank, world):
    out = {}
    for name, (hidden, inter, heads, kv, head_dim) in SHAPES.items():
        common = dict(numerics="invariant", dtype=torch.float32)
        for tokens in TOKENS:
            x, h = _randn(1, tokens, hidden), _randn(2, tokens, inter)
            col = tp.ColumnParallelLinear(hidden, inter, gather_output=True, **common)
            col.load_weights({"c.weight": _randn(3, inter, hidden), "c.bias": _randn(4, inter)}, "c")
            out[(name, tokens, "column")] = _run(col, x)

            row = tp.RowParallelLinear(inter, hidden, input_is_parallel=False, **common)
            row.load_weights({"r.weight": _randn(5, hidden, inter), "r.bias": _randn(6, hidden)}, "r")
            out[(name, tokens, "row")] = _run(row, h)

            gate_up = tp.GateUpParallelLinear(hidden, inter, gather_output=True, **common)
            gate_up.load_weights({"mlp.gate_proj.weight": _randn(7, inter, hidden),
                                  "mlp.up_proj.weight": _randn(8, inter, hidden)}, "mlp")
            out[(name, tokens, "gate_up")] = _run(gate_up, x)

            # 4 KV heads over 3 ranks: 2, 1, 1; 6 over 4: 2, 2, 1, 1 (uneven groups).
            qkv = tp.QKVParallelLinear(hidden, head_dim, heads, kv, gather_output=True, **common)
            qkv.load_weights({"a.q_proj.weight": _randn(9, heads * head_dim, hidden),
                              "a.k_proj.weight": _randn(10, kv * head_dim, hidden),
                              "a.v_proj.weight": _randn(11, kv * head_dim, hidden)}, "a")
            out[(name, tokens, "qkv")] = _run(qkv, x)

            # The MLP as a model runs it: a column layer's slice into the row layer.
            up = tp.ColumnParallelLinear(hidden, inter, bias=False, **common)
            up.load_weights({"u.weight": _randn(12, inter, hidden)}, "u")
            down = tp.RowParallelLinear(inter, hidden, bias=False, **common)
            down.load_weights({"d.weight": _randn(13, hidden, inter)}, "d")
            out[(name, tokens, "mlp")] = _run(lambda t: down(torch.relu(up(t))), x)
    return out


_one = {}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_invariant_numerics_on_the_python_layers_gives_tp1_bits(world):
    if not _one:
        _one.update(_rank(0, 1))
    for rank, res in enumerate(launcher.run(world, _rank, timeout=600)):
        for key, (y, grad) in res.items():
            want_y, want_grad = _one[key]
            where = f"{key} at TP {world}, rank {rank}"
            assert np.array_equal(y, want_y), f"{where}: {np.count_nonzero(y != want_y)} outputs differ from TP 1's"
            assert np.array_equal(grad, want_grad), (
                f"{where}: {np.count_nonzero(grad != want_grad)} input-gradient elements differ from TP 1's")


def test_numerics_option_reaches_the_cpp_layer():
    for layer in (tp.ColumnParallelLinear(8, 4, numerics="invariant"),
                  tp.RowParallelLinear(8, 4, numerics=tp.Numerics.invariant),
                  tp.QKVParallelLinear(8, 2, 4, 2, numerics="INVARIANT"),
                  tp.GateUpParallelLinear(8, 4, numerics="invariant")):
        assert layer.options.numerics == tp.Numerics.invariant, type(layer).__name__
    assert tp.ColumnParallelLinear(8, 4).options.numerics == tp.Numerics.auto
    assert tp.RowParallelLinear(8, 4, numerics="default").options.numerics == tp.Numerics.default
    with pytest.raises(ValueError, match="invariant"):
        tp.ColumnParallelLinear(8, 4, numerics="exact")
    with pytest.raises(TypeError, match="numerics"):
        tp.ColumnParallelLinear(8, 4, numerics=1)
