#pragma once
// tp-bench's block (layer_bench.cpp): its four TP layers on one rank, the inputs every
// row starts from, and the single-device reference each rank's output is checked
// against (the float64 model of what the layers are specified to compute).

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_checkpoint.h"
#include "layer_bench.h"
#include "tp/tp.h"

namespace tp::bench {

// Inputs of one token count M: the activations every row starts from (global, CPU).
struct Inputs {
  at::Tensor hidden;  // [M, hidden]: input of qkv, gate_up and the block
  at::Tensor attn;    // [M, heads * head_dim]: input of o (global; each rank takes its heads)
  at::Tensor inter;   // [M, intermediate]: input of down (global; each rank takes its slice)
};

Inputs make_inputs(const BlockShape& s, int64_t m, c10::ScalarType dtype, uint64_t seed);

struct Layers {
  QKVParallelLinear qkv{nullptr};
  RowParallelLinear o{nullptr};
  GateUpParallelLinear gate_up{nullptr};
  RowParallelLinear down{nullptr};

  Layers(const BlockShape& s, const QuantConfig& quant, c10::ScalarType dtype, c10::Device device,
         const Communicator& comm, const Checkpoint& ckpt, Numerics numerics = Numerics::kAuto) {
    qkv = QKVParallelLinear(QKVParallelLinearOptions(s.hidden, s.head_dim, s.heads, s.kv_heads)
                                .quant(quant)
                                .dtype(dtype)
                                .device(device)
                                .numerics(numerics),
                            comm);
    o = RowParallelLinear(RowParallelLinearOptions(s.heads * s.head_dim, s.hidden)
                              .bias(false)
                              .quant(quant)
                              .split(qkv->attention_output_split())
                              .dtype(dtype)
                              .device(device)
                              .numerics(numerics),
                          comm);
    // gate_up splits the intermediate dim as a column layer and down as a row layer;
    // one granularity for both keeps their slices equal whatever the formats' alignments.
    const auto split = SplitPolicy{}.with_granularity(s.intermediate % 128 == 0 ? 128 : 1);
    gate_up = GateUpParallelLinear(GateUpParallelLinearOptions(s.hidden, s.intermediate)
                                       .quant(quant)
                                       .split(split)
                                       .dtype(dtype)
                                       .device(device)
                                       .numerics(numerics),
                                   comm);
    down = RowParallelLinear(RowParallelLinearOptions(s.intermediate, s.hidden)
                                 .bias(false)
                                 .quant(quant)
                                 .split(split)
                                 .dtype(dtype)
                                 .device(device)
                                 .numerics(numerics),
                             comm);
    TORCH_CHECK(gate_up->local_range() == down->local_range(), "tp-bench: gate_up's intermediate slice ",
                gate_up->local_range(), " differs from down's ", down->local_range());
    qkv->load_weights(ckpt, kAttn);
    o->load_weights(ckpt, kO);
    gate_up->load_weights(ckpt, kMlp);
    down->load_weights(ckpt, kDown);
  }

  int64_t bytes() const {
    int64_t total = 0;
    auto add = [&](const torch::nn::Module& m) {
      for (const auto& p : m.parameters()) total += p.numel() * p.element_size();
      for (const auto& b : m.buffers()) total += b.numel() * b.element_size();
    };
    add(*qkv), add(*o), add(*gate_up), add(*down);
    return total;
  }

  void set_reduce(bool reduce, AllReduceStrategy strategy) {
    o->options.reduce_output(reduce).all_reduce(strategy);
    down->options.reduce_output(reduce).all_reduce(strategy);
  }
};

// This rank's inputs (on the device): its heads of attn, its slice of inter.
struct RankInputs {
  at::Tensor hidden, attn, inter;
};

RankInputs rank_inputs(const Inputs& in, const Layers& l, c10::Device device);

at::Tensor forward(const std::string& row, Layers& l, const RankInputs& in);

// This rank's part of a global output (column layers: its segments; the others: all).
at::Tensor rank_part(const std::string& row, const Layers& l, const BlockShape& s, const at::Tensor& y);

// ---- the single-device reference ----------------------------------------------------------------

// Timing: format none runs at::linear on the full weights (in the dtype under test);
// a quantized format runs its own layers on one device (world 1) from the same
// checkpoint. Expected output (float64, CPU): at::linear on the full weights, or on
// dequantize_weight of the stored tensors with quantize_activation of the input (what
// the format's kernel computes, exactly).
// How a TP run splits the row layers' input dimension (o, down): every rank's range.
// Empty (TP 1, or not yet known): one slice, the whole input.
struct RowSplits {
  std::vector<Range> o, down;
};

struct Reference {
  QuantConfig quant;
  bool quantized = false;
  at::Tensor w_qkv, w_o, w_gate_up, w_down;     // [out, in] full, dtype under test, on the device
  at::Tensor w_q;                               // the Q rows of w_qkv
  std::unique_ptr<Layers> layers;               // quantized formats
  QuantizedTensors tq, tk, tv, to, tg, tu, td;  // quantized formats: stored tensors per layer

  at::Tensor forward(const std::string& row, const Inputs& in_dev) const {
    if (quantized) {
      RankInputs ri{in_dev.hidden, in_dev.attn, in_dev.inter};
      return tp::bench::forward(row, *layers, ri);
    }
    return linear_chain(row, in_dev, w_qkv, w_q, w_o, w_gate_up, w_down);
  }

  // The expected output of `row` for every M, in float64 on the CPU. Only the weights
  // the row uses are widened, once for all M (a Llama-3-70B gate_up is 3.8 GB in float64).
  // Quantized formats at TP > 1 pass the run's `splits`: a row layer's ranks each
  // quantize their own slice of its input (a per-token scale over that slice).
  std::map<int64_t, at::Tensor> expected(const std::string& row, const std::map<int64_t, Inputs>& inputs,
                                         const RowSplits& splits = {}) const {
    std::map<int64_t, at::Tensor> out;
    if (quantized) {
      for (const auto& [m, in] : inputs) out[m] = quantized_chain(row, in, splits);
      return out;
    }
    auto f64 = [](const at::Tensor& t) { return t.cpu().to(at::kDouble); };
    const bool block = row == "block";
    auto need = [&](const at::Tensor& w, bool used) { return used ? f64(w) : at::Tensor(); };
    const auto qkv = need(w_qkv, block || row == "qkv"), o = need(w_o, block || row == "o");
    const auto gate_up = need(w_gate_up, block || row == "gate_up"), down = need(w_down, block || row == "down");
    for (const auto& [m, in] : inputs) {
      Inputs d{f64(in.hidden), f64(in.attn), f64(in.inter)};
      out[m] = linear_chain(row, d, qkv, w_q, o, gate_up, down);
    }
    return out;
  }

  static at::Tensor linear_chain(const std::string& row, const Inputs& in, const at::Tensor& qkv, const at::Tensor& q,
                                 const at::Tensor& o, const at::Tensor& gate_up, const at::Tensor& down) {
    if (row == "qkv") return at::linear(in.hidden, qkv);
    if (row == "o") return at::linear(in.attn, o);
    if (row == "gate_up") return at::linear(in.hidden, gate_up);
    if (row == "down") return at::linear(in.inter, down);
    // The block as one device runs it: the whole QKV GEMM, then Q onwards.
    const auto y_qkv = at::linear(in.hidden, qkv);
    const auto h = at::linear(y_qkv.narrow(-1, 0, q.size(0)), o);
    const auto gu = at::linear(h, gate_up);
    const int64_t inter = gu.size(-1) / 2;
    return at::linear(at::silu(gu.narrow(-1, 0, inter)) * gu.narrow(-1, inter, inter), down);
  }

  // One quantized GEMM in float64: quantize_activation(x) [dequantize_weight(W)]^T.
  at::Tensor qlinear(const at::Tensor& x, const QuantizedTensors& t) const {
    return at::linear(quantize_activation(x.cpu(), t, quant).to(at::kDouble),
                      dequantize_weight(t, quant).to(at::kDouble));
  }

  // A row layer as its ranks run it: each its slice of x, quantized on its own, its
  // partial output in x's dtype (what the layer hands the AllReduce), summed.
  at::Tensor qlinear_rows(const at::Tensor& x, const QuantizedTensors& t, const std::vector<Range>& slices) const {
    if (slices.size() <= 1) return qlinear(x, t);
    const auto w = dequantize_weight(t, quant).to(at::kDouble);
    const auto xc = x.cpu();
    at::Tensor y = at::zeros({xc.size(0), w.size(0)}, at::kDouble);
    for (const auto& r : slices) {
      if (r.empty()) continue;
      const auto xq = quantize_activation(xc.narrow(-1, r.begin, r.size()).contiguous(), t, quant);
      y += at::linear(xq.to(at::kDouble), w.narrow(1, r.begin, r.size())).to(x.scalar_type()).to(at::kDouble);
    }
    return y;
  }

  at::Tensor quantized_chain(const std::string& row, const Inputs& in, const RowSplits& splits) const {
    if (row == "qkv") return at::cat({qlinear(in.hidden, tq), qlinear(in.hidden, tk), qlinear(in.hidden, tv)}, -1);
    if (row == "o") return qlinear_rows(in.attn, to, splits.o);
    if (row == "gate_up") return at::cat({qlinear(in.hidden, tg), qlinear(in.hidden, tu)}, -1);
    if (row == "down") return qlinear_rows(in.inter, td, splits.down);
    // The block as its layers are specified to run it: each layer's output in the dtype
    // under test (the layers return it so), which the next layer's activation
    // quantization then reads; SiLU(gate) * up in that dtype too (forward() above). A
    // chain kept in float64 would hand the next quantizer values a rounding away from the
    // layer's, and an activation code one step off is a whole FP8 / INT8 step of error.
    const auto dt = in.hidden.scalar_type();
    const auto out = [&](const at::Tensor& x, const QuantizedTensors& t) { return qlinear(x, t).to(dt); };
    const auto h = qlinear_rows(out(in.hidden, tq), to, splits.o).to(dt);
    return qlinear_rows(at::silu(out(h, tg)) * out(h, tu), td, splits.down);
  }
};

Reference make_reference(const BenchConfig& config, const std::string& format, c10::ScalarType dtype,
                         const Checkpoint& ckpt);

}  // namespace tp::bench
