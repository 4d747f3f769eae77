// MoEParallelMLP's loading: the fused 3-D expert layouts (transformers 5's [E, 2I, H], GPT-OSS's
// transposed and interleaved [E, H, 2I]) load what the per-expert layout loads, from memory and
// from a safetensors file, and gather back to their own tensors; each rank reads only its
// experts' slices (bytes counted per rank), at every split of 1-4 ranks (moe_fixtures.h).

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <thread>

#include "layers/moe/moe_fixtures.h"
#include "support/loader_test_util.h"
#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/safetensors_writer.h"

using namespace tp;
using namespace tp::test::moe;
using test::randn;

TEST_CASE("fused 3-D expert layouts load what the per-expert layout loads and gather back to themselves",
          "[layers][moe][loader]") {
  for (const bool gpt_oss : {false, true}) {
    const Spec spec = specs()[gpt_oss ? 3 : 0];
    INFO(spec.name << " layout");
    const Weights w = make_weights(spec, 2000);
    const Checkpoint per_expert = per_expert_checkpoint(w), fused = fused_checkpoint(w, gpt_oss);
    const auto layout =
        MoECheckpointLayout().experts(ExpertLayout::kFused).interleaved_gate_up(gpt_oss).transposed(gpt_oss);
    const at::Tensor x = randn({kTokens, kHidden}, 7);
    // The same tensors in a safetensors file: its parts and transposed experts are copied
    // from views of the mapped file (TensorSource::view_region), not from a read.
    test::TempDir dir;
    std::map<std::string, at::Tensor> tensors;
    for (const auto& name : fused.names()) tensors[name] = fused.get(name).read_all();
    save_safetensors(dir.file("fused.safetensors"), tensors);
    const Checkpoint from_file = open_checkpoint(dir.file("fused.safetensors"));
    for (const auto& [world, ep] : kSplits) {
      INFO("world " << world << ", expert_parallel_size " << ep);
      std::mutex mu;
      run_ranks_in_threads(world, [&](Communicator& comm) {
        MoEParallelMLP a(options_of(spec).expert_parallel_size(ep), comm),
            b(options_of(spec).expert_parallel_size(ep), comm), c(options_of(spec).expert_parallel_size(ep), comm);
        a->load_weights(per_expert, "moe");
        b->load_weights(fused, "moe", layout);
        c->load_weights(from_file, "moe", layout);
        at::NoGradGuard no_grad;
        const at::Tensor ya = a->forward(x), yb = b->forward(x);
        const auto back = b->gather_weights("moe", layout);
        std::lock_guard<std::mutex> lock(mu);
        const auto pa = a->named_parameters(), pb = b->named_parameters();
        REQUIRE(pa.size() == pb.size());
        const auto pc = c->named_parameters();
        for (const auto& p : pa) CHECK(at::equal(p.value(), pb[p.key()]));
        for (const auto& p : pa) CHECK(at::equal(p.value(), pc[p.key()]));
        CHECK(at::equal(ya, yb));
        for (const auto& name : fused.names()) {
          INFO(name);
          REQUIRE(back.count(name));
          CHECK(at::equal(back.at(name), fused.get(name).read_all()));
        }
        CHECK(back.size() == fused.size());
      });
    }
  }
}

namespace {

// Counts the bytes of what read() and read_region() return, per reading thread (a rank).
class CountingSource final : public TensorSource {
 public:
  CountingSource(std::shared_ptr<const TensorSource> inner, std::map<std::thread::id, int64_t>* bytes, std::mutex* mu)
      : inner_(std::move(inner)), bytes_(bytes), mu_(mu) {}
  const std::string& name() const override { return inner_->name(); }
  std::vector<int64_t> shape() const override { return inner_->shape(); }
  at::ScalarType dtype() const override { return inner_->dtype(); }
  at::Tensor read(int64_t dim, Range range) const override { return count(inner_->read(dim, range)); }
  at::Tensor read_region(const std::vector<Range>& region) const override { return count(inner_->read_region(region)); }

 private:
  at::Tensor count(at::Tensor t) const {
    std::lock_guard<std::mutex> lock(*mu_);
    (*bytes_)[std::this_thread::get_id()] += static_cast<int64_t>(t.nbytes());
    return t;
  }
  std::shared_ptr<const TensorSource> inner_;
  std::map<std::thread::id, int64_t>* bytes_;
  std::mutex* mu_;
};

}  // namespace

TEST_CASE("each rank reads only its experts, and only its slices of them, in either layout", "[layers][moe][loader]") {
  // Bytes read per rank, exactly: the router (mirrored) and, of every expert it holds,
  // its rows of gate and up and its columns of down (the biases' too).
  const Spec spec = specs()[3];  // with expert biases
  const Weights w = make_weights(spec, 5000);
  std::mutex mu;
  for (const bool fused : {false, true}) {
    const Checkpoint plain = fused ? fused_checkpoint(w, true) : per_expert_checkpoint(w);
    const auto layout =
        fused ? MoECheckpointLayout().experts(ExpertLayout::kFused).interleaved_gate_up(true).transposed(true)
              : MoECheckpointLayout();
    for (const auto& [world, ep] : kSplits) {
      INFO((fused ? "fused" : "per expert") << " world " << world << ", expert_parallel_size " << ep);
      std::map<std::thread::id, int64_t> bytes;
      Checkpoint counted;
      for (const auto& name : plain.names())
        counted.add(std::make_shared<CountingSource>(
            std::shared_ptr<const TensorSource>(&plain.get(name), [](const TensorSource*) {}), &bytes, &mu));
      std::vector<int64_t> want(static_cast<size_t>(world)), got(static_cast<size_t>(world));
      run_ranks_in_threads(world, [&](Communicator& comm) {
        MoEParallelMLP moe(options_of(spec).expert_parallel_size(ep), comm);
        moe->load_weights(counted, "moe", layout);
        const int64_t r = moe->local_range().size(), experts = moe->local_experts().size();
        const int64_t per_expert = 3 * r * kHidden + 2 * r + kHidden;  // gate, up rows, down columns; biases
        std::lock_guard<std::mutex> lock(mu);
        want[static_cast<size_t>(comm.rank())] = 8 * (kExperts * kHidden + kExperts + experts * per_expert);
        got[static_cast<size_t>(comm.rank())] = bytes[std::this_thread::get_id()];
      });
      CHECK(got == want);
    }
  }
}
