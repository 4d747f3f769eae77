// GPU communication: the NCCL communicators at world 1 (the GPU machine has one GPU,
// and NCCL allows one rank per GPU), the GPU all-reduce strategies at world 2-4 as
// threads on that GPU over Gloo, and a layer forward (GEMM + NCCL allreduce) captured
// in a CUDA graph and replayed. Tagged [cuda]: excluded where torch sees no GPU.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

#include "support/gpu_test_util.h"
#include "support/test_util.h"
#include "tp/comm/nccl_communicator.h"
#include "tp/tp.h"

#if TP_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

using namespace tp;
using tp::test::randn;
using tp::test::require_gpu;

namespace {

const at::Device kCuda(at::kCUDA, 0);

CommunicatorOptions no_verify() {
  auto o = test::test_comm_options();
  o.verify_calls = false;  // the fingerprint exchange syncs with the host: not capturable
  return o;
}

void wait(const c10::intrusive_ptr<c10d::Work>& work) { REQUIRE(work->wait(std::chrono::seconds(60))); }

}  // namespace

TEST_CASE("NCCL communicators (c10d and raw) run every collective at world 1", "[cuda][comm]") {
  require_gpu();
  REQUIRE(nccl_available());
  for (auto backend : {NcclBackend::kProcessGroupNccl, NcclBackend::kRaw}) {
    INFO("backend " << (backend == NcclBackend::kRaw ? "raw" : "c10d"));
    auto store = c10::make_intrusive<c10d::HashStore>();
    auto comm = make_nccl_communicator(store, 0, 1, test::test_comm_options(), backend);
    REQUIRE(comm.world_size() == 1);
    auto group = comm.process_group();
    REQUIRE(group);
    // The backend itself (the Communicator skips collectives at world 1).
    auto t = randn({1000}, 1).to(at::kFloat).to(kCuda);
    const auto expect = t.clone();
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions ar;
    wait(group->allreduce(ts, ar));
    CHECK(at::equal(t, expect));
    std::vector<at::Tensor> in{t};
    std::vector<std::vector<at::Tensor>> out{{at::empty_like(t)}};
    wait(group->allgather(out, in, c10d::AllgatherOptions()));
    CHECK(at::equal(out[0][0], expect));
    c10d::BroadcastOptions bo;
    bo.rootRank = 0;
    wait(group->broadcast(ts, bo));
    CHECK(at::equal(t, expect));
    wait(group->getDefaultBackend()->barrier(c10d::BarrierOptions()));
    comm.barrier();
    // Through the Communicator, with the strategies named.
    auto u = t.clone();
    comm.all_reduce(u, AllReduceStrategy::kNccl);
    CHECK(at::equal(u, expect));
    CHECK(comm.all_reduce_counts()[AllReduceStrategy::kNccl] == 1);
    auto cpu = at::ones({4});
    REQUIRE_THROWS_WITH(comm.all_reduce(cpu, AllReduceStrategy::kNccl), Catch::Contains("CUDA tensors"));
    auto half = at::ones({4}, at::TensorOptions(kCuda).dtype(at::kHalf));
    REQUIRE_THROWS_WITH(comm.all_reduce(half, AllReduceStrategy::kNcclBf16Wire), Catch::Contains("float32"));
  }
  REQUIRE_THROWS_WITH(make_nccl_communicator(c10::make_intrusive<c10d::HashStore>(), 2, 2),
                      Catch::Contains("invalid rank 2"));
}

TEST_CASE("GPU all-reduce strategies over Gloo with CUDA tensors, world 2-4", "[cuda][comm]") {
  require_gpu();
  for (int64_t world : {2, 3, 4}) {
    INFO("world=" << world);
    const int64_t n = 4099;
    std::vector<at::Tensor> wire(world), native(world);
    std::vector<std::string> nccl_error(world);
    run_ranks_in_threads(
        world,
        [&](Communicator& comm) {
          const auto x = randn({n}, 100 + comm.rank()).to(at::kFloat).to(kCuda);
          auto a = x.clone();
          comm.all_reduce(a, AllReduceStrategy::kNcclBf16Wire);
          wire[comm.rank()] = a.cpu();
          auto b = x.clone();
          comm.all_reduce(b);  // auto: the group's own (Gloo through host memory)
          native[comm.rank()] = b.cpu();
          auto c = x.clone();
          try {
            comm.all_reduce(c, AllReduceStrategy::kNccl);
          } catch (const c10::Error& e) {
            nccl_error[comm.rank()] = e.what_without_backtrace();
          }
        },
        test::test_comm_options());
    // bf16 wire: each contribution rounded to bf16, summed in fp32 in rank order.
    auto expect = randn({n}, 100).to(at::kFloat).to(at::kBFloat16).to(at::kFloat);
    for (int64_t r = 1; r < world; ++r) expect += randn({n}, 100 + r).to(at::kFloat).to(at::kBFloat16).to(at::kFloat);
    at::Tensor ref = randn({n}, 100);
    for (int64_t r = 1; r < world; ++r) ref = ref + randn({n}, 100 + r);
    for (int64_t r = 0; r < world; ++r) {
      INFO("rank " << r);
      CHECK(at::equal(wire[r], expect));
      CHECK(at::equal(wire[r], wire[0]));
      CHECK(test::relative_error(wire[r], ref) <= 2e-2);
      CHECK(test::relative_error(native[r], ref) <= 1e-5);
      CHECK_THAT(nccl_error[r], Catch::Contains("needs an NCCL group"));
    }
  }
}

#if TP_WITH_CUDA
TEST_CASE("CUDA graphs: a row-parallel forward and an NCCL allreduce capture and replay", "[cuda][comm][layers]") {
  require_gpu();
  const int64_t in = 512, out = 256, tokens = 8;
  const auto w = (randn({out, in}, 200) * 0.05).to(at::kBFloat16);
  const auto b = randn({out}, 201).to(at::kBFloat16);
  Checkpoint ckpt;
  ckpt.add("down.weight", w);
  ckpt.add("down.bias", b);
  for (auto backend : {NcclBackend::kProcessGroupNccl, NcclBackend::kRaw}) {
    INFO("backend " << (backend == NcclBackend::kRaw ? "raw" : "c10d"));
    auto comm = make_nccl_communicator(c10::make_intrusive<c10d::HashStore>(), 0, 1, no_verify(), backend);
    RowParallelLinear down(
        RowParallelLinearOptions(in, out).dtype(at::kBFloat16).device(kCuda).input_is_parallel(false), comm);
    down->load_weights(ckpt, "down");
    auto group = comm.process_group();
    auto static_x = at::zeros({tokens, in}, at::TensorOptions(kCuda).dtype(at::kBFloat16));
    const auto stream = c10::cuda::getStreamFromPool();
    const c10::cuda::CUDAStreamGuard guard(stream);
    auto step = [&] {
      auto y = down->forward(static_x);
      // The reduction a TP > 1 forward ends with, on the same stream (at world 1 the
      // Communicator skips it, so it is called on the NCCL group directly).
      auto y32 = y.to(at::kFloat);
      std::vector<at::Tensor> ts{y32};
      group->allreduce(ts, c10d::AllreduceOptions())->wait();
      return y32;
    };
    step();  // warm-up outside the capture: NCCL init, cuBLASLt heuristics, workspace
    stream.synchronize();
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    auto y_graph = step();
    graph.capture_end();
    for (uint64_t seed : {202, 203}) {
      INFO("replay with seed " << seed);
      const auto x = randn({tokens, in}, seed).to(at::kBFloat16);
      static_x.copy_(x.to(kCuda));
      graph.replay();
      stream.synchronize();
      const auto ref = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
      CHECK(test::relative_error(y_graph.cpu(), ref) <= 2 * test::tolerance(at::kBFloat16));
      CHECK(at::equal(y_graph, step()));
    }
  }
}
#endif
