// One rank as its own process, for the tests that launch real processes
// (tests/comm/process_launch_test.cpp). Usage: tp_process_worker MODE
//
// The rank comes from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT). A mode prints "rank R ok" and returns 0 when every check passes;
// on any error the worker prints it to stderr and exits 1 (never aborts). To add a
// mode, write `int run_xxx()` and add it to modes().

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include "tp/comm/all_reduce_fusion.h"
#include "tp/comm/communicator.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/loader/checkpoint.h"

namespace {

at::Tensor random_tensor(uint64_t seed, at::IntArrayRef shape, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

/// FNV-1a over a contiguous tensor's bytes.
int64_t bytes_hash(const at::Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  uint64_t h = 14695981039346656037ull;
  for (int64_t i = 0; i < t.numel() * static_cast<int64_t>(t.element_size()); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h);
}

/// all_reduce, an uneven all_gather and a barrier over a TCP-store Gloo group.
int run_comm() {
  tp::Communicator comm = tp::communicator_from_env();
  const int64_t rank = comm.rank();
  const int64_t world = comm.world_size();
  constexpr uint64_t kSeed = 20240611;

  // all_reduce: every rank regenerates every rank's input for the reference.
  at::Tensor t = random_tensor(kSeed + rank, {13, 7}, at::kFloat);
  comm.all_reduce(t);
  at::Tensor expected = at::zeros({13, 7}, at::kDouble);
  for (int64_t r = 0; r < world; ++r) expected += random_tensor(kSeed + r, {13, 7}, at::kFloat).to(at::kDouble);
  TORCH_CHECK(at::allclose(t.to(at::kDouble), expected, 1e-5, 1e-5),
              "all_reduce: result differs from the float64 reference by up to ",
              (t.to(at::kDouble) - expected).abs().max().item<double>());

  // all_gather: rank r holds r + 1 rows, the last rank none.
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < world; ++r) sizes.push_back(r == world - 1 ? 0 : r + 1);
  auto piece = [&](int64_t r) { return random_tensor(kSeed + 1000 + r, {sizes[r], 5}, at::kFloat); };
  at::Tensor gathered = comm.all_gather(piece(rank), 0, sizes);
  std::vector<at::Tensor> pieces;
  for (int64_t r = 0; r < world; ++r) pieces.push_back(piece(r));
  TORCH_CHECK(at::equal(gathered, at::cat(pieces, 0)), "all_gather: result of shape ", gathered.sizes(),
              " differs from the concatenated inputs");

  comm.barrier();
  std::cout << "rank " << rank << " ok" << std::endl;
  return 0;
}

/// The shared-memory strategies and recursive doubling across processes (float32 and
/// bfloat16, a chunked size included) vs the float64 sum, bf16 wire precision within
/// its bound, bitwise agreement across ranks, auto on one host, and rank 0's segment
/// already unlinked.
int run_shm() {
  tp::Communicator comm = tp::communicator_from_env();
  const int64_t rank = comm.rank();
  const int64_t world = comm.world_size();
  TORCH_CHECK(comm.ranks_on_one_host(), "shm: a loopback MASTER_ADDR should mean ranks_on_one_host");
  constexpr uint64_t kSeed = 4242;
  const int64_t chunked = (int64_t{2} << 20) / 4 + 5;  // past one 2 MiB buffer
  int64_t calls = 0;
  const std::vector<tp::AllReduceStrategy> strategies = {tp::AllReduceStrategy::kSharedMemoryOneShot,
                                                         tp::AllReduceStrategy::kSharedMemoryTwoShot,
                                                         tp::AllReduceStrategy::kRecursiveDoubling};
  for (auto strategy : strategies) {
    for (auto wire : {tp::WirePrecision::kNative, tp::WirePrecision::kBFloat16}) {
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        for (int64_t n : {int64_t{1}, int64_t{1000}, chunked}) {
          at::Tensor t = random_tensor(kSeed + n + rank, {n}, dtype);
          comm.all_reduce(t, strategy, wire);
          ++calls;
          at::Tensor expected = at::zeros({n}, at::kDouble);
          at::Tensor magnitude = at::zeros({n}, at::kDouble);
          for (int64_t r = 0; r < world; ++r) {
            const at::Tensor x = random_tensor(kSeed + n + r, {n}, dtype).to(at::kDouble);
            expected += x;
            magnitude += x.abs();
          }
          const at::Tensor err = (t.to(at::kDouble) - expected).abs();
          if (wire == tp::WirePrecision::kBFloat16 && dtype == at::kFloat) {
            // The bound documented at tp::WirePrecision, with L = 2 (covers one-shot's
            // 1 and, up to world 4, recursive doubling's ceil(log2 world)).
            const at::Tensor bound =
                magnitude * (2 * std::ldexp(1.0, -8) * (1 + std::ldexp(1.0, -6)) + world * std::ldexp(1.0, -24));
            TORCH_CHECK(at::all(err <= bound).item<bool>(), "shm: ", strategy, " bf16 wire numel ", n,
                        " exceeds the documented bound: max err/S ", (err / magnitude).max().item<double>());
          } else {
            const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
            TORCH_CHECK(at::allclose(t.to(at::kDouble), expected, tol, tol), "shm: ", strategy, " ", dtype, " numel ",
                        n, " differs from the float64 reference by up to ", err.max().item<double>());
          }
          // Bitwise identical across ranks: every rank's hash of its bytes equals rank 0's.
          const at::Tensor hash = at::tensor({bytes_hash(t)}, at::kLong);
          const at::Tensor all = comm.all_gather(hash, 0, std::vector<int64_t>(world, 1));
          TORCH_CHECK(at::equal(all, hash.expand({world})), "shm: ", strategy, " ", wire, " ", dtype, " numel ", n,
                      ": the ranks' results differ");
        }
      }
    }
  }
  const auto counts = comm.all_reduce_counts();
  for (auto strategy : strategies) {
    TORCH_CHECK(counts.at(strategy) == calls / 3, "shm: ", strategy, " counted ", counts.at(strategy), " times, not ",
                calls / 3);
  }
  // Auto on one host takes shared memory.
  at::Tensor small = at::ones({256});
  const auto chosen = comm.resolve_all_reduce(small);
  TORCH_CHECK(
      chosen == tp::AllReduceStrategy::kSharedMemoryOneShot || chosen == tp::AllReduceStrategy::kSharedMemoryTwoShot,
      "shm: auto took ", chosen, " for 1 KiB on one host");
  if (rank == 0) {
    const std::string prefix = "tp-" + std::to_string(::getpid()) + "-";
    DIR* dir = ::opendir("/dev/shm");
    while (dir != nullptr) {
      const dirent* e = ::readdir(dir);
      if (e == nullptr) break;
      TORCH_CHECK(std::string(e->d_name).rfind(prefix, 0) != 0, "shm: segment /dev/shm/", e->d_name,
                  " is still linked");
    }
    if (dir != nullptr) ::closedir(dir);
  }
  comm.barrier();
  std::cout << "rank " << rank << " ok" << std::endl;
  return 0;
}

/// Rank 1 exits without a word (no destructors run) after one shared-memory
/// all_reduce; rank 0's next one must fail at once, naming it, not after the timeout.
int run_shm_peer_exits() {
  tp::Communicator comm = tp::communicator_from_env();
  at::Tensor t = at::ones({64});
  comm.all_reduce(t, tp::AllReduceStrategy::kSharedMemoryOneShot);
  if (comm.rank() != 0) std::_Exit(0);
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    comm.all_reduce(t, tp::AllReduceStrategy::kSharedMemoryOneShot);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  TORCH_CHECK(error.find("rank 1 is gone (its process, pid") != std::string::npos,
              "shm_peer_exits: expected rank 0's all_reduce to name the exited rank 1; got: '", error, "'");
  TORCH_CHECK(seconds < 5.0, "shm_peer_exits: rank 0 failed only after ", seconds, " s");
  std::cout << "rank 0 ok" << std::endl;
  return 0;
}

/// The names in /dev/shm that start with `prefix`.
std::vector<std::string> shm_names(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = ::opendir("/dev/shm");
  while (dir != nullptr) {
    const dirent* e = ::readdir(dir);
    if (e == nullptr) break;
    if (std::string(e->d_name).rfind(prefix, 0) == 0) names.push_back(e->d_name);
  }
  if (dir != nullptr) ::closedir(dir);
  return names;
}

/// Rank 0 is killed (SIGKILL, by rank 1) the moment its shared-memory segment appears,
/// while rank 1 is still joining: rank 1's all_reduce must fail, and leave no segment
/// of rank 0's behind (the name is unlinked by the surviving rank).
/// Exit code of shm_creator_killed when the kill missed the segment's setup: rank 1's
/// all_reduce finished before it saw the segment (a loaded machine can leave the killer
/// thread unscheduled for the whole setup). The test then runs the scenario again.
constexpr int kShmKillMissedWindow = 3;

int run_shm_creator_killed() {
  tp::Communicator comm = tp::communicator_from_env();
  const at::Tensor pid = at::tensor({static_cast<int64_t>(::getpid())}, at::kLong);
  const at::Tensor pids = comm.all_gather(pid, 0, std::vector<int64_t>(comm.world_size(), 1));
  const auto pid0 = static_cast<pid_t>(pids[0].item<int64_t>());
  const std::string prefix = "tp-" + std::to_string(pid0) + "-";
  std::atomic<bool> finished{false};
  std::thread killer;
  if (comm.rank() == 1) {
    // Kills rank 0 as soon as its segment exists, i.e. inside the setup (the name is unlinked
    // once every rank has mapped it); gives up once this rank's all_reduce has returned.
    killer = std::thread([&] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!finished.load() && std::chrono::steady_clock::now() < deadline) {
        if (!shm_names(prefix).empty()) {
          ::kill(pid0, SIGKILL);
          return;
        }
        std::this_thread::yield();
      }
    });
  }
  at::Tensor t = at::ones({64});
  std::string error;
  try {
    comm.all_reduce(t, tp::AllReduceStrategy::kSharedMemoryOneShot);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  finished.store(true);
  if (killer.joinable()) killer.join();
  if (comm.rank() == 1 && error.empty()) {
    ::kill(pid0, SIGKILL);  // the scenario did not happen; rank 0 is not needed any more
    std::cout << "rank 1 missed the window: its all_reduce completed before rank 0's segment was seen" << std::endl;
    return kShmKillMissedWindow;
  }
  TORCH_CHECK(comm.rank() == 1, "shm_creator_killed: rank 0 outlived its SIGKILL");
  const auto left = shm_names(prefix);
  TORCH_CHECK(left.empty(), "shm_creator_killed: /dev/shm/", left.empty() ? "" : left.front(),
              " of the killed rank 0 is still linked (rank 1's error: ", error, ")");
  std::cout << "rank 1 ok (its all_reduce failed: " << error.substr(0, 120) << ")" << std::endl;
  return 0;
}

/// A Llama MLP (gate_up -> SiLU(gate) * up -> down) and a gathered column layer,
/// each rank loading its shard of the same global weights, vs one-device float64.
int run_mlp() {
  tp::Communicator comm = tp::communicator_from_env();
  constexpr uint64_t kSeed = 777;
  const int64_t hidden = 40, inter = 136, tokens = 3;  // 136 / 8 = 17 units: uneven at 2 and 3 ranks
  tp::Checkpoint ckpt;
  const auto wg = random_tensor(kSeed + 1, {inter, hidden}, at::kDouble) * 0.2;
  const auto wu = random_tensor(kSeed + 2, {inter, hidden}, at::kDouble) * 0.2;
  const auto wd = random_tensor(kSeed + 3, {hidden, inter}, at::kDouble) * 0.1;
  const auto bd = random_tensor(kSeed + 4, {hidden}, at::kDouble);
  ckpt.add("mlp.gate_proj.weight", wg);
  ckpt.add("mlp.up_proj.weight", wu);
  ckpt.add("mlp.down_proj.weight", wd);
  ckpt.add("mlp.down_proj.bias", bd);
  const auto x = random_tensor(kSeed, {tokens, hidden}, at::kDouble);
  const auto reference = at::linear(at::silu(at::linear(x, wg)) * at::linear(x, wu), wd, bd);

  const auto split = tp::SplitPolicy{}.with_granularity(8);
  tp::GateUpParallelLinear gate_up(tp::GateUpParallelLinearOptions(hidden, inter).dtype(at::kDouble).split(split),
                                   comm);
  tp::RowParallelLinear down(tp::RowParallelLinearOptions(inter, hidden).dtype(at::kDouble).split(split), comm);
  gate_up->load_weights(ckpt, "mlp");
  down->load_weights(ckpt, "mlp.down_proj");
  auto [gate, up] = gate_up->split(gate_up->forward(x));
  const auto y = down->forward(at::silu(gate) * up);
  const double err = (y - reference).abs().max().item<double>();
  TORCH_CHECK(err < 1e-12, "mlp: rank ", comm.rank(), " differs from the reference by ", err);

  tp::ColumnParallelLinear fc(
      tp::ColumnParallelLinearOptions(hidden, inter).dtype(at::kDouble).gather_output(true).bias(false), comm);
  fc->load_weights(ckpt, "mlp.up_proj");
  const double fc_err = (fc->forward(x) - at::linear(x, wu)).abs().max().item<double>();
  TORCH_CHECK(fc_err < 1e-12, "gathered column: rank ", comm.rank(), " differs from the reference by ", fc_err);
  comm.barrier();
  std::cout << "rank " << comm.rank() << " ok" << std::endl;
  return 0;
}

/// all_reduce_fusion across processes: on the shared-memory strategies (the fused pass
/// through a segment other processes map) and recursive doubling, bf16 with a bias, a
/// residual, RMSNorm and FP8 quantization, 37 tokens (not a multiple of 2 or 3):
/// residual_out is the unfused sum bit for bit, the norm within bf16's rounding, and
/// every rank has the same bytes.
int run_fusion() {
  tp::Communicator comm = tp::communicator_from_env();
  const int64_t rank = comm.rank(), world = comm.world_size();
  constexpr uint64_t kSeed = 5151;
  const int64_t m = 37, hidden = 200;
  const at::Tensor partial = random_tensor(kSeed + rank, {m, hidden}, at::kBFloat16);
  const at::Tensor bias = random_tensor(kSeed + 100, {hidden}, at::kBFloat16);
  const at::Tensor residual = random_tensor(kSeed + 101, {m, hidden}, at::kBFloat16);
  const at::Tensor w = random_tensor(kSeed + 102, {hidden}, at::kBFloat16);
  for (auto strategy : {tp::AllReduceStrategy::kSharedMemoryOneShot, tp::AllReduceStrategy::kSharedMemoryTwoShot,
                        tp::AllReduceStrategy::kRecursiveDoubling}) {
    tp::AllReduceFusionParams p;
    p.bias = bias;
    p.residual_in = residual;
    p.norm = tp::AllReduceFusionNorm::kRMS;
    p.norm_weight = w;
    p.eps = 1e-5;
    p.quant_out = tp::AllReduceFusionQuant::kFp8PerToken;
    p.strategy = strategy;
    const auto r = comm.all_reduce_fusion(partial, p);
    at::Tensor h = rank == 0 ? partial + bias : partial.clone();  // rank 0 adds the bias
    comm.all_reduce(h, strategy);
    h = h + residual;
    TORCH_CHECK(at::equal(r.residual_out, h), "fusion: ", strategy, ": residual_out differs from the unfused sum");
    const at::Tensor f = h.to(at::kFloat);
    const at::Tensor y = w * (f * at::rsqrt(f.pow(2).mean(-1, true) + 1e-5)).to(at::kBFloat16);
    TORCH_CHECK(at::allclose(r.norm_out.to(at::kFloat), y.to(at::kFloat), 1.6e-2, 1.6e-2), "fusion: ", strategy,
                ": norm_out differs from the unfused norm by ",
                (r.norm_out.to(at::kFloat) - y.to(at::kFloat)).abs().max().item<float>());
    const at::Tensor dq = r.quant_out.to(at::kFloat) * r.scale_out;
    TORCH_CHECK(at::allclose(dq, r.norm_out.to(at::kFloat), 0.07, 1e-3), "fusion: ", strategy,
                ": quant_out * scale_out is not norm_out within FP8's rounding");
    const at::Tensor hash =
        at::tensor({bytes_hash(r.residual_out), bytes_hash(r.norm_out), bytes_hash(r.quant_out)}, at::kLong);
    const at::Tensor all = comm.all_gather(hash.view({1, 3}), 0, std::vector<int64_t>(world, 1));
    TORCH_CHECK(at::equal(all, hash.view({1, 3}).expand({world, 3})), "fusion: ", strategy,
                ": the ranks' results differ");
  }
  comm.barrier();
  std::cout << "rank " << rank << " ok" << std::endl;
  return 0;
}

const std::map<std::string, std::function<int()>>& modes() {
  static const std::map<std::string, std::function<int()>> kModes = {
      {"comm", run_comm},
      {"fusion", run_fusion},
      {"mlp", run_mlp},
      {"shm", run_shm},
      {"shm_creator_killed", run_shm_creator_killed},
      {"shm_peer_exits", run_shm_peer_exits},
  };
  return kModes;
}

std::string mode_names() {
  std::string names;
  for (const auto& [name, fn] : modes()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || modes().count(argv[1]) == 0) {
    std::cerr << "usage: " << argv[0] << " MODE   (modes: " << mode_names() << ")" << std::endl;
    return 2;
  }
  const std::string mode = argv[1];
  const char* rank = std::getenv("RANK");
  const std::string who = "tp_process_worker " + mode + " (RANK=" + (rank ? rank : "unset") + ")";
  try {
    return modes().at(mode)();
  } catch (const c10::Error& e) {
    std::cerr << who << ": " << e.what_without_backtrace() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << who << ": " << e.what() << std::endl;
  } catch (...) {
    std::cerr << who << ": unknown exception" << std::endl;
  }
  return 1;
}
