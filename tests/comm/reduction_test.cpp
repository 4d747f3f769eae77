// tp::Reduction (tp/comm/reduction.h): each operation at world 1-4 with uneven and empty
// per-rank extents, forward against the float64 reference and backward against the
// conjugate collective's result.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <sstream>

#include "support/comm_test_util.h"
#include "tp/comm/reduction.h"

namespace tp::comm_test {
namespace {

// Per-rank extents: 1, 2, 3, ... with zeros mixed in (rank 1 holds none from world 2 on).
std::vector<int64_t> uneven(int64_t world) {
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < world; ++r) sizes.push_back(r == 1 ? 0 : r + 2);
  return sizes;
}

int64_t offset_of(const std::vector<int64_t>& sizes, int64_t rank) {
  int64_t o = 0;
  for (int64_t r = 0; r < rank; ++r) o += sizes[r];
  return o;
}

}  // namespace

TEST_CASE(
    "Reduction: reduce_scatter with uneven token counts sums and keeps each rank's rows, and its backward all-gathers",
    "[comm]") {
  for (int64_t world : {1, 2, 3, 4}) {
    for (bool explicit_sizes : {true, false}) {
      const int64_t tokens = explicit_sizes ? [&] {
        int64_t t = 0;
        for (auto s : uneven(world)) t += s;
        return t;
      }()
                                            : 7;  // not a multiple of 2, 3 or 4
      std::vector<int64_t> sizes = explicit_sizes ? uneven(world) : std::vector<int64_t>{};
      std::vector<int64_t> expected_sizes = sizes;
      if (!explicit_sizes)
        for (int64_t r = 0; r < world; ++r) expected_sizes.push_back(tokens / world + (r < tokens % world ? 1 : 0));
      std::vector<at::Tensor> out(world), grad(world);
      tp::run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            at::Tensor x = rank_input(kSeed, comm.rank(), {tokens, 5}, at::kDouble).requires_grad_(true);
            const auto r = Reduction::reduce_scatter(comm, 0, sizes);
            at::Tensor y = r.apply(x);
            // A loss whose gradient differs per token: the backward must all-gather it.
            const at::Tensor w = rank_input(kSeed + 1, 0, {tokens, 5}, at::kDouble)
                                     .narrow(0, offset_of(expected_sizes, comm.rank()), y.size(0));
            (y * w).sum().backward();
            out[comm.rank()] = y.detach();
            grad[comm.rank()] = x.grad();
          },
          test_options());
      const at::Tensor sum = reference_sum(kSeed, world, {tokens, 5}, at::kDouble);
      const at::Tensor w = rank_input(kSeed + 1, 0, {tokens, 5}, at::kDouble);
      for (int64_t rank = 0; rank < world; ++rank) {
        INFO("world=" << world << " rank=" << rank << " explicit sizes=" << explicit_sizes);
        const at::Tensor mine = sum.narrow(0, offset_of(expected_sizes, rank), expected_sizes[rank]);
        REQUIRE(out[rank].sizes() == mine.sizes());
        CHECK(at::allclose(out[rank], mine, 1e-12, 1e-12));
        CHECK(at::equal(grad[rank], w));  // every rank's x gets the whole (gathered) gradient
      }
    }
  }
}

TEST_CASE(
    "Reduction: all_gather joins uneven pieces: its backward keeps this rank's piece, or reduce-scatters "
    "with partial_grad",
    "[comm]") {
  for (int64_t world : {1, 2, 3, 4}) {
    for (bool partial_grad : {false, true}) {
      const auto sizes = uneven(world);
      int64_t total = 0;
      for (auto s : sizes) total += s;
      std::vector<at::Tensor> out(world), grad(world);
      tp::run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            at::Tensor x =
                rank_input(kSeed + 2, comm.rank(), {3, sizes[comm.rank()]}, at::kDouble).requires_grad_(true);
            const auto r = Reduction::all_gather(comm, -1, sizes, partial_grad);
            at::Tensor y = r.apply(x);
            // Rank-dependent upstream gradients: partial sums when partial_grad.
            (y * rank_input(kSeed + 3, comm.rank(), {3, total}, at::kDouble)).sum().backward();
            out[comm.rank()] = y.detach();
            grad[comm.rank()] = x.grad();
          },
          test_options());
      std::vector<at::Tensor> pieces;
      for (int64_t r = 0; r < world; ++r) pieces.push_back(rank_input(kSeed + 2, r, {3, sizes[r]}, at::kDouble));
      const at::Tensor whole = at::cat(pieces, -1);
      const at::Tensor g_sum = reference_sum(kSeed + 3, world, {3, total}, at::kDouble);
      for (int64_t rank = 0; rank < world; ++rank) {
        INFO("world=" << world << " rank=" << rank << " partial_grad=" << partial_grad);
        CHECK(at::equal(out[rank], whole));
        const at::Tensor g = partial_grad ? g_sum : rank_input(kSeed + 3, rank, {3, total}, at::kDouble);
        const at::Tensor expected = g.narrow(-1, offset_of(sizes, rank), sizes[rank]);
        REQUIRE(grad[rank].sizes() == expected.sizes());
        CHECK(at::allclose(grad[rank], expected, 1e-12, 1e-12));
      }
    }
  }
}

TEST_CASE(
    "Reduction: all_reduce sums (in place when nothing records a gradient), none is the identity, and the "
    "spec prints",
    "[comm]") {
  for (int64_t world : {1, 2, 3, 4}) {
    std::vector<at::Tensor> reduced(world), consumed(world), same(world);
    std::vector<int> in_place(world), untouched(world);  // not vector<bool>: its ranks share bytes
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          const at::Tensor x = rank_input(kSeed + 4, comm.rank(), {4, 6}, at::kFloat);
          reduced[comm.rank()] = Reduction::all_reduce(comm).apply(x);
          untouched[comm.rank()] = at::equal(x, rank_input(kSeed + 4, comm.rank(), {4, 6}, at::kFloat));
          at::NoGradGuard no_grad;
          at::Tensor t = x.clone();
          consumed[comm.rank()] = Reduction::all_reduce(comm).apply_consuming(t);
          in_place[comm.rank()] = consumed[comm.rank()].is_same(t);
          same[comm.rank()] = Reduction::none(comm).apply(x);
        },
        test_options());
    const at::Tensor sum = reference_sum(kSeed + 4, world, {4, 6}, at::kFloat).to(at::kFloat);
    for (int64_t rank = 0; rank < world; ++rank) {
      INFO("world=" << world << " rank=" << rank);
      CHECK(at::allclose(reduced[rank], sum, 1e-5, 1e-5));
      CHECK(at::equal(consumed[rank], reduced[rank]));
      CHECK(in_place[rank]);
      CHECK(untouched[rank]);
      CHECK(at::equal(same[rank], rank_input(kSeed + 4, rank, {4, 6}, at::kFloat)));
    }
  }
  Communicator solo;
  std::ostringstream text;
  text << Reduction::reduce_scatter(solo, 0, {3}) << " " << Reduction::all_reduce(solo) << " " << Reduction::none(solo);
  CHECK(text.str() == "reduce_scatter(dim=0, sizes=[3], world=1) all_reduce(auto, world=1) none");
}

TEST_CASE("Reduction: sizes that do not match the group or the tensor are refused on every rank", "[comm]") {
  std::vector<std::string> errors(3);
  tp::run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        const at::Tensor x = at::ones({4, 2});
        errors[comm.rank()] = error_of([&] { Reduction::reduce_scatter(comm, 0, {1, 1}).apply(x); });
      },
      test_options());
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("2 sizes for a group of 3 ranks"));
}

}  // namespace tp::comm_test
