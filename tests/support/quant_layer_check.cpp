#include "support/quant_layer_check.h"

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <map>

#include "support/loader_test_util.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/safetensors_writer.h"
#include "tp/quant/quantize.h"

namespace tp::test {

at::Tensor random_weight(int64_t out, int64_t in, uint64_t seed) {
  // Row magnitudes spread over ~2 decades: per-channel formats must keep them apart.
  const auto rows = at::exp(randn({out, 1}, seed ^ 0x5eedULL));
  return randn({out, in}, seed) * rows / std::sqrt(static_cast<double>(in));
}

namespace {

// One projection of the checkpoint: its stored tensors and its float64 reference weight.
struct Projection {
  QuantizedTensors stored;
  at::Tensor weight;  // dequantized, float64 [out, in]
  at::Tensor bias;    // in the layer dtype, or undefined
};

class Case {
 public:
  explicit Case(const QuantCheck& check) : check_(check) {}

  // Adds "<prefix>.<suffix>" tensors for a random [out, in] projection.
  const Projection& add(const std::string& prefix, int64_t out, int64_t in) {
    const uint64_t seed = check_.seed * 1000 + projections_.size();
    Projection p;
    p.stored = quantize_weight(random_weight(out, in, seed), check_.config);
    p.weight = dequantize_weight(p.stored, check_.config).to(at::kDouble);
    if (check_.bias) p.bias = randn({out}, seed + 500).to(check_.dtype);
    for (const auto& [suffix, t] : p.stored) tensors_[prefix + "." + suffix] = t;
    if (check_.bias) tensors_[prefix + ".bias"] = p.bias;
    return projections_.emplace(prefix, std::move(p)).first->second;
  }

  // The checkpoint, in memory or (from_file) written to a safetensors file and reopened.
  Checkpoint checkpoint(const std::string& file_dir) const {
    if (!check_.from_file) {
      Checkpoint ckpt;
      for (const auto& [name, t] : tensors_) ckpt.add(name, t);
      return ckpt;
    }
    const std::string path = file_dir + "/model.safetensors";
    save_safetensors(path, tensors_);
    return open_checkpoint(path);
  }

  // float64 reference of x through the listed projections, concatenated along the output.
  at::Tensor reference(const at::Tensor& x, const std::vector<std::string>& prefixes) const {
    std::vector<at::Tensor> outs;
    for (const auto& prefix : prefixes) {
      const auto& p = projections_.at(prefix);
      const auto xq = quantize_activation(x, p.stored, check_.config).to(at::kDouble);
      auto y = at::matmul(xq, p.weight.t());
      if (p.bias.defined()) y = y + p.bias.to(at::kDouble);
      outs.push_back(y);
    }
    return at::cat(outs, -1);
  }

 private:
  const QuantCheck& check_;
  std::map<std::string, Projection> projections_;
  std::map<std::string, at::Tensor> tensors_;
};

void expect_close(const std::string& what, const std::vector<at::Tensor>& outputs, const at::Tensor& reference,
                  const QuantCheck& check) {
  for (size_t r = 0; r < outputs.size(); ++r) {
    INFO(what << " rank " << r << "/" << outputs.size() << " format " << to_string(check.config) << " dtype "
              << check.dtype << (check.from_file ? " (from file)" : ""));
    REQUIRE(outputs[r].defined());
    CHECK(outputs[r].scalar_type() == check.dtype);
    REQUIRE(outputs[r].sizes() == reference.sizes());
    const double err = relative_error(outputs[r], reference);
    INFO("relative error " << err << ", tolerance " << check.tolerance);
    CHECK(err <= check.tolerance);
  }
}

}  // namespace

void check_quant_layers(const QuantCheck& check) {
  const auto& s = check.shapes;
  Case c(check);
  c.add("col", s.out, s.in);
  c.add("row", s.out, s.in);
  c.add("attn.q_proj", s.heads * s.head_dim, s.hidden);
  c.add("attn.k_proj", s.kv_heads * s.head_dim, s.hidden);
  c.add("attn.v_proj", s.kv_heads * s.head_dim, s.hidden);
  c.add("mlp.gate_proj", s.intermediate, s.hidden);
  c.add("mlp.up_proj", s.intermediate, s.hidden);
  TempDir dir;
  const Checkpoint ckpt = c.checkpoint(dir.str());

  const auto x_in = randn({s.tokens, s.in}, check.seed + 7).to(check.dtype);
  const auto x_hidden = randn({s.tokens, s.hidden}, check.seed + 8).to(check.dtype);
  const auto ref_col = c.reference(x_in, {"col"});
  const auto ref_row = c.reference(x_in, {"row"});
  const auto ref_qkv = c.reference(x_hidden, {"attn.q_proj", "attn.k_proj", "attn.v_proj"});
  const auto ref_gate_up = c.reference(x_hidden, {"mlp.gate_proj", "mlp.up_proj"});

  for (int64_t world : check.worlds) {
    std::vector<at::Tensor> col(world), row(world), qkv(world), gate_up(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          const auto r = comm.rank();
          ColumnParallelLinear column(ColumnParallelLinearOptions(s.in, s.out)
                                          .bias(check.bias)
                                          .gather_output(true)
                                          .dtype(check.dtype)
                                          .device(check.device)
                                          .quant(check.config),
                                      comm);
          column->load_weights(ckpt, "col");
          col[r] = column->forward(x_in.to(check.device)).cpu();

          RowParallelLinear rowl(RowParallelLinearOptions(s.in, s.out)
                                     .bias(check.bias)
                                     .input_is_parallel(false)
                                     .dtype(check.dtype)
                                     .device(check.device)
                                     .quant(check.config),
                                 comm);
          rowl->load_weights(ckpt, "row");
          row[r] = rowl->forward(x_in.to(check.device)).cpu();

          QKVParallelLinear q(QKVParallelLinearOptions(s.hidden, s.head_dim, s.heads, s.kv_heads)
                                  .bias(check.bias)
                                  .gather_output(true)
                                  .dtype(check.dtype)
                                  .device(check.device)
                                  .quant(check.config),
                              comm);
          q->load_weights(ckpt, "attn");
          qkv[r] = q->forward(x_hidden.to(check.device)).cpu();

          GateUpParallelLinear g(GateUpParallelLinearOptions(s.hidden, s.intermediate)
                                     .bias(check.bias)
                                     .gather_output(true)
                                     .dtype(check.dtype)
                                     .device(check.device)
                                     .quant(check.config),
                                 comm);
          g->load_weights(ckpt, "mlp");
          gate_up[r] = g->forward(x_hidden.to(check.device)).cpu();
        },
        test_comm_options());
    expect_close("ColumnParallelLinear world " + std::to_string(world), col, ref_col, check);
    expect_close("RowParallelLinear world " + std::to_string(world), row, ref_row, check);
    expect_close("QKVParallelLinear world " + std::to_string(world), qkv, ref_qkv, check);
    expect_close("GateUpParallelLinear world " + std::to_string(world), gate_up, ref_gate_up, check);
  }
}

}  // namespace tp::test
