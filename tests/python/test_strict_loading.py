"""Strict, rank-consistent loading against checkpoints made by other people's code
(transformers' save_pretrained, compressed-tensors' own compressors; see
checkpoints.py): issue 14's failures 1, 2, 3 and 6 now raise a clear error, on every
rank, within seconds. Ranks are processes over gloo (launcher.py).
"""

import struct

import pytest
import torch

import launcher
import strict_checks
import tp
from checkpoints import save_compressed_tensors, save_float_checkpoint

PROMPT_S = 10.0  # every rank must have its error within this (the collective timeout is 300 s)

# A Llama whose o_proj has K = 256: two INT4 groups of 128 for four ranks.
SMALL_LLAMA = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                   num_hidden_layers=1)


def _check_every_rank(results, error_type, *needles):
    """Every rank raised `error_type` with the same message containing `needles`, promptly."""
    first = results[0]["error"]
    for rank, res in enumerate(results):
        assert res["error"] is not None, f"rank {rank} raised nothing"
        kind, message = res["error"]
        assert kind == error_type, f"rank {rank}: {kind}: {message}"
        for needle in needles:
            assert needle in message, f"rank {rank}: {needle!r} not in: {message}"
        assert res["error"] == first, f"rank {rank} got another error than rank 0: {message}"
        assert res["seconds"] < PROMPT_S, f"rank {rank} took {res['seconds']:.1f} s"


# ---------------------------------------------------------------------------------------
# Failure 1: an FP8 checkpoint loaded into a layer built without quant=
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ct_fp8(tmp_path_factory):
    return save_compressed_tensors(tmp_path_factory.mktemp("ct_fp8") / "m", "fp8_channel", "llama", **SMALL_LLAMA)


@pytest.mark.parametrize("world", [1, 2])
def test_fp8_weights_into_an_unquantized_layer_raise_on_every_rank(ct_fp8, world):
    spec = ct_fp8.spec
    prefix = "model.layers.0.self_attn.q_proj"
    results = launcher.run(world, strict_checks.load_column, str(ct_fp8.folder), prefix, spec.hidden_size,
                           spec.q_size, False, None)
    needles = [f"'{prefix}.weight'", "Float8_e4m3fn", "quant format is none", "quant=fp8_"]
    if world > 1:
        needles.append(f"failed on every rank ({world} of {world})")
    _check_every_rank(results, "ValueError", *needles)
    # Built with the checkpoint's format, it loads.
    ok = launcher.run(world, strict_checks.load_column, str(ct_fp8.folder), prefix, spec.hidden_size, spec.q_size,
                      False, "fp8_channel")
    assert all(r["error"] is None for r in ok), ok


# ---------------------------------------------------------------------------------------
# Failure 2: Qwen2's q/k/v biases loaded into layers built with bias=False
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return save_float_checkpoint(tmp_path_factory.mktemp("qwen2") / "m", "qwen2", dtype=torch.float64,
                                 num_hidden_layers=1)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_qwen2_biases_into_a_bias_free_layer_raise_on_every_rank(qwen2, world):
    s = qwen2.spec
    prefix = "model.layers.0.self_attn"
    x = torch.randn(5, s.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    results = launcher.run(world, strict_checks.load_qkv, str(qwen2.folder), prefix, s.hidden_size, s.head_dim,
                           s.num_attention_heads, s.num_key_value_heads, False, x, torch.float64)
    needles = [f"'{prefix}.q_proj.bias'", f"'{prefix}.k_proj.bias'", f"'{prefix}.v_proj.bias'", "bias=false",
               "bias=true"]
    _check_every_rank(results, "ValueError", *needles)
    # With bias=True: transformers' q/k/v projections, float64 within 1e-12.
    attn = qwen2.model.model.layers[0].self_attn
    with torch.no_grad():
        want = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
    results = launcher.run(world, strict_checks.load_qkv, str(qwen2.folder), prefix, s.hidden_size, s.head_dim,
                           s.num_attention_heads, s.num_key_value_heads, True, x, torch.float64, want)
    for rank, res in enumerate(results):
        assert res["error"] is None, res["error"]
        assert res["max_error"] < 1e-12, f"rank {rank}: max error {res['max_error']}"


# ---------------------------------------------------------------------------------------
# Failure 3: a compressed-tensors W4A16 checkpoint loaded as int4_gptq at TP 4, where
# o_proj has 2 groups for 4 ranks (ranks 2 and 3 own no shard and used to skip every
# check, then block in their next all_reduce until the collective timeout)
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ct_w4a16(tmp_path_factory):
    return save_compressed_tensors(tmp_path_factory.mktemp("ct_w4a16") / "m", "w4a16", "llama", group_size=128,
                                   **SMALL_LLAMA)


def test_w4a16_loaded_as_gptq_at_tp4_raises_on_every_rank_within_seconds(ct_w4a16):
    s = ct_w4a16.spec
    prefix = "model.layers.0.self_attn.o_proj"
    assert s.q_size == 256  # two groups of 128
    results = launcher.run(4, strict_checks.load_row, str(ct_w4a16.folder), prefix, s.q_size, s.hidden_size, False,
                           "int4_gptq:g128")
    _check_every_rank(results, "ValueError", "RowParallelLinear.load_weights failed on every rank (4 of 4)",
                      f"no tensor '{prefix}.qweight'", "weight_packed")


@pytest.fixture(scope="module")
def ct_w8a8_bad_slice(tmp_path_factory):
    """A W8A8 checkpoint whose gate_proj weight_scale has a NaN in row 300 only: rank 2's
    slice at TP 4 (512 rows, 128 per rank). Written back with the safetensors package."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    ck = save_compressed_tensors(tmp_path_factory.mktemp("ct_w8a8") / "m", "w8a8", "llama", **SMALL_LLAMA)
    name = "model.layers.0.mlp.gate_proj.weight_scale"
    for path in ck.folder.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            if name not in f.keys():
                continue
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            metadata = f.metadata()
        tensors[name][300, 0] = float("nan")
        save_file(tensors, str(path), metadata=metadata)
        return ck
    raise AssertionError(f"{name} not found")


def test_a_bad_slice_only_one_rank_reads_raises_on_every_rank_naming_it(ct_w8a8_bad_slice):
    s = ct_w8a8_bad_slice.spec
    results = launcher.run(4, strict_checks.load_column, str(ct_w8a8_bad_slice.folder), "model.layers.0.mlp.gate_proj",
                           s.hidden_size, s.intermediate_size, False, "int8_w8a8")
    _check_every_rank(results, "ValueError", "ColumnParallelLinear.load_weights failed on rank 2 of 4",
                      "'model.layers.0.mlp.gate_proj.weight_scale'", "nan")


# ---------------------------------------------------------------------------------------
# Failure 6: files the safetensors format forbids
# ---------------------------------------------------------------------------------------

def _patch_length(path, delta):
    data = bytearray(path.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    data[:8] = struct.pack("<Q", n + delta)
    path.write_bytes(bytes(data))


def test_a_header_length_one_byte_short_is_refused_like_the_python_package_does(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"w": torch.tensor([0.0, 1.0, 2.0, 3.0])}, str(path))
    assert torch.equal(tp.open_checkpoint(str(path))["w"], torch.tensor([0.0, 1.0, 2.0, 3.0]))
    _patch_length(path, -1)
    with pytest.raises(Exception):
        with safe_open(str(path), framework="pt") as f:
            f.get_tensor("w")
    with pytest.raises(ValueError, match=r"belong to no tensor.*header length") as info:
        tp.open_checkpoint(str(path))
    assert str(path) in str(info.value) and "file bytes" in str(info.value)


def test_invalid_utf8_in_a_name_is_refused_at_open_not_later(tmp_path):
    path = tmp_path / "bad.safetensors"
    header = b'{"w\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x01")
    with pytest.raises(ValueError, match="UTF-8") as info:
        tp.open_checkpoint(str(path))
    assert "at byte 11" in str(info.value)


# ---------------------------------------------------------------------------------------
# LoadSession: what no layer read is reported, on every rank
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_float_checkpoint(tmp_path_factory.mktemp("llama") / "m", "llama", dtype=torch.float64,
                                 **SMALL_LLAMA)


@pytest.mark.parametrize("world", [1, 2])
def test_a_load_session_over_a_whole_model_reports_what_nothing_read(llama, world):
    s = llama.spec
    spec = dict(head_dim=s.head_dim, heads=s.num_attention_heads, kv_heads=s.num_key_value_heads,
                hidden=s.hidden_size, intermediate=s.intermediate_size, layers=s.num_hidden_layers)
    everything = launcher.run(world, strict_checks.load_session_llama, str(llama.folder), spec, [])
    for res in everything:
        assert res["error"] is None, res["error"]
        assert res["unread"] == []
    missed = launcher.run(world, strict_checks.load_session_llama, str(llama.folder), spec, ["lm_head.weight"])
    needles = ["LoadSession", "'lm_head.weight'", "allow_unread"]
    if world > 1:
        needles.append(f"every rank ({world} of {world})")
    _check_every_rank(missed, "ValueError", *needles)


def test_load_session_in_one_process():
    ckpt = tp.Checkpoint({"fc.weight": torch.randn(4, 8), "fc.lora_A.weight": torch.randn(2, 8),
                          "x.rotary_emb.inv_freq": torch.ones(4)})
    layer = tp.ColumnParallelLinear(8, 4, bias=False)
    with pytest.raises(ValueError, match=r"'fc.lora_A.weight' would be ignored"):
        layer.load_weights(ckpt, "fc")
    session = tp.LoadSession(ckpt, allow_unread=["*.lora_*"])
    layer.load_weights(session, "fc")
    assert session.unread() == ["x.rotary_emb.inv_freq"]  # the explicit list replaces the default
    with pytest.raises(ValueError, match="x.rotary_emb.inv_freq"):
        session.finish()
    w = torch.randn(4, 8)
    with tp.LoadSession({"fc.weight": w, "x.rotary_emb.inv_freq": torch.ones(4)}) as s2:  # default allow list
        layer.load_weights(s2, "fc")
    assert s2.read() == ["fc.weight"]
    assert torch.equal(layer.weight, w)
    with pytest.raises(ValueError, match="'extra'"):  # finish() on leaving the block
        with tp.LoadSession({"fc.weight": w, "extra": torch.ones(1)}) as s3:
            layer.load_weights(s3, "fc")
    with pytest.raises(KeyError):
        ckpt["nope"]


@pytest.mark.parametrize("world", [1, 2])
def test_expect_filled_names_a_parameter_no_load_wrote_on_every_rank(world):
    filled = launcher.run(world, strict_checks.expect_filled_layer, True)
    for res in filled:
        assert res["error"] is None, res["error"]
        assert res["before"] == ["weight", "bias"] and res["after"] == []
    missed = launcher.run(world, strict_checks.expect_filled_layer, False)
    for res in missed:
        assert res["after"] == ["bias"]
    needles = ["'bias'"] + ([f"every rank ({world} of {world})"] if world > 1 else [])
    _check_every_rank(missed, "ValueError", *needles)
