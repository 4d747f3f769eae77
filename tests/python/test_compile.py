"""tp under PyTorch's compiler stack (torch.ops.tp.*, tp/ops.py): opcheck of every
operator at TP 1 and 2, the example block compiled with fullgraph=True equal to eager
(forward and every gradient) at TP 1-4, torch.export of a layer and of the block."""

import pytest
import torch

import compile_checks
import launcher
import tp

# Compiled vs eager, relative to the largest value. aot_eager runs the same kernels in
# the same order as eager: bitwise. Inductor fuses the norms, RoPE and residuals into
# its own loops (float32 accumulation for bf16): float32 to rounding, bf16 within the
# bound tp-bench holds bf16 layers to (benchmarks/layer_bench.cpp error_bound).
BOUND = {"aot_eager": 0.0, ("inductor", torch.float32): 1e-5, ("inductor", torch.bfloat16): 3e-2}


def _bound(backend, dtype):
    return BOUND["aot_eager"] if backend == "aot_eager" else BOUND[(backend, dtype)]


def test_every_op_passes_opcheck_at_tp1():
    checked = compile_checks.opcheck_every_op(0, 1)
    assert len(checked) == 22, checked


def test_every_op_passes_opcheck_with_a_process_group_at_tp2():
    results = launcher.run(2, compile_checks.opcheck_every_op)
    assert results[0] == results[1] and len(results[0]) == 22


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_compiled_block_equals_eager_at_every_tp_size(world):
    # float64 and bf16, unquantized and W8A8, through Dynamo + AOTAutograd (aot_eager):
    # one graph, no break, the same bits as eager for the output and every gradient.
    cases = [(torch.float64, None), (torch.bfloat16, None), (torch.float64, "int8_w8a8"), (torch.bfloat16, "int8_weight_only")]
    results = launcher.run(world, compile_checks.compiled_block_cases, cases, "aot_eager")
    for rank, errors in enumerate(results):
        for (dtype, quant), err in zip(cases, errors):
            assert err == 0.0, f"rank {rank} {dtype} {quant}: compiled differs from eager by {err:.3g} (relative)"


@pytest.mark.parametrize("world", [1, 2])
def test_inductor_compiled_block_is_within_bound(world):
    cases = [(torch.float32, None), (torch.bfloat16, "int8_w8a8")]
    results = launcher.run(world, compile_checks.compiled_block_cases, cases, "inductor")
    for rank, errors in enumerate(results):
        for (dtype, quant), err in zip(cases, errors):
            assert err <= _bound("inductor", dtype), f"rank {rank} {dtype} {quant}: {err:.3g}"


@pytest.mark.parametrize("world", [1, 2, 3])
def test_exported_layer_and_block_give_the_eager_output(world):
    assert launcher.run(world, compile_checks.export_matches_eager, torch.float32) == [True] * world


@pytest.mark.parametrize("world", [1, 3])
def test_compiled_vocab_parallel_loss_equals_eager(world):
    assert launcher.run(world, compile_checks.compiled_loss_matches_eager) == [True] * world


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import hf_fixtures

    return hf_fixtures.folder_for_tests(tmp_path_factory, ("llama", "qwen2", "qwen3"))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_compiled_causal_lm_equals_eager(folder, world):
    # Llama (biases, Llama-3 RoPE), Qwen2 (tied embeddings), Qwen3 (q/k norms), float64.
    names = ("llama", "qwen2", "qwen3")
    results = launcher.run(world, compile_checks.compiled_causal_lm_matches_eager, str(folder), names,
                           torch.float64, timeout=600)
    for rank, res in enumerate(results):
        for name in names:
            if world == 3 and name == "qwen3":  # 2 KV heads over 3 ranks: refused (test_causal_lm.py)
                assert res[name].startswith("refused"), res[name]
            else:
                assert res[name] == "ok", f"rank {rank} {name}: {res[name]}"


def test_causal_lm_children_are_tp_modules(folder):
    model = tp.CausalLM.from_pretrained(f"{folder}/qwen3", dtype=torch.float64)
    text = repr(model)
    for child in ("(embed_tokens): VocabParallelEmbedding(", "(qkv): QKVParallelLinear(", "(o_proj): RowParallelLinear(",
                  "(gate_up): GateUpParallelLinear(", "(q_norm): Norm(", "(lm_head): ParallelLMHead("):
        assert child in text, text
    assert "Module()" not in text, text
    seen = []
    model.layers[1].qkv.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    assert seen and seen[0][:2] == (1, 3), seen

