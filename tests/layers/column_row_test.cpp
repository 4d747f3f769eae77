// ColumnParallelLinear and RowParallelLinear against at::linear on the full weights,
// at world sizes 1-4 (ranks as threads over Gloo), random shapes, all CPU dtypes.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <mutex>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/comm/reduction.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"

using namespace tp;
using tp::test::randn;

namespace {

struct LinearCase {
  int64_t in = 0, out = 0, tokens = 0, world = 1, granularity = 1;
  at::ScalarType dtype = at::kFloat;
  bool bias = true;
  uint64_t seed = 0;
};

std::string describe(const LinearCase& c) {
  std::ostringstream os;
  os << "in=" << c.in << " out=" << c.out << " tokens=" << c.tokens << " world=" << c.world
     << " granularity=" << c.granularity << " dtype=" << c.dtype << " bias=" << c.bias << " seed=" << c.seed;
  return os.str();
}

// A random case; the sharded dimension (out for column, in for row) is a multiple of
// the granularity and sometimes smaller than world units (zero-size shards).
LinearCase random_case(int64_t world, at::ScalarType dtype, uint64_t seed, bool split_out) {
  LinearCase c;
  c.world = world;
  c.dtype = dtype;
  c.seed = seed;
  const int64_t grans[] = {1, 4, 16};
  c.granularity = grans[tp::test::randint(0, 2, seed)];
  const int64_t units = tp::test::randint(1, 12, seed + 1);
  const int64_t other = tp::test::randint(1, 96, seed + 2);
  (split_out ? c.out : c.in) = units * c.granularity;
  (split_out ? c.in : c.out) = other;
  c.tokens = tp::test::randint(1, 9, seed + 3);
  c.bias = seed % 2 == 0;
  return c;
}

struct GlobalWeights {
  at::Tensor x, w, b;    // rounded to the case's dtype
  at::Tensor reference;  // float64 at::linear of the rounded tensors
  Checkpoint checkpoint;
};

GlobalWeights make_weights(const LinearCase& c, const std::string& name) {
  GlobalWeights g;
  g.x = randn({c.tokens, c.in}, c.seed * 7 + 1).to(c.dtype);
  g.w = randn({c.out, c.in}, c.seed * 7 + 2).to(c.dtype);
  g.b = randn({c.out}, c.seed * 7 + 3).to(c.dtype);
  g.reference = at::linear(g.x.to(at::kDouble), g.w.to(at::kDouble),
                           c.bias ? std::optional<at::Tensor>(g.b.to(at::kDouble)) : std::nullopt);
  g.checkpoint.add(name + ".weight", g.w);
  if (c.bias) g.checkpoint.add(name + ".bias", g.b);
  return g;
}

const at::ScalarType kDtypes[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};

}  // namespace

TEST_CASE("ColumnParallelLinear matches at::linear on the full weights", "[layers]") {
  uint64_t seed = 100;
  for (int64_t world = 1; world <= 4; ++world) {
    for (auto dtype : kDtypes) {
      for (bool gather : {false, true}) {
        const auto c = random_case(world, dtype, ++seed, /*split_out=*/true);
        INFO(describe(c) << " gather_output=" << gather);
        auto g = make_weights(c, "fc");
        std::vector<at::Tensor> outputs(world);
        std::vector<Range> ranges(world);
        run_ranks_in_threads(
            world,
            [&](Communicator& comm) {
              ColumnParallelLinear fc(ColumnParallelLinearOptions(c.in, c.out)
                                          .bias(c.bias)
                                          .gather_output(gather)
                                          .dtype(c.dtype)
                                          .split(SplitPolicy{}.with_granularity(c.granularity)),
                                      comm);
              fc->load_weights(g.checkpoint, "fc");
              outputs[comm.rank()] = fc->forward(g.x);
              ranges[comm.rank()] = fc->local_range();
            },
            test::test_comm_options());
        for (int64_t r = 0; r < world; ++r) {
          INFO("rank " << r << " range " << ranges[r]);
          const auto expected = gather ? g.reference : g.reference.narrow(1, ranges[r].begin, ranges[r].size());
          REQUIRE(outputs[r].sizes() == expected.sizes());
          REQUIRE(outputs[r].scalar_type() == c.dtype);
          CHECK(test::relative_error(outputs[r], expected) <= test::tolerance(c.dtype));
        }
      }
    }
  }
}

TEST_CASE("ColumnParallelLinear accepts any leading dims and keeps them", "[layers]") {
  run_ranks_in_threads(
      2,
      [&](Communicator& comm) {
        ColumnParallelLinear fc(ColumnParallelLinearOptions(8, 6).gather_output(true), comm);
        const auto y = fc->forward(at::randn({2, 3, 8}));
        TORCH_CHECK(y.sizes() == at::IntArrayRef({2, 3, 6}), "unexpected shape ", y.sizes());
        const auto y0 = fc->forward(at::randn({0, 8}));
        TORCH_CHECK(y0.sizes() == at::IntArrayRef({0, 6}), "unexpected shape ", y0.sizes());
      },
      test::test_comm_options());
}

TEST_CASE("RowParallelLinear matches at::linear, parallel or whole input", "[layers]") {
  uint64_t seed = 500;
  for (int64_t world = 1; world <= 4; ++world) {
    for (auto dtype : kDtypes) {
      for (bool input_is_parallel : {true, false}) {
        const auto c = random_case(world, dtype, ++seed, /*split_out=*/false);
        INFO(describe(c) << " input_is_parallel=" << input_is_parallel);
        auto g = make_weights(c, "down");
        std::vector<at::Tensor> outputs(world);
        run_ranks_in_threads(
            world,
            [&](Communicator& comm) {
              RowParallelLinear down(RowParallelLinearOptions(c.in, c.out)
                                         .bias(c.bias)
                                         .input_is_parallel(input_is_parallel)
                                         .dtype(c.dtype)
                                         .split(SplitPolicy{}.with_granularity(c.granularity)),
                                     comm);
              down->load_weights(g.checkpoint, "down");
              const Range r = down->local_range();
              const auto x = input_is_parallel ? g.x.narrow(1, r.begin, r.size()) : g.x;
              outputs[comm.rank()] = down->forward(x);
            },
            test::test_comm_options());
        for (int64_t r = 0; r < world; ++r) {
          INFO("rank " << r);
          REQUIRE(outputs[r].sizes() == g.reference.sizes());
          CHECK(test::relative_error(outputs[r], g.reference) <= test::tolerance(c.dtype));
          // Every rank ends with the same bits (fixed accumulation order).
          CHECK(at::equal(outputs[r], outputs[0]));
        }
      }
    }
  }
}

TEST_CASE("RowParallelLinear bias contract: unreduced partial sums add up to y", "[layers]") {
  for (int64_t world = 1; world <= 4; ++world) {
    LinearCase c;
    c.in = 40, c.out = 24, c.tokens = 5, c.world = world, c.bias = true, c.seed = 900 + world;
    INFO(describe(c));
    auto g = make_weights(c, "o");
    std::vector<at::Tensor> partials(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          RowParallelLinear o(RowParallelLinearOptions(c.in, c.out).reduce_output(false).input_is_parallel(false),
                              comm);
          o->load_weights(g.checkpoint, "o");
          partials[comm.rank()] = o->forward(g.x);
        },
        test::test_comm_options());
    at::Tensor sum = at::zeros_like(g.reference);
    for (const auto& p : partials) sum += p.to(at::kDouble);
    CHECK(test::relative_error(sum, g.reference) <= test::tolerance(at::kFloat));
    if (world > 1) {
      // The bias is large enough to matter: dropping it (or adding it twice) would
      // move the sum by b, far outside the tolerance checked above.
      CHECK(test::relative_error(sum - g.b.to(at::kDouble), g.reference) > 1e-3);
    }
  }
}

TEST_CASE("A rank that owns nothing skips its GEMM and contributes zeros", "[layers]") {
  // Weighted split {1, 0, 1}: rank 1 owns no rows of the column layer and no
  // columns of the row layer.
  LinearCase c;
  c.in = 32, c.out = 32, c.tokens = 3, c.world = 3, c.bias = true, c.seed = 77;
  auto g = make_weights(c, "l");
  const auto policy = SplitPolicy{}.with_weights({1.0, 0.0, 1.0});
  std::vector<at::Tensor> col(3), row(3);
  std::vector<Range> col_ranges(3);
  run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        ColumnParallelLinear fc(ColumnParallelLinearOptions(c.in, c.out).split(policy), comm);
        fc->load_weights(g.checkpoint, "l");
        col[comm.rank()] = fc->forward(g.x.to(at::kFloat));
        col_ranges[comm.rank()] = fc->local_range();
        RowParallelLinear rl(RowParallelLinearOptions(c.in, c.out).split(policy).input_is_parallel(false), comm);
        rl->load_weights(g.checkpoint, "l");
        row[comm.rank()] = rl->forward(g.x.to(at::kFloat));
      },
      test::test_comm_options());
  CHECK(col_ranges[1].size() == 0);
  CHECK(col[1].sizes() == at::IntArrayRef({3, 0}));
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(test::relative_error(col[r], g.reference.narrow(1, col_ranges[r].begin, col_ranges[r].size())) <= 2e-5);
    CHECK(test::relative_error(row[r], g.reference) <= 2e-5);
  }
}

TEST_CASE("pretty_print shows global and local sizes and the rank", "[layers]") {
  std::vector<std::string> printed(4);
  run_ranks_in_threads(
      4,
      [&](Communicator& comm) {
        ColumnParallelLinear fc(ColumnParallelLinearOptions(4096, 11008).bias(false), comm);
        RowParallelLinear down(RowParallelLinearOptions(11008, 4096).bias(false), comm);
        std::ostringstream os;
        fc->pretty_print(os);
        os << "\n";
        down->pretty_print(os);
        printed[comm.rank()] = os.str();
      },
      test::test_comm_options());
  CHECK(printed[1] ==
        "tp::ColumnParallelLinear(in_features=4096, out_features=11008, local_out=[2752,5504), bias=false, rank=1/4)\n"
        "tp::RowParallelLinear(in_features=11008, out_features=4096, local_in=[2752,5504), bias=false, rank=1/4)");
}

TEST_CASE("the layers' reductions are what their options spell", "[layers]") {
  std::vector<std::string> printed(3);
  run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        std::ostringstream os;
        auto show = [&](const Reduction& r) { os << r << "; "; };
        RowParallelLinear row(RowParallelLinearOptions(12, 5), comm);
        RowParallelLinear partial(RowParallelLinearOptions(12, 5).reduce_output(false), comm);
        RowParallelLinear scattered(RowParallelLinearOptions(12, 5).sequence_parallel(true), comm);
        ColumnParallelLinear col(ColumnParallelLinearOptions(5, 7), comm);
        ColumnParallelLinear gathered(ColumnParallelLinearOptions(5, 7).gather_output(true), comm);
        ColumnParallelLinear sp(ColumnParallelLinearOptions(5, 7).sequence_parallel(true).sequence_dim(1), comm);
        for (const auto* r :
             {&row->output_reduction(), &partial->output_reduction(), &scattered->output_reduction(),
              &col->input_reduction(), &col->output_reduction(), &gathered->output_reduction(), &sp->input_reduction()})
          show(*r);
        printed[comm.rank()] = os.str();
      },
      test::test_comm_options());
  for (const auto& p : printed)
    CHECK(p ==
          "all_reduce(auto, world=3); none; reduce_scatter(dim=0, world=3); none; none; "
          "all_gather(dim=-1, sizes=[3,2,2], world=3); all_gather(dim=1, partial_grad, world=3); ");
}

TEST_CASE("TP=1 is the same code path with a no-op communicator", "[layers]") {
  Communicator single;  // world 1, no process group
  REQUIRE(single.world_size() == 1);
  const auto x = randn({4, 16}, 1).to(at::kFloat);
  ColumnParallelLinear fc(ColumnParallelLinearOptions(16, 8).gather_output(true), single);
  RowParallelLinear down(RowParallelLinearOptions(8, 16), single);
  const auto y = down->forward(fc->forward(x));
  // Against float64, not at::linear in float32: the CPU GEMM chosen for this shape
  // (per ISA) sums in its own order, so two float32 results differ by rounding.
  const auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  const auto ref = at::linear(at::linear(d(x), d(fc->weight), d(fc->bias)), d(down->weight), d(down->bias));
  CHECK(test::relative_error(y, ref) <= test::tolerance(at::kFloat));
  CHECK(fc->local_range() == Range{0, 8});
}

TEST_CASE("clone() copies a TP layer with its sharding and weights", "[layers]") {
  ColumnParallelLinear fc(ColumnParallelLinearOptions(12, 10));
  auto copy = std::dynamic_pointer_cast<ColumnParallelLinearImpl>(fc->clone());
  REQUIRE(copy != nullptr);
  CHECK(at::equal(copy->weight, fc->weight));
  CHECK(copy->weight.data_ptr() != fc->weight.data_ptr());
  const auto x = at::randn({2, 12});
  CHECK(at::equal(copy->forward(x), fc->forward(x)));
}

TEST_CASE("clone() of a quantized layer computes with the copied tensors", "[layers][quant]") {
  // clone() builds a fresh layer (random weights, finalized) and copies the tensors into
  // it in place: the kernels' derived copies must follow (cpu/tensor_stamp.h).
  for (const std::string name : {"int4_gptq:g32", "int4_awq:g64:asym", "int8_weight_only", "int8_w8a8", "fp8_block"}) {
    INFO(name);
    ColumnParallelLinear fc(ColumnParallelLinearOptions(256, 64).quant(parse_quant_config(name)));
    RowParallelLinear down(RowParallelLinearOptions(256, 64).quant(parse_quant_config(name)));
    auto fc_copy = std::dynamic_pointer_cast<ColumnParallelLinearImpl>(fc->clone());
    auto down_copy = std::dynamic_pointer_cast<RowParallelLinearImpl>(down->clone());
    REQUIRE(fc_copy != nullptr);
    REQUIRE(down_copy != nullptr);
    const auto x = randn({3, 256}, 11).to(at::kFloat);
    CHECK(at::equal(fc_copy->forward(x), fc->forward(x)));
    CHECK(at::equal(down_copy->forward(x), down->forward(x)));
  }
}
