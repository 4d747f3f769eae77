"""The layers as torch.nn.Modules, in one process (TP = 1, no torch.distributed):
parameters are the C++ module's tensors, and PyTorch's module API keeps them so."""

import copy
import inspect
import pickle

import pytest
import torch
import torch.nn.functional as F

import tp


def test_parameters_are_the_cpp_tensors():
    layer = tp.ColumnParallelLinear(8, 6)
    params = dict(layer.named_parameters())
    assert list(params) == ["weight", "bias"]
    assert all(type(p) is torch.nn.Parameter and p.requires_grad for p in params.values())
    # The same Python objects, i.e. the same TensorImpl, as the C++ module holds.
    assert layer.weight is layer._impl.weight and layer.bias is layer._impl.bias


def test_forward_matches_linear_and_backward_reaches_parameters():
    torch.manual_seed(0)
    layer = tp.ColumnParallelLinear(8, 6)
    x = torch.randn(3, 8)
    y = layer(x)
    torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias))
    y.square().sum().backward()
    assert layer.weight.grad is not None and layer.bias.grad is not None


def test_optimizer_step_changes_what_cpp_computes():
    torch.manual_seed(0)
    layer = tp.RowParallelLinear(8, 4)
    x = torch.randn(5, 8)
    before = layer(x).detach().clone()
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(x).sum().backward()
    opt.step()
    after = layer(x)
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, F.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_to_dtype_converts_the_cpp_module_too(dtype):
    layer = tp.GateUpParallelLinear(8, 6)
    weight = layer.weight
    assert layer.to(dtype) is layer
    assert layer.weight is weight and layer.weight.dtype == dtype
    assert layer._impl.weight.dtype == dtype
    x = torch.randn(2, 8, dtype=dtype)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight))
    layer.float()
    assert layer._impl.weight.dtype == torch.float32


def test_state_dict_and_load_state_dict():
    a, b = tp.QKVParallelLinear(16, 4, 4, 2, bias=True), tp.QKVParallelLinear(16, 4, 4, 2, bias=True)
    assert sorted(a.state_dict()) == ["bias", "weight"]
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 16)
    assert torch.equal(a(x), b(x))


def test_print_shows_global_and_local_sizes():
    model = torch.nn.Sequential(tp.ColumnParallelLinear(8, 6, bias=False), tp.RowParallelLinear(6, 8))
    text = repr(model)
    assert "ColumnParallelLinear(in_features=8, out_features=6, local_out=[0,6), bias=false, rank=0/1)" in text
    assert "RowParallelLinear(in_features=6, out_features=8, local_in=[0,6), bias=true, rank=0/1)" in text


def test_no_bias_is_none_like_nn_linear():
    layer = tp.ColumnParallelLinear(4, 4, bias=False)
    assert layer.bias is None and [n for n, _ in layer.named_parameters()] == ["weight"]


def test_options_and_helpers():
    qkv = tp.QKVParallelLinear(32, 8, 4, 2, gather_output=True, dtype=torch.float64)
    assert qkv.options.num_heads == 4 and qkv.options.gather_output and qkv.options.dtype == torch.float64
    assert qkv.world_size == 1 and qkv.rank == 0
    assert qkv.local_q_heads == 4 and qkv.local_kv_heads == 2
    q, k, v = qkv.split(qkv(torch.randn(2, 32, dtype=torch.float64)))
    assert q.shape[-1] == 32 and k.shape[-1] == 16 and v.shape[-1] == 16
    policy = qkv.attention_output_split()
    assert policy.granularity == 8 and policy.weights == [32.0]
    assert [tuple(r) for r in tp.split(10, 4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    row = tp.RowParallelLinear(8, 4, all_reduce="process_group")
    assert row.options.all_reduce == tp.AllReduceStrategy.process_group
    assert tp.ColumnParallelLinear(4, 4, quant="none").options.quant.format == tp.QuantFormat.none


@pytest.mark.parametrize(
    "layer, args, own",
    [
        (tp.ColumnParallelLinear, (8, 4), ["gather_output", "sequence_parallel", "sequence_dim"]),
        (tp.RowParallelLinear, (8, 4), ["input_is_parallel", "reduce_output", "all_reduce", "wire",
                                        "sequence_parallel", "sequence_dim"]),
        (tp.QKVParallelLinear, (32, 8, 4, 2), ["gather_output", "sequence_parallel", "sequence_dim"]),
        (tp.GateUpParallelLinear, (8, 16), ["gather_output", "sequence_parallel", "sequence_dim"]),
    ],
)
def test_layers_take_the_shared_keywords_and_name_a_misspelt_one(layer, args, own):
    shared = ["quant", "numerics", "split", "dtype", "device", "group", "communicator", "init_weights"]
    params = inspect.signature(layer).parameters
    keyword_only = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only == own + shared
    assert params["quant"].default is None and params["sequence_dim"].default == 0
    assert params["init_weights"].default is True
    built = layer(*args, sequence_parallel=True, sequence_dim=1, dtype=torch.float64, quant="none")
    assert built.options.sequence_parallel and built.options.sequence_dim == 1
    assert built.options.dtype == torch.float64
    assert built.options.bias == (layer in (tp.ColumnParallelLinear, tp.RowParallelLinear))  # the defaults
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) dtpye; it takes .*dtype"):
        layer(*args, dtpye=torch.float64)


def test_init_weights_false_skips_the_draw_and_a_load_fills_the_weights():
    # As torch.nn.utils.skip_init: the same draw is reset_parameters() away, and a load fills it.
    torch.manual_seed(3)
    drawn = tp.ColumnParallelLinear(64, 32)
    torch.manual_seed(3)
    skipped = tp.ColumnParallelLinear(64, 32, init_weights=False)
    assert skipped.options.init_weights is False and drawn.options.init_weights is True
    skipped.reset_parameters()
    assert torch.equal(skipped.weight, drawn.weight) and torch.equal(skipped.bias, drawn.bias)
    w, b = torch.randn(32, 64), torch.randn(32)
    loaded = tp.RowParallelLinear(64, 32, init_weights=False)
    loaded.load_weights({"fc.weight": w, "fc.bias": b}, "fc")
    assert torch.equal(loaded.weight, w) and torch.equal(loaded.bias, b)


def test_load_weights_from_dict_and_checkpoint():
    w, b = torch.randn(6, 8), torch.randn(6)
    layer = tp.ColumnParallelLinear(8, 6)
    layer.load_weights({"fc.weight": w, "fc.bias": b}, "fc")
    assert torch.equal(layer.weight, w) and torch.equal(layer.bias, b)
    ckpt = tp.Checkpoint()
    ckpt.add("fc.weight", 2 * w)
    ckpt.add("fc.bias", b)
    assert "fc.weight" in ckpt and len(ckpt) == 2
    layer.load_weights(ckpt, "fc")
    assert torch.equal(layer.weight, 2 * w)


def test_default_communicator_without_torch_distributed():
    comm = tp.communicator()
    assert (comm.rank, comm.world_size) == (0, 1)
    t = torch.ones(3)
    assert comm.all_reduce(t) is t  # world 1: a no-op, in place


def test_pickling_is_refused_with_a_hint():
    with pytest.raises(TypeError, match="state_dict"):
        pickle.dumps(tp.ColumnParallelLinear(4, 4))
    with pytest.raises(TypeError):
        copy.deepcopy(tp.ColumnParallelLinear(4, 4))


def test_safetensors_round_trip_through_open_checkpoint(tmp_path):
    """tp.save_safetensors writes a file that tp.open_checkpoint maps lazily and the
    layers load from, matching the tensors written (and Python's safetensors agrees)."""
    from safetensors.torch import load_file

    torch.manual_seed(3)
    tensors = {
        "mlp.gate_proj.weight": torch.randn(24, 8),
        "mlp.up_proj.weight": torch.randn(24, 8),
        "mlp.down_proj.weight": torch.randn(8, 24),
    }
    path = str(tmp_path / "model.safetensors")
    tp.save_safetensors(path, tensors, {"format": "pt"})
    for name, t in load_file(path).items():
        assert torch.equal(t, tensors[name])

    ckpt = tp.open_checkpoint(path)
    assert len(ckpt) == 3 and "mlp.up_proj.weight" in ckpt
    gate_up = tp.GateUpParallelLinear(8, 24)
    down = tp.RowParallelLinear(24, 8, bias=False)
    gate_up.load_weights(ckpt, "mlp")
    down.load_weights(ckpt, "mlp.down_proj")
    x = torch.randn(2, 8)
    gate, up = gate_up.split(gate_up(x))
    ref = F.linear(F.silu(F.linear(x, tensors["mlp.gate_proj.weight"])) * F.linear(x, tensors["mlp.up_proj.weight"]),
                   tensors["mlp.down_proj.weight"])
    torch.testing.assert_close(down(F.silu(gate) * up), ref)
    with pytest.raises(ValueError, match="no tensor 'missing.weight'"):
        down.load_weights(ckpt, "missing")


def test_all_reduce_strategies_wire_precision_and_tables(tmp_path, monkeypatch):
    """The comm settings cross to Python: every strategy, the wire precision (options,
    layer and call), the tuning table (a bad one names the file), and the counters."""
    assert tp.AllReduceStrategy.recursive_doubling == tp._C.parse_all_reduce_strategy("Recursive_Doubling")
    assert tp.WirePrecision.bf16 == tp._C.parse_wire_precision("bfloat16")
    options = tp.CommunicatorOptions(wire=tp.WirePrecision.bf16, host_id="node-a")
    assert options.wire == tp.WirePrecision.bf16 and options.host_id == "node-a"
    row = tp.RowParallelLinear(8, 4, all_reduce="recursive_doubling", wire="bf16")
    assert row.options.wire == tp.WirePrecision.bf16
    assert "all_reduce=recursive_doubling, wire=bf16" in repr(row)
    comm = tp.communicator(wire="bf16")
    t = torch.ones(3)
    comm.all_reduce(t, tp.AllReduceStrategy.recursive_doubling, tp.WirePrecision.native)
    assert comm.all_reduce_counts() == {"recursive_doubling": 1}
    assert comm.all_reduce_wire_counts() == {"native": 1}
    assert comm.resolve_all_reduce(t) == tp.AllReduceStrategy.process_group  # world 1
    assert comm.ranks_on_one_host
    table = tmp_path / "table.json"
    table.write_text('{"format": "tp-allreduce-table", "entries": []}')
    monkeypatch.setenv("TP_ALLREDUCE_TABLE", str(table))  # world 1 reads the environment too
    with pytest.raises(ValueError, match="all-reduce table .*table.json: no entries"):
        tp.communicator()
    monkeypatch.delenv("TP_ALLREDUCE_TABLE")
    with pytest.raises(ValueError, match="unknown wire precision 'fp8'"):
        tp.communicator(wire="fp8")
