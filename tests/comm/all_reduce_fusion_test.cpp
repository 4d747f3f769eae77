// Communicator::all_reduce_fusion (the layer boundary in one collective) against the
// unfused path the layers take without it - all_reduce, then bias, residual and norm as
// tensor operations, then the per-token quantizer - for every strategy at TP 1-4,
// float32 and bfloat16, token counts that do not divide by the world size and a hidden
// size that is not a power of two; and its failures, which reach every rank at once.
// (That its quantizer is bit for bit quant's quantize_activation is tested in
// tests/models/fused_boundary_test.cpp, where quant is visible.)

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "support/comm_test_util.h"
#include "support/worker_ranks_check.h"
#include "tp/comm/all_reduce_fusion.h"

using Catch::Contains;
using tp::AllReduceFusionNorm;
using tp::AllReduceFusionParams;
using tp::AllReduceFusionQuant;
using tp::AllReduceFusionResult;
using tp::AllReduceStrategy;
using tp::Communicator;
using namespace tp::comm_test;

namespace {

const std::vector<AllReduceFusionNorm> kNorms = {AllReduceFusionNorm::kNone, AllReduceFusionNorm::kRMS,
                                                 AllReduceFusionNorm::kRMSUnitOffset,
                                                 AllReduceFusionNorm::kRMSScaleFirst, AllReduceFusionNorm::kLayerNorm};
const std::vector<AllReduceFusionQuant> kQuants = {AllReduceFusionQuant::kNone, AllReduceFusionQuant::kFp8PerToken,
                                                   AllReduceFusionQuant::kInt8PerToken};

// tp::Norm's kinds, operation for operation (models/norm.cpp), on h of the model's dtype.
at::Tensor reference_norm(const at::Tensor& h_in, AllReduceFusionNorm norm, const at::Tensor& w, const at::Tensor& b,
                          double eps) {
  const at::Tensor h = h_in.to(at::kFloat);
  const at::Tensor r = at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  switch (norm) {
    case AllReduceFusionNorm::kRMS: return w * (h * r).to(h_in.scalar_type());
    case AllReduceFusionNorm::kRMSUnitOffset: return (h * r * (w.to(at::kFloat) + 1.0)).to(h_in.scalar_type());
    case AllReduceFusionNorm::kRMSScaleFirst: return (w * (h * r)).to(h_in.scalar_type());
    case AllReduceFusionNorm::kLayerNorm: return at::layer_norm(h_in, {h_in.size(-1)}, w, b, eps);
    case AllReduceFusionNorm::kNone: break;
  }
  return h_in;
}

// quant's per-token models (fp8: fake_quant_per_token, int8: quantize_per_token) as
// codes and scales.
std::pair<at::Tensor, at::Tensor> reference_quant(const at::Tensor& y, AllReduceFusionQuant quant) {
  const at::Tensor x = y.to(at::kFloat);
  const at::Tensor amax = x.abs().amax(-1, /*keepdim=*/true);
  if (quant == AllReduceFusionQuant::kFp8PerToken) {
    const at::Tensor s = at::where(amax > 0, amax / 448.0, at::ones_like(amax));
    return {(x / s).clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn), s};
  }
  const at::Tensor s = at::where(amax > 0, amax / 127, at::ones_like(amax));
  return {at::round(x / s).clamp(-127, 127).to(at::kChar), s};
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

struct Case {
  at::ScalarType dtype;
  int64_t m;
  AllReduceFusionNorm norm;
  AllReduceFusionQuant quant;
  bool bias, residual;
  uint64_t seed;
  std::string describe(int64_t world, int64_t rank, AllReduceStrategy s) const {
    std::ostringstream o;
    o << "world=" << world << " rank=" << rank << " strategy=" << s << " dtype=" << dtype << " M=" << m
      << " norm=" << norm << " quant=" << quant << " bias=" << bias << " residual=" << residual << " seed=" << seed;
    return o.str();
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  uint64_t seed = kSeed;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t m : {1, 3, 17, 300}) {
      for (auto norm : kNorms) {
        for (auto quant : kQuants) {
          if (norm == AllReduceFusionNorm::kNone && quant != AllReduceFusionQuant::kNone) continue;
          const bool bias = seed % 2 == 0, residual = seed % 3 != 0;
          out.push_back({dtype, m, norm, quant, bias, residual, seed++});
        }
      }
    }
  }
  return out;
}

constexpr int64_t kHidden = 200;  // not a power of two

// One rank's check of one case; returns what was wrong ("" when nothing).
std::string check_case(const Communicator& comm, const Case& c, AllReduceStrategy strategy,
                       std::vector<AllReduceFusionResult>* keep) {
  const int64_t world = comm.world_size(), rank = comm.rank();
  const at::Tensor partial = rank_input(c.seed, rank, {c.m, kHidden}, c.dtype);
  const at::Tensor bias = c.bias ? rank_input(c.seed + 1000, 0, {kHidden}, c.dtype) : at::Tensor();
  const at::Tensor residual = c.residual ? rank_input(c.seed + 2000, 0, {c.m, kHidden}, c.dtype) : at::Tensor();
  const at::Tensor w = rank_input(c.seed + 3000, 0, {kHidden}, c.dtype);
  const at::Tensor nb =
      c.norm == AllReduceFusionNorm::kLayerNorm ? rank_input(c.seed + 4000, 0, {kHidden}, c.dtype) : at::Tensor();
  AllReduceFusionParams p;
  p.bias = bias;
  p.residual_in = residual;
  p.norm = c.norm;
  if (c.norm != AllReduceFusionNorm::kNone) p.norm_weight = w;
  p.norm_bias = nb;
  p.eps = 1e-5;
  p.quant_out = c.quant;
  p.strategy = strategy;
  const at::Tensor before = partial.clone();
  const AllReduceFusionResult r = comm.all_reduce_fusion(partial, p);
  // The unfused path: rank 0 adds the bias to its partial sum (the row layers' contract),
  // the same strategy's all-reduce, then tensor operations.
  at::Tensor h = c.bias && rank == 0 ? partial + bias : partial.clone();
  comm.all_reduce(h, strategy);
  if (c.residual) h = h + residual;
  const std::string what = c.describe(world, rank, strategy);
  if (!same_bits(partial, before)) return what + ": the input was modified";
  // Each addition rounds as a tensor addition: the new residual is bitwise the unfused one.
  if (!same_bits(r.residual_out, h)) {
    return what + ": residual_out differs from the unfused sum by " +
           std::to_string((r.residual_out.to(at::kDouble) - h.to(at::kDouble)).abs().max().item<double>());
  }
  if (c.norm == AllReduceFusionNorm::kNone) {
    if (r.norm_out.defined() || r.quant_out.defined()) return what + ": outputs that were not asked for";
  } else {
    const at::Tensor y = reference_norm(h, c.norm, w, nb, p.eps);
    // Within the dtype's rounding: the fused variance is summed in another order.
    const double tol = c.dtype == at::kFloat ? 2e-5 : 1.6e-2;
    if (r.norm_out.scalar_type() != c.dtype || !at::allclose(r.norm_out.to(at::kDouble), y.to(at::kDouble), tol, tol))
      return what + ": norm_out differs from the unfused norm by " +
             std::to_string((r.norm_out.to(at::kDouble) - y.to(at::kDouble)).abs().max().item<double>());
    if (c.quant != AllReduceFusionQuant::kNone) {
      // Exactly the per-token model on the norm's output: codes and scales.
      const auto [codes, scales] = reference_quant(r.norm_out, c.quant);
      if (!same_bits(r.quant_out, codes)) return what + ": quant_out differs from the per-token model's codes";
      if (!same_bits(r.scale_out, scales)) return what + ": scale_out differs from the per-token model's scales";
    } else if (r.quant_out.defined()) {
      return what + ": quant_out without a quant";
    }
  }
  if (keep) keep->push_back(r);
  return "";
}

// Rank 0's results, for comparing ranks (and strategies) bit for bit.
bool results_equal(const AllReduceFusionResult& a, const AllReduceFusionResult& b) {
  return same_bits(a.residual_out, b.residual_out) && same_bits(a.norm_out, b.norm_out) &&
         same_bits(a.quant_out, b.quant_out) && same_bits(a.scale_out, b.scale_out);
}

}  // namespace

TEST_CASE("all_reduce_fusion equals all_reduce followed by bias, residual, norm and quantization", "[comm][fusion]") {
  const auto all = cases();
  for (int64_t world = 1; world <= 4; ++world) {
    const std::vector<AllReduceStrategy> strategies =
        world == 1 ? std::vector<AllReduceStrategy>{AllReduceStrategy::kAuto}
                   : std::vector<AllReduceStrategy>{
                         AllReduceStrategy::kSharedMemoryOneShot, AllReduceStrategy::kSharedMemoryTwoShot,
                         AllReduceStrategy::kProcessGroup, AllReduceStrategy::kRecursiveDoubling};
    std::vector<std::vector<std::string>> errors(world);
    // [rank][strategy] -> every case's results.
    std::vector<std::vector<std::vector<AllReduceFusionResult>>> results(
        world, std::vector<std::vector<AllReduceFusionResult>>(strategies.size()));
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          const auto rank = comm.rank();
          for (size_t s = 0; s < strategies.size(); ++s) {
            for (const auto& c : all) {
              const std::string e = check_case(comm, c, strategies[s], &results[rank][s]);
              if (!e.empty()) errors[rank].push_back(e);
            }
          }
        },
        test_options());
    for (int64_t rank = 0; rank < world; ++rank) {
      INFO("world " << world << " rank " << rank << ": " << errors[rank].size() << " case(s) wrong");
      // The first few, each naming its case.
      for (size_t i = 0; i < errors[rank].size() && i < 5; ++i) FAIL_CHECK(errors[rank][i]);
      CHECK(errors[rank].empty());
    }
    // Every rank ends with the same bits; shm one-shot and two-shot (the same summation
    // order) give the same bits too.
    for (size_t s = 0; s < strategies.size(); ++s) {
      for (int64_t rank = 1; rank < world; ++rank) {
        REQUIRE(results[rank][s].size() == results[0][s].size());
        for (size_t i = 0; i < results[0][s].size(); ++i) {
          INFO("world " << world << " rank " << rank << " strategy " << strategies[s] << " case " << i);
          CHECK(results_equal(results[rank][s][i], results[0][s][i]));
        }
      }
    }
    if (world > 1) {
      for (size_t i = 0; i < results[0][0].size(); ++i) {
        INFO("world " << world << " shm one-shot vs two-shot, case " << i);
        CHECK(results_equal(results[0][0][i], results[0][1][i]));
      }
    }
  }
}

TEST_CASE("all_reduce_fusion at TP 1 is the epilogue alone, and takes strided inputs", "[comm][fusion]") {
  Communicator comm;
  const at::Tensor x = rank_input(kSeed, 0, {6, 2 * kHidden}, at::kFloat).narrow(1, 0, kHidden);  // not contiguous
  const at::Tensor res = rank_input(kSeed, 1, {6, kHidden}, at::kFloat);
  const at::Tensor w = rank_input(kSeed, 2, {kHidden}, at::kFloat);
  AllReduceFusionParams p;
  p.residual_in = res;
  p.norm = AllReduceFusionNorm::kRMS;
  p.norm_weight = w;
  const auto r = comm.all_reduce_fusion(x, p);
  CHECK(same_bits(r.residual_out, x + res));
  CHECK(at::allclose(r.norm_out, reference_norm(x + res, p.norm, w, {}, p.eps), 2e-5, 2e-5));
  // Outputs given by the caller are written in place; a wrong one is refused by name.
  AllReduceFusionResult given;
  given.residual_out = at::empty({6, kHidden});
  given.norm_out = at::empty({6, kHidden});
  const auto g = comm.all_reduce_fusion(x, p, given);
  CHECK(g.residual_out.data_ptr() == given.residual_out.data_ptr());
  CHECK(g.norm_out.data_ptr() == given.norm_out.data_ptr());
  CHECK(same_bits(g.residual_out, r.residual_out));
  CHECK(same_bits(g.norm_out, r.norm_out));
  given.norm_out = at::empty({6, kHidden + 1});
  REQUIRE_THROWS_WITH(comm.all_reduce_fusion(x, p, given), Contains("the given norm_out is Float[6, 201]"));
  // Empty: no rows, the outputs' shapes still right.
  p.residual_in = at::empty({0, kHidden});
  const auto e = comm.all_reduce_fusion(at::empty({0, kHidden}), p);
  CHECK(e.residual_out.sizes() == at::IntArrayRef({0, kHidden}));
  CHECK(e.norm_out.sizes() == at::IntArrayRef({0, kHidden}));
}

TEST_CASE("all_reduce_fusion rejects bad arguments naming the tensor and the sizes", "[comm][fusion]") {
  Communicator comm;
  const at::Tensor x = at::ones({4, 8});
  AllReduceFusionParams p;
  p.norm = AllReduceFusionNorm::kRMS;
  p.norm_weight = at::ones({7});
  REQUIRE_THROWS_WITH(comm.all_reduce_fusion(x, p),
                      Contains("all_reduce_fusion: norm_weight has shape [7]") && Contains("expected [8]"));
  p.norm_weight = at::ones({8});
  p.residual_in = at::ones({4, 9});
  REQUIRE_THROWS_WITH(comm.all_reduce_fusion(x, p), Contains("residual_in has shape [4, 9]"));
  p.residual_in = at::ones({4, 8}, at::kBFloat16);
  REQUIRE_THROWS_WITH(comm.all_reduce_fusion(x, p), Contains("residual_in is BFloat16"));
  p.residual_in = at::Tensor();
  p.norm = AllReduceFusionNorm::kNone;
  p.quant_out = AllReduceFusionQuant::kFp8PerToken;
  REQUIRE_THROWS_WITH(comm.all_reduce_fusion(x, p), Contains("norm_weight / norm_bias given with norm=none"));
  p.norm_weight = at::Tensor();
  REQUIRE_THROWS_WITH(comm.all_reduce_fusion(x, p), Contains("quant_out=fp8_per_token quantizes the norm's output"));
  REQUIRE_THROWS_WITH(comm.all_reduce_fusion(at::ones({4, 8}, at::kDouble), AllReduceFusionParams{}),
                      Contains("allreduce_in is Double; expected float32, bfloat16 or float16"));
  p = AllReduceFusionParams{};
  p.norm = AllReduceFusionNorm::kRMS;
  p.norm_weight = at::ones({8});
  p.norm_bias = at::ones({8});
  REQUIRE_THROWS_WITH(comm.all_reduce_fusion(x, p), Contains("only layer_norm has a bias"));
}

TEST_CASE("an all_reduce_fusion refused or mismatched on one rank fails on every rank within seconds",
          "[comm][fusion]") {
  // 30 s timeout: an error that only arrived by timing out would take that long.
  const int64_t world = 3;
  for (auto strategy : {AllReduceStrategy::kSharedMemoryOneShot, AllReduceStrategy::kSharedMemoryTwoShot,
                        AllReduceStrategy::kProcessGroup, AllReduceStrategy::kRecursiveDoubling}) {
    // warm: a first call has made the shared-memory workspace (the check then travels in
    // the data step); cold: the refused call is the communicator's first.
    for (bool warm : {false, true}) {
      for (bool mismatch : {false, true}) {
        std::vector<std::string> errors(world);
        std::vector<double> seconds(world, -1);
        std::vector<int> after(world, 0);  // not vector<bool>: its ranks share bytes
        tp::run_ranks_in_threads(
            world,
            [&](Communicator& comm) {
              const auto rank = comm.rank();
              AllReduceFusionParams p;
              p.strategy = strategy;
              p.norm = AllReduceFusionNorm::kRMS;
              p.norm_weight = at::ones({kHidden});
              if (warm) comm.all_reduce_fusion(at::ones({5, kHidden}), p);
              AllReduceFusionParams bad = p;
              at::Tensor x = at::ones({5, kHidden});
              if (rank == 1 && mismatch) x = at::ones({6, kHidden});                  // another shape
              if (rank == 1 && !mismatch) bad.norm_weight = at::ones({kHidden + 1});  // refused here
              const auto start = std::chrono::steady_clock::now();
              errors[rank] = error_of([&] { comm.all_reduce_fusion(x, bad); });
              seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
              // The communicator stays usable: every rank gave up at the same step.
              const auto r = comm.all_reduce_fusion(at::ones({5, kHidden}), p);
              after[rank] = r.residual_out.eq(world).all().item<bool>();
            },
            test_options(std::chrono::seconds(30)));
        for (int64_t rank = 0; rank < world; ++rank) {
          INFO("strategy " << strategy << (warm ? " warm" : " cold") << (mismatch ? " mismatch" : " refused")
                           << ", rank " << rank << " after " << seconds[rank] << " s: " << errors[rank]);
          CHECK_THAT(errors[rank], Contains("all_reduce_fusion"));
          if (mismatch) {
            CHECK_THAT(errors[rank], Contains("the ranks disagree on this collective"));
          } else if (rank == 1) {
            CHECK_THAT(errors[rank], Contains("norm_weight has shape [201]"));
          } else {
            CHECK_THAT(errors[rank], Contains("refused its own arguments"));
          }
          CHECK(seconds[rank] < 10.0);
          CHECK(after[rank]);
        }
      }
    }
  }
}

TEST_CASE("all_reduce_fusion across processes: the fused shared-memory pass and a composed strategy",
          "[comm][fusion][process]") {
  for (int world : {2, 3}) tp::test::check_worker_ranks("fusion", world);
}
