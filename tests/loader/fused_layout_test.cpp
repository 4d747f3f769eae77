// Declared fused layouts: the same weights written as separate q/k/v, one [Q|K|V]
// tensor, or Megatron's per-KV-group interleaving (and gate/up separate or fused)
// load into identical layers at TP 1-4, from safetensors files; each rank reads
// only its rows; a layout that does not fit the shapes is an error, and one that fits
// them but is wrong (per-head read as contiguous) computes other heads.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <mutex>

#include "support/loader_test_util.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/safetensors_writer.h"

using namespace tp;
using Catch::Contains;
using test::randn;

namespace {

struct AttnShape {
  int64_t hidden, head_dim, heads, kv_heads;
};

// [for g: q rows of group g's heads, k head g, v head g]
at::Tensor interleave(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttnShape& s) {
  const int64_t group = s.heads / s.kv_heads, d = s.head_dim;
  std::vector<at::Tensor> blocks;
  for (int64_t g = 0; g < s.kv_heads; ++g) {
    blocks.push_back(q.narrow(0, g * group * d, group * d));
    blocks.push_back(k.narrow(0, g * d, d));
    blocks.push_back(v.narrow(0, g * d, d));
  }
  return at::cat(blocks, 0);
}

// Records every read, to check that a rank reads only its own rows.
class CountingSource final : public TensorSource {
 public:
  CountingSource(std::shared_ptr<const TensorSource> inner, int64_t* rows_read, std::mutex* mu)
      : inner_(std::move(inner)), rows_read_(rows_read), mu_(mu) {}
  const std::string& name() const override { return inner_->name(); }
  std::vector<int64_t> shape() const override { return inner_->shape(); }
  at::ScalarType dtype() const override { return inner_->dtype(); }
  at::Tensor read(int64_t dim, Range range) const override {
    std::lock_guard<std::mutex> lock(*mu_);
    *rows_read_ += dim == 0 ? range.size() : inner_->shape()[0];
    return inner_->read(dim, range);
  }

 private:
  std::shared_ptr<const TensorSource> inner_;
  int64_t* rows_read_;
  std::mutex* mu_;
};

}  // namespace

TEST_CASE("QKV layouts separate, fused and interleaved load identical layers at TP 1-4", "[loader][layers]") {
  const AttnShape shapes[] = {
      {32, 8, 4, 4},  // MHA
      {48, 8, 8, 2},  // GQA group 4; KV replicated at world 4
      {24, 4, 6, 3},  // GQA with 3 KV heads: uneven at world 2
      {16, 4, 4, 1},  // MQA: the KV head replicated on every rank
  };
  const QKVLayout layouts[] = {QKVLayout::kSeparate, QKVLayout::kFused, QKVLayout::kInterleavedGroups};
  uint64_t seed = 9000;
  for (const auto& s : shapes) {
    ++seed;
    const int64_t q_rows = s.heads * s.head_dim, kv_rows = s.kv_heads * s.head_dim;
    const auto q = randn({q_rows, s.hidden}, seed).to(at::kBFloat16),
               k = randn({kv_rows, s.hidden}, seed + 1).to(at::kBFloat16),
               v = randn({kv_rows, s.hidden}, seed + 2).to(at::kBFloat16);
    const auto qb = randn({q_rows}, seed + 3).to(at::kBFloat16), kb = randn({kv_rows}, seed + 4).to(at::kBFloat16),
               vb = randn({kv_rows}, seed + 5).to(at::kBFloat16);
    test::TempDir dir;
    save_safetensors(dir.file("separate.safetensors"), {{"attn.q_proj.weight", q},
                                                        {"attn.k_proj.weight", k},
                                                        {"attn.v_proj.weight", v},
                                                        {"attn.q_proj.bias", qb},
                                                        {"attn.k_proj.bias", kb},
                                                        {"attn.v_proj.bias", vb}});
    save_safetensors(dir.file("fused.safetensors"), {{"attn.qkv_proj.weight", at::cat({q, k, v}, 0)},
                                                     {"attn.qkv_proj.bias", at::cat({qb, kb, vb}, 0)}});
    save_safetensors(
        dir.file("interleaved.safetensors"),
        {{"attn.linear_qkv.weight", interleave(q, k, v, s)},
         {"attn.linear_qkv.bias", interleave(qb.unsqueeze(1), kb.unsqueeze(1), vb.unsqueeze(1), s).squeeze(1)}});
    const Checkpoint files[] = {open_checkpoint(dir.file("separate.safetensors")),
                                open_checkpoint(dir.file("fused.safetensors")),
                                open_checkpoint(dir.file("interleaved.safetensors"))};
    for (int64_t world = 1; world <= 4; ++world) {
      if (world > s.kv_heads && world % s.kv_heads != 0) continue;
      // Reference: separate tensors from memory, the path tested against at::linear elsewhere.
      std::vector<at::Tensor> ref_w(world), ref_b(world);
      Checkpoint mem;
      mem.add("attn.q_proj.weight", q), mem.add("attn.k_proj.weight", k), mem.add("attn.v_proj.weight", v);
      mem.add("attn.q_proj.bias", qb), mem.add("attn.k_proj.bias", kb), mem.add("attn.v_proj.bias", vb);
      const auto options =
          QKVParallelLinearOptions(s.hidden, s.head_dim, s.heads, s.kv_heads).bias(true).dtype(at::kBFloat16);
      run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            QKVParallelLinear qkv(options, comm);
            qkv->load_weights(mem, "attn");
            ref_w[comm.rank()] = qkv->weight.detach().clone();
            ref_b[comm.rank()] = qkv->bias.detach().clone();
          },
          test::test_comm_options());
      for (int li = 0; li < 3; ++li) {
        INFO("heads=" << s.heads << " kv=" << s.kv_heads << " head_dim=" << s.head_dim << " world=" << world
                      << " layout=" << to_string(layouts[li]) << " seed=" << seed);
        // Count the rows each layout reads: exactly the rank's own, never a whole tensor.
        std::mutex mu;
        int64_t rows_read = 0;
        Checkpoint counted;
        for (const auto& name : files[li].names()) {
          if (name.find("weight") != std::string::npos)
            counted.add(std::make_shared<CountingSource>(
                std::shared_ptr<const TensorSource>(std::shared_ptr<void>(), &files[li].get(name)), &rows_read, &mu));
          else
            counted.add(std::shared_ptr<const TensorSource>(std::shared_ptr<void>(), &files[li].get(name)));
        }
        std::vector<at::Tensor> got_w(world), got_b(world);
        int64_t local_rows_total = 0;
        run_ranks_in_threads(
            world,
            [&](Communicator& comm) {
              QKVParallelLinear qkv(options, comm);
              qkv->load_weights(
                  counted, "attn",
                  QKVCheckpointLayout()
                      .layout(layouts[li])
                      .fused_name(layouts[li] == QKVLayout::kInterleavedGroups ? "linear_qkv" : "qkv_proj"));
              got_w[comm.rank()] = qkv->weight.detach().clone();
              got_b[comm.rank()] = qkv->bias.detach().clone();
              std::lock_guard<std::mutex> lock(mu);
              local_rows_total += qkv->weight.size(0);
            },
            test::test_comm_options());
        for (int64_t r = 0; r < world; ++r) {
          INFO("rank " << r);
          CHECK(test::bit_equal(got_w[r], ref_w[r]));
          CHECK(test::bit_equal(got_b[r], ref_b[r]));
        }
        CHECK(rows_read == local_rows_total);
      }
    }
  }
}

TEST_CASE("gate/up layouts separate and fused load identical layers at TP 1-4", "[loader][layers]") {
  const int64_t hidden = 24, inter = 40;
  const auto gate = randn({inter, hidden}, 51).to(at::kFloat), up = randn({inter, hidden}, 52).to(at::kFloat);
  test::TempDir dir;
  save_safetensors(dir.file("separate.safetensors"), {{"mlp.gate_proj.weight", gate}, {"mlp.up_proj.weight", up}});
  save_safetensors(dir.file("fused.safetensors"), {{"mlp.gate_up_proj.weight", at::cat({gate, up}, 0)}});
  const auto separate = open_checkpoint(dir.file("separate.safetensors"));
  const auto fused = open_checkpoint(dir.file("fused.safetensors"));
  for (int64_t world = 1; world <= 4; ++world) {
    INFO("world=" << world);
    std::vector<at::Tensor> a(world), b(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          GateUpParallelLinear gu(GateUpParallelLinearOptions(hidden, inter).split(SplitPolicy{}.with_granularity(4)),
                                  comm);
          gu->load_weights(separate, "mlp");
          a[comm.rank()] = gu->weight.detach().clone();
          gu->load_weights(fused, "mlp", GateUpCheckpointLayout().layout(GateUpLayout::kFused));
          b[comm.rank()] = gu->weight.detach().clone();
        },
        test::test_comm_options());
    for (int64_t r = 0; r < world; ++r) {
      INFO("rank " << r);
      CHECK(at::equal(a[r], b[r]));
      const auto range = split_for_rank(inter, world, r, SplitPolicy{}.with_granularity(4), "intermediate");
      CHECK(at::equal(
          b[r], at::cat({gate.narrow(0, range.begin, range.size()), up.narrow(0, range.begin, range.size())}, 0)));
    }
  }
}

TEST_CASE("a fused tensor that does not fit the declared layout is an error naming layer, layout and shapes",
          "[loader][layers]") {
  // Declared GQA 8 q heads / 2 KV heads of 4: [Q|K|V] is 48 rows. The file holds 40 (MHA-like guess gone wrong).
  Checkpoint ckpt;
  ckpt.add("attn.qkv_proj.weight", randn({40, 16}, 1).to(at::kFloat));
  ckpt.add("mlp.gate_up_proj.weight", randn({30, 16}, 2).to(at::kFloat));
  QKVParallelLinear qkv(QKVParallelLinearOptions(16, 4, 8, 2));
  for (auto layout : {QKVLayout::kFused, QKVLayout::kInterleavedGroups}) {
    INFO(to_string(layout));
    REQUIRE_THROWS_WITH(qkv->load_weights(ckpt, "attn", QKVCheckpointLayout().layout(layout)),
                        Contains("QKVParallelLinear") && Contains(to_string(layout)) &&
                            Contains("'attn.qkv_proj.weight' has shape [40, 16]") && Contains("expected [48, 16]"));
  }
  REQUIRE_THROWS_WITH(
      qkv->load_weights(ckpt, "attn", QKVCheckpointLayout().layout(QKVLayout::kFused).fused_name("qkv")),
      Contains("no tensor 'attn.qkv.weight'"));
  GateUpParallelLinear gu(GateUpParallelLinearOptions(16, 16));
  REQUIRE_THROWS_WITH(gu->load_weights(ckpt, "mlp", GateUpCheckpointLayout().layout(GateUpLayout::kFused)),
                      Contains("GateUpParallelLinear") && Contains("fused [gate|up]") && Contains("[30, 16]") &&
                          Contains("expected [32, 16]"));
}

TEST_CASE("a per-head interleaved QKV declared contiguous loads but computes other heads: the declaration decides",
          "[loader][layers]") {
  // GPT-NeoX's query_key_value: [q_h | k_h | v_h] per head, the grouped layout with one
  // query head per group. Read as [Q | K | V] the shapes agree, so nothing can refuse it;
  // what shows the difference is the output. Declared right, every rank computes exactly
  // its heads, and gather_weights writes the tensor back as the file holds it.
  const AttnShape s{24, 4, 6, 6};
  const auto q = randn({24, 24}, 11).to(at::kFloat), k = randn({24, 24}, 12).to(at::kFloat);
  const auto v = randn({24, 24}, 13).to(at::kFloat), x = randn({5, 24}, 14).to(at::kFloat);
  const auto fused = interleave(q, k, v, s);
  Checkpoint ckpt;
  ckpt.add("attention.query_key_value.weight", fused);
  const auto per_head = QKVCheckpointLayout().layout(QKVLayout::kInterleavedGroups).fused_name("query_key_value");
  const auto contiguous = QKVCheckpointLayout().layout(QKVLayout::kFused).fused_name("query_key_value");
  for (int64_t world = 1; world <= 4; ++world) {
    INFO("TP " << world);
    std::mutex mu;
    double right = 0, wrong = 0;
    bool gathered = true;
    run_ranks_in_threads(world, [&](Communicator& comm) {
      QKVParallelLinear good(QKVParallelLinearOptions(24, 4, 6, 6).bias(false), comm);
      QKVParallelLinear bad(QKVParallelLinearOptions(24, 4, 6, 6).bias(false), comm);
      good->load_weights(ckpt, "attention", per_head);
      bad->load_weights(ckpt, "attention", contiguous);  // loads: the shapes agree
      const auto& heads = good->head_plan().q_heads;
      const auto rows = [&](const at::Tensor& w) { return w.narrow(0, heads.begin * 4, heads.size() * 4); };
      const auto want = at::cat({at::linear(x, rows(q)), at::linear(x, rows(k)), at::linear(x, rows(v))}, -1);
      const double r = (good->forward(x) - want).abs().max().item<double>();
      const double w = (bad->forward(x) - want).abs().max().item<double>();
      const auto back = good->gather_weights("attention", per_head);
      std::lock_guard<std::mutex> lock(mu);
      right = std::max(right, r);
      wrong = std::max(wrong, w);
      gathered = gathered && at::equal(back.at("attention.query_key_value.weight"), fused);
    });
    CHECK(right <= 1e-5);
    CHECK(wrong > 0.1);
    CHECK(gathered);
  }
}
