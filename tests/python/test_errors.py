"""Errors thrown in C++ arrive as Python exceptions carrying the C++ message:
ValueError where the C++ side says the arguments are bad (TORCH_CHECK_VALUE),
TypeError for a wrong dtype (TORCH_CHECK_TYPE), RuntimeError otherwise (see
test_distributed_misc.py for a collective timeout)."""

import pytest
import torch

import tp
from tp import _C


def test_bad_sizes_are_value_errors_naming_the_layer():
    with pytest.raises(ValueError, match=r"ColumnParallelLinear: in_features and out_features must be positive; "
                                         r"got in_features=0, out_features=6"):
        tp.ColumnParallelLinear(0, 6)
    with pytest.raises(ValueError, match="num_heads=6 is not a multiple of num_kv_heads=4"):
        tp.QKVParallelLinear(16, 4, 6, 4)


def test_bad_input_shape_is_value_error():
    layer = tp.RowParallelLinear(8, 4)
    with pytest.raises(ValueError, match=r"RowParallelLinear: input has shape \[2, 5\] but the local "
                                         r"in_features=8; expected \[\.\.\., 8\]"):
        layer(torch.randn(2, 5))


def test_wrong_dtype_is_type_error():
    layer = tp.GateUpParallelLinear(8, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match="input has dtype Float but the layer computes in Double"):
        layer(torch.randn(2, 8))


def test_missing_checkpoint_tensor_is_value_error():
    layer = tp.ColumnParallelLinear(8, 4)
    with pytest.raises(ValueError, match="checkpoint has no tensor 'fc.weight'"):
        layer.load_weights({"other.weight": torch.randn(4, 8)}, "fc")


def test_bad_strategy_name_is_value_error():
    with pytest.raises(ValueError, match="fastest"):
        tp.RowParallelLinear(8, 4, all_reduce="fastest")


def test_unknown_group_name_is_value_error():
    with pytest.raises(ValueError, match="no torch.distributed process group is registered under the name 'nope'"):
        _C.Communicator.from_group_name("nope")


def test_no_cpp_backtrace_in_messages():
    with pytest.raises(ValueError) as info:
        tp.ColumnParallelLinear(-1, 2)
    assert "Exception raised from" not in str(info.value)


def test_bad_timeout_is_value_error():
    with pytest.raises(ValueError, match="timeout_s=-1"):
        tp.CommunicatorOptions(timeout_s=-1)
