// Every all-reduce strategy (process_group, recursive_doubling, shm_one_shot,
// shm_two_shot, auto) over the grid of world sizes, message sizes (around every
// threshold of the built-in table) and dtypes: results against the float64 sum of the
// inputs each rank regenerates, bitwise agreement across ranks; long runs of calls;
// bf16 wire precision against its documented bound; and the failures of the
// recursive-doubling strategy.

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/comm_test_util.h"

using Catch::Contains;
using tp::AllReduceStrategy;
using tp::Communicator;
using tp::CommunicatorOptions;
using tp::WirePrecision;
using namespace tp::comm_test;

namespace {

const std::vector<AllReduceStrategy> kAllStrategies = {
    AllReduceStrategy::kProcessGroup, AllReduceStrategy::kRecursiveDoubling, AllReduceStrategy::kSharedMemoryOneShot,
    AllReduceStrategy::kSharedMemoryTwoShot, AllReduceStrategy::kAuto};

/// FNV-1a over a tensor's bytes, 8 at a time: equal hashes across ranks mean (for our
/// purposes) bitwise-equal results, without keeping every rank's 8 MiB result alive.
uint64_t hash_bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  uint64_t h = 14695981039346656037ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    h ^= word;
    h *= 1099511628211ull;
  }
  for (; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

/// Messages above this many bytes run for float32 and bfloat16 only: float64 and
/// float16 go through the same templated paths as float32 and bfloat16, and every
/// large message costs seconds of Gloo time on a 2-thread CI machine. Their small and
/// threshold cases up to this size all run.
constexpr int64_t kLargeBytes = int64_t{1} << 20;

/// Element counts: 0, 1, 15, every threshold of the built-in table that applies at
/// this world (same host or not) +-1 element, and 8 MiB.
std::vector<int64_t> grid_sizes(int64_t world, at::ScalarType dtype) {
  const int64_t item = c10::elementSize(dtype);
  std::set<int64_t> sizes = {0, 1, 15, (int64_t{8} << 20) / item};
  for (bool same_host : {true, false}) {
    const tp::AllReduceTableEntry* e = tp::AllReduceTable::builtin().find(world, same_host);
    if (e == nullptr) continue;
    for (const auto& rule : e->rules) {
      if (rule.max_bytes < 0) continue;
      const int64_t at = rule.max_bytes / item;
      for (int64_t n : {at - 1, at, at + 1}) sizes.insert(n);
    }
  }
  std::vector<int64_t> out;
  const bool all_sizes = dtype == at::kFloat || dtype == at::kBFloat16;
  for (int64_t n : sizes) {
    if (all_sizes || n * item <= kLargeBytes) out.push_back(n);
  }
  return out;
}

struct Outcome {
  bool close = false;
  double max_err = -1;
  uint64_t hash = 0;
  bool ran = false;
};

}  // namespace

TEST_CASE("every strategy matches the float64 sum at world 1, 2, 3, 4 and 8, bitwise identical across ranks",
          "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  EnvGuard no_wire("TP_ALLREDUCE_WIRE", std::nullopt);
  for (int64_t world : {1, 2, 3, 4, 8}) {
    // The cases, and their float64 references, computed once on the main thread.
    struct Case {
      at::ScalarType dtype;
      int64_t numel;
      uint64_t seed;
      at::Tensor expected;
    };
    std::vector<Case> cases;
    for (auto dtype : kFloatTypes) {
      for (int64_t n : grid_sizes(world, dtype)) {
        const uint64_t seed = kSeed + 1000 + cases.size();
        cases.push_back({dtype, n, seed, reference_sum(seed, world, {n}, dtype)});
      }
    }
    // outcome[case][strategy][rank]
    std::vector<std::vector<std::vector<Outcome>>> outcome(
        cases.size(), std::vector<std::vector<Outcome>>(kAllStrategies.size(), std::vector<Outcome>(world)));
    CommunicatorOptions options = test_options(std::chrono::seconds(60));
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          const int64_t r = comm.rank();
          for (size_t c = 0; c < cases.size(); ++c) {
            const at::Tensor input = rank_input(cases[c].seed, r, {cases[c].numel}, cases[c].dtype);
            const auto [rtol, atol] = tolerance(cases[c].dtype);
            for (size_t k = 0; k < kAllStrategies.size(); ++k) {
              at::Tensor t = input.clone();
              comm.all_reduce(t, kAllStrategies[k]);
              Outcome& o = outcome[c][k][r];
              // at::allclose's test, |got - expected| <= atol + rtol |expected|, in one pass
              // that also gives the largest error for the message.
              const at::Tensor err = (t.to(at::kDouble) - cases[c].expected).abs();
              o.close = t.scalar_type() == cases[c].dtype && t.sizes() == cases[c].expected.sizes() &&
                        at::all(err <= cases[c].expected.abs() * rtol + atol).item<bool>();
              o.max_err = t.numel() ? err.max().item<double>() : 0.0;
              o.hash = hash_bytes(t);
              o.ran = true;
            }
          }
        },
        options);
    for (size_t c = 0; c < cases.size(); ++c) {
      for (size_t k = 0; k < kAllStrategies.size(); ++k) {
        for (int64_t rank = 0; rank < world; ++rank) {
          const Outcome& o = outcome[c][k][rank];
          INFO("world=" << world << " rank=" << rank << " strategy=" << kAllStrategies[k] << " dtype=" << cases[c].dtype
                        << " numel=" << cases[c].numel << " seed=" << cases[c].seed << " max_err=" << o.max_err);
          REQUIRE(o.ran);
          CHECK(o.close);
          CHECK(o.hash == outcome[c][k][0].hash);  // bitwise identical across ranks
        }
      }
    }
  }
}

TEST_CASE("1000 back-to-back all_reduces of varying sizes over every strategy, world 3", "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  const int64_t world = 3;
  const int64_t chunked = (int64_t{2} << 20) / 4 * 2 + 3;  // three shared-memory chunks
  std::vector<std::string> failures(world);
  std::vector<std::map<AllReduceStrategy, int64_t>> counts(world);
  tp::run_ranks_in_threads(
      world,
      [&](Communicator& comm) {
        for (int64_t i = 0; i < 1000 && failures[comm.rank()].empty(); ++i) {
          // Integer-valued floats: the sum is exact, so any mix-up of buffers or messages shows.
          const int64_t n = i % 250 == 249 ? chunked : 1 + (i * 7919) % 3000;
          // Mostly the fast strategies; the process group (Gloo's ring) every 10th call.
          const AllReduceStrategy s = i % 10 == 9 ? AllReduceStrategy::kProcessGroup : kAllStrategies[1 + i % 4];
          at::Tensor t = at::arange(n, at::kFloat) * static_cast<double>(comm.rank() + 1) + static_cast<double>(i);
          comm.all_reduce(t, s);
          const at::Tensor expected =
              at::arange(n, at::kFloat) * static_cast<double>(world * (world + 1) / 2) + static_cast<double>(world * i);
          if (!at::equal(t, expected)) {
            failures[comm.rank()] = "call " + std::to_string(i) + " (" + tp::to_string(s) + ", numel " +
                                    std::to_string(n) + ") differs by up to " +
                                    std::to_string((t - expected).abs().max().item<double>());
          }
        }
        counts[comm.rank()] = comm.all_reduce_counts();
      },
      test_options());
  for (int64_t rank = 0; rank < world; ++rank) {
    INFO("rank " << rank);
    CHECK(failures[rank] == "");
    CHECK(counts[rank].at(AllReduceStrategy::kRecursiveDoubling) >= 225);
    CHECK(counts[rank].at(AllReduceStrategy::kProcessGroup) == 100);
  }
}

TEST_CASE("bf16 wire precision stays within its documented bound and keeps ranks bitwise identical", "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  EnvGuard no_wire("TP_ALLREDUCE_WIRE", std::nullopt);
  // The bound documented at tp::WirePrecision: |y - sum| <= (L 2^-8 (1 + 2^-6) + world 2^-24) S,
  // S = sum_r |x_r|, L = roundings on the longest path.
  auto roundings = [](AllReduceStrategy s, int64_t world) -> int64_t {
    if (s == AllReduceStrategy::kSharedMemoryOneShot) return 1;
    if (s == AllReduceStrategy::kSharedMemoryTwoShot) return 2;
    return static_cast<int64_t>(std::ceil(std::log2(static_cast<double>(world))));
  };
  const std::vector<AllReduceStrategy> lossy = {AllReduceStrategy::kRecursiveDoubling,
                                                AllReduceStrategy::kSharedMemoryOneShot,
                                                AllReduceStrategy::kSharedMemoryTwoShot};
  const int64_t n = 4099;
  for (int64_t world : {2, 3, 4, 8}) {
    const uint64_t seed = kSeed + 7000 + world;
    at::Tensor exact = reference_sum(seed, world, {n}, at::kFloat);
    at::Tensor magnitude = at::zeros({n}, at::kDouble);
    for (int64_t r = 0; r < world; ++r) magnitude += rank_input(seed, r, {n}, at::kFloat).to(at::kDouble).abs();
    // got[strategy][rank]; native[rank]: the process group asked for bf16 (it ignores it)
    std::vector<std::vector<at::Tensor>> got(lossy.size(), std::vector<at::Tensor>(world));
    std::vector<at::Tensor> pg(world), halves(world);
    std::vector<std::map<WirePrecision, int64_t>> wires(world);
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          const at::Tensor input = rank_input(seed, comm.rank(), {n}, at::kFloat);
          for (size_t k = 0; k < lossy.size(); ++k) {
            at::Tensor t = input.clone();
            comm.all_reduce(t, lossy[k], WirePrecision::kBFloat16);
            got[k][comm.rank()] = t;
          }
          pg[comm.rank()] = input.clone();
          comm.all_reduce(pg[comm.rank()], AllReduceStrategy::kProcessGroup, WirePrecision::kBFloat16);
          halves[comm.rank()] = rank_input(seed, comm.rank(), {n}, at::kHalf);  // not float32: native
          comm.all_reduce(halves[comm.rank()], AllReduceStrategy::kRecursiveDoubling, WirePrecision::kBFloat16);
          wires[comm.rank()] = comm.all_reduce_wire_counts();
        },
        test_options());
    for (size_t k = 0; k < lossy.size(); ++k) {
      const int64_t L = roundings(lossy[k], world);
      const at::Tensor bound =
          magnitude * (L * std::ldexp(1.0, -8) * (1 + std::ldexp(1.0, -6)) + world * std::ldexp(1.0, -24));
      for (int64_t rank = 0; rank < world; ++rank) {
        const at::Tensor err = (got[k][rank].to(at::kDouble) - exact).abs();
        INFO("world=" << world << " rank=" << rank << " strategy=" << lossy[k] << " L=" << L << " seed=" << seed
                      << " max err/S=" << (err / magnitude).max().item<double>());
        CHECK(at::all(err <= bound).item<bool>());
        // The wire really is bf16: the error is well above fp32's.
        CHECK((err / magnitude).max().item<double>() > 1e-4);
        CHECK(at::equal(got[k][rank], got[k][0]));
      }
    }
    for (int64_t rank = 0; rank < world; ++rank) {
      INFO("world=" << world << " rank=" << rank);
      CHECK(at::allclose(pg[rank].to(at::kDouble), exact, 1e-5, 1e-5));  // process_group: native
      CHECK(wires[rank] ==
            std::map<WirePrecision, int64_t>{{WirePrecision::kBFloat16, 3}, {WirePrecision::kNative, 2}});
    }
  }
}

TEST_CASE("TP_ALLREDUCE_WIRE and CommunicatorOptions::wire set the wire precision, and a call overrides them",
          "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  using Wires = std::map<WirePrecision, int64_t>;
  auto run = [](CommunicatorOptions options, std::vector<Wires>& wires) {
    tp::run_ranks_in_threads(
        2,
        [&](Communicator& comm) {
          at::Tensor t = at::ones({64});
          comm.all_reduce(t, AllReduceStrategy::kRecursiveDoubling);                              // the default
          comm.all_reduce(t, AllReduceStrategy::kRecursiveDoubling, WirePrecision::kNative);      // forced native
          comm.all_reduce(t, AllReduceStrategy::kSharedMemoryOneShot, WirePrecision::kBFloat16);  // forced bf16
          wires[comm.rank()] = comm.all_reduce_wire_counts();
        },
        options);
  };
  SECTION("the option") {
    EnvGuard unset("TP_ALLREDUCE_WIRE", std::nullopt);
    CommunicatorOptions options = test_options();
    options.wire = WirePrecision::kBFloat16;
    std::vector<Wires> wires(2);
    run(options, wires);
    CHECK(wires[0] == Wires{{WirePrecision::kBFloat16, 2}, {WirePrecision::kNative, 1}});
    CHECK(wires[1] == wires[0]);
    options.wire = WirePrecision::kDefault;
    REQUIRE_THROWS_WITH(run(options, wires), Contains("options.wire=default"));
  }
  SECTION("the environment, any case, over the option") {
    for (const char* value : {"bf16", "BFloat16"}) {
      EnvGuard env("TP_ALLREDUCE_WIRE", std::string(value));
      INFO("TP_ALLREDUCE_WIRE=" << value);
      std::vector<Wires> wires(2);
      run(test_options(), wires);
      CHECK(wires[0] == Wires{{WirePrecision::kBFloat16, 2}, {WirePrecision::kNative, 1}});
    }
    EnvGuard env("TP_ALLREDUCE_WIRE", std::string("native"));
    CommunicatorOptions options = test_options();
    options.wire = WirePrecision::kBFloat16;
    std::vector<Wires> wires(2);
    run(options, wires);
    CHECK(wires[0] == Wires{{WirePrecision::kBFloat16, 1}, {WirePrecision::kNative, 2}});
  }
  SECTION("an unknown TP_ALLREDUCE_WIRE is an error naming the variable") {
    EnvGuard env("TP_ALLREDUCE_WIRE", std::string("fp8"));
    REQUIRE_THROWS_AS(Communicator(), c10::ValueError);
    REQUIRE_THROWS_WITH(Communicator(), Contains("TP_ALLREDUCE_WIRE='fp8'") && Contains("native, bf16"));
  }
  CHECK(tp::parse_wire_precision("NATIVE") == WirePrecision::kNative);
  CHECK(std::string(tp::to_string(WirePrecision::kBFloat16)) == "bf16");
}

TEST_CASE("recursive doubling handles tensors that are not contiguous, 0-d, and integers", "[comm]") {
  for (int64_t world : {2, 3, 5}) {
    std::vector<at::Tensor> transposed(world), scalar(world), ints(world);
    tp::run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          at::Tensor base = rank_input(kSeed + 80, comm.rank(), {5, 6}, at::kFloat);
          at::Tensor view = base.t();
          comm.all_reduce(view, AllReduceStrategy::kRecursiveDoubling);
          transposed[comm.rank()] = base;
          scalar[comm.rank()] = rank_input(kSeed + 81, comm.rank(), {}, at::kDouble);
          comm.all_reduce(scalar[comm.rank()], AllReduceStrategy::kRecursiveDoubling);
          ints[comm.rank()] = rank_input(kSeed + 82, comm.rank(), {9}, at::kLong);
          comm.all_reduce(ints[comm.rank()], AllReduceStrategy::kRecursiveDoubling);
        },
        test_options());
    for (int64_t rank = 0; rank < world; ++rank) {
      INFO("world=" << world << " rank=" << rank);
      CHECK(at::allclose(transposed[rank].to(at::kDouble), reference_sum(kSeed + 80, world, {5, 6}, at::kFloat), 1e-5,
                         1e-5));
      CHECK(scalar[rank].dim() == 0);
      CHECK(at::allclose(scalar[rank], reference_sum(kSeed + 81, world, {}, at::kDouble), 1e-12, 1e-12));
      CHECK(at::equal(ints[rank], reference_sum(kSeed + 82, world, {9}, at::kLong).to(at::kLong)));
    }
  }
}

TEST_CASE("the shared-memory strategies sum int32 exactly, wrapping as Gloo does: one nonzero term passes bits",
          "[comm]") {
  for (int64_t world : {2, 3, 4}) {
    for (const auto strategy : {AllReduceStrategy::kSharedMemoryOneShot, AllReduceStrategy::kSharedMemoryTwoShot,
                                AllReduceStrategy::kProcessGroup}) {
      std::vector<at::Tensor> sums(world), slots(world);
      tp::run_ranks_in_threads(
          world,
          [&](Communicator& comm) {
            const int64_t r = comm.rank();
            // Large values, so the sum wraps past int32.
            sums[r] = at::full({1000}, int32_t{2000000000} - static_cast<int32_t>(r), at::kInt);
            comm.all_reduce(sums[r], strategy);
            // Each rank's float bits (a -0.0 and a NaN among them) in its own slot.
            at::Tensor f = at::randn({7}, at::kFloat);
            f[0] = -0.0f;
            f[1] = std::numeric_limits<float>::quiet_NaN();
            at::Tensor bits = at::zeros({world, 7}, at::kInt);
            bits[r].copy_(f.view(at::kInt));
            comm.all_reduce(bits, strategy);
            slots[r] = at::stack({bits[r], f.view(at::kInt)});
          },
          test_options());
      for (int64_t rank = 0; rank < world; ++rank) {
        INFO("world=" << world << " strategy=" << strategy << " rank=" << rank);
        int64_t want = 0;
        for (int64_t r = 0; r < world; ++r) want += 2000000000 - r;
        CHECK(sums[rank][0].item<int32_t>() == static_cast<int32_t>(static_cast<uint32_t>(want)));
        CHECK(at::equal(slots[rank][0], slots[rank][1]));
      }
    }
  }
}

TEST_CASE("a recursive-doubling peer that stalls or dies makes the others fail within the timeout", "[comm]") {
  const auto timeout = std::chrono::milliseconds(1500);
  CommunicatorOptions options = test_options(timeout);
  options.verify_calls = false;  // so the wait is in the butterfly's recv, not the fingerprint exchange
  SECTION("stalls") {
    std::vector<std::string> errors(3);
    std::vector<double> seconds(3, -1);
    REQUIRE_THROWS(tp::run_ranks_in_threads(
        3,
        [&](Communicator& comm) {
          at::Tensor t = at::ones({64});
          comm.all_reduce(t, AllReduceStrategy::kRecursiveDoubling);
          if (comm.rank() == 1) {
            std::this_thread::sleep_for(timeout + std::chrono::milliseconds(1500));
            return;
          }
          const auto t0 = std::chrono::steady_clock::now();
          errors[comm.rank()] = error_of([&] { comm.all_reduce(t, AllReduceStrategy::kRecursiveDoubling); });
          seconds[comm.rank()] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (!errors[comm.rank()].empty()) throw std::runtime_error(errors[comm.rank()]);
        },
        options));
    for (int64_t rank : {0, 2}) {
      INFO("rank " << rank << " failed after " << seconds[rank] << " s: " << errors[rank]);
      CHECK_THAT(errors[rank], Contains("tp::Communicator::all_reduce failed on rank"));
      CHECK_THAT(errors[rank], Contains("recursive_doubling"));
      CHECK(seconds[rank] >= 0);
      CHECK(seconds[rank] < 5.0);
    }
  }
  SECTION("dies") {
    std::string error;
    double seconds = -1;
    REQUIRE_THROWS_WITH(tp::run_ranks_in_threads(
                            2,
                            [&](Communicator& comm) {
                              at::Tensor t = at::ones({64});
                              comm.all_reduce(t, AllReduceStrategy::kRecursiveDoubling);
                              if (comm.rank() == 1) throw std::runtime_error("rank 1 fails");
                              const auto t0 = std::chrono::steady_clock::now();
                              error = error_of([&] { comm.all_reduce(t, AllReduceStrategy::kRecursiveDoubling); });
                              seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                            },
                            options),
                        Contains("rank 1: rank 1 fails"));
    INFO("rank 0 failed after " << seconds << " s: " << error);
    CHECK_THAT(error, Contains("tp::Communicator::all_reduce failed on rank 0 of world_size 2"));
    CHECK_THAT(error, Contains("recursive_doubling, receiving from rank 1 (round 0)"));
    CHECK(seconds >= 0);
    CHECK(seconds < 5.0);
  }
}

TEST_CASE("ranks that force different strategies or wire precisions get an error naming both", "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  EnvGuard no_wire("TP_ALLREDUCE_WIRE", std::nullopt);
  struct Pair {
    AllReduceStrategy s0, s1;
    WirePrecision w0, w1;
    bool workspace_first;  // the shared-memory workspace exists before the mismatch
  };
  const std::vector<Pair> pairs = {
      {AllReduceStrategy::kProcessGroup, AllReduceStrategy::kRecursiveDoubling, WirePrecision::kNative,
       WirePrecision::kNative, false},
      {AllReduceStrategy::kSharedMemoryOneShot, AllReduceStrategy::kRecursiveDoubling, WirePrecision::kNative,
       WirePrecision::kNative, false},
      {AllReduceStrategy::kSharedMemoryOneShot, AllReduceStrategy::kProcessGroup, WirePrecision::kNative,
       WirePrecision::kNative, true},
      {AllReduceStrategy::kSharedMemoryTwoShot, AllReduceStrategy::kSharedMemoryTwoShot, WirePrecision::kNative,
       WirePrecision::kBFloat16, true},
  };
  for (const Pair& p : pairs) {
    INFO("rank 0: " << p.s0 << "/" << p.w0 << ", rank 1: " << p.s1 << "/" << p.w1);
    std::vector<std::string> errors(2);
    std::vector<double> after(2, 0);
    tp::run_ranks_in_threads(
        2,
        [&](Communicator& comm) {
          at::Tensor t = at::ones({32});
          if (p.workspace_first) comm.all_reduce(t, AllReduceStrategy::kSharedMemoryOneShot);
          const bool zero = comm.rank() == 0;
          errors[comm.rank()] = error_of([&] { comm.all_reduce(t, zero ? p.s0 : p.s1, zero ? p.w0 : p.w1); });
          // The communicator is still usable after the refused call.
          at::Tensor u = at::ones({4});
          comm.all_reduce(u, AllReduceStrategy::kRecursiveDoubling);
          after[comm.rank()] = u[0].item<double>();
        },
        test_options(std::chrono::seconds(20)));
    for (int64_t rank = 0; rank < 2; ++rank) {
      INFO("rank " << rank << ": " << errors[rank]);
      CHECK_THAT(errors[rank], Contains("the ranks disagree on this collective"));
      CHECK_THAT(errors[rank], Contains(std::string("strategy=") + tp::to_string(p.s0)));
      CHECK_THAT(errors[rank], Contains(std::string("strategy=") + tp::to_string(p.s1)));
      CHECK_THAT(errors[rank], Contains("chose different all-reduce strategies or wire precisions"));
      CHECK(after[rank] == 2.0);
    }
  }
}
