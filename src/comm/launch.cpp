#include "tp/comm/launch.h"

#include <chrono>
#include <csignal>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>
#include <signal.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/communicator_state.h"
#include "common/env.h"

namespace tp {
namespace {

using GlooDevice = std::shared_ptr<::gloo::transport::Device>;

void check_rank_world(const char* fn, int64_t rank, int64_t world) {
  TORCH_CHECK_VALUE(world >= 1, fn, ": world_size=", world, "; expected at least 1");
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, fn, ": invalid rank ", rank, " (rank should be in the 0..", world - 1,
                    " range)");
}

void check_timeout(const char* fn, const CommunicatorOptions& options) {
  TORCH_CHECK_VALUE(options.timeout.count() > 0, fn, ": options.timeout=", options.timeout.count(),
                    " ms; expected a positive number of milliseconds");
}

/// Gloo writes to its peers' sockets without MSG_NOSIGNAL in places: when a peer has
/// died, the write raises SIGPIPE, whose default action kills this whole process,
/// instead of the error the collective should throw. Python ignores SIGPIPE at
/// start-up, which is why torch.distributed users never see this; a C++ program
/// does not. So the first group we create ignores SIGPIPE, unless the program has
/// installed a handler of its own (which is then left alone).
void ignore_sigpipe_unless_handled() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      std::signal(SIGPIPE, SIG_IGN);
    }
  });
}

Communicator make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world,
                       const CommunicatorOptions& options, const GlooDevice& device) {
  ignore_sigpipe_unless_handled();
  detail::check_settings(options);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices = {device};
  // Connects to every peer before returning (the full mesh is set up eagerly, unless
  // TORCH_GLOO_LAZY_INIT is set).
  c10::intrusive_ptr<c10d::ProcessGroupGloo> backend;
  try {
    backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(world),
                                                          gloo_options);
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    TORCH_CHECK(false, "tp::make_gloo_communicator: rank ", rank, " of world_size ", world,
                " could not connect to its peers within ", options.timeout.count(),
                " ms (did every rank start, with the same world_size?): ",
                c10_error ? c10_error->what_without_backtrace() : e.what());
  }
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, static_cast<int>(rank), static_cast<int>(world));
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  // Gloo serves CUDA tensors too (through host memory): register it for both, so
  // ranks as threads on one GPU work without NCCL.
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    group->setBackend(device, c10d::ProcessGroup::BackendType::GLOO, c10::intrusive_ptr<c10d::Backend>(backend));
  }
  // Its closing barrier below is the ranks' first collective: they exchange host ids there.
  Communicator comm(group, options);
  // Gloo's constructor can return on one rank while a peer is still finishing its
  // side of the handshake; if this rank then closed its group early (a short-lived
  // communicator), that peer would wait for a connection that never completes.
  // A barrier here means: every rank is fully connected when this returns.
  comm.barrier();
  return comm;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1" || addr == "[::1]";
}

/// The value of a variable torchrun sets, parsed as an integer.
int64_t env_int(const char* name, const char* meaning) {
  const auto v = detail::env_value(name);
  TORCH_CHECK_VALUE(v, "tp::communicator_from_env: ", name, " is not set; expected ", meaning,
                    " (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
  const auto n = detail::parse_int64(*v);
  TORCH_CHECK_VALUE(n, "tp::communicator_from_env: ", name, "='", *v, "' is not an integer; expected ", meaning);
  return *n;
}

/// A failure of one rank in run_ranks_in_threads, kept until every thread is joined.
struct RankFailure {
  enum class Kind { kError, kValue, kType, kIndex, kNotImplemented };
  int64_t rank = 0;
  Kind kind = Kind::kError;
  std::string message;
};

[[noreturn]] void rethrow(const RankFailure& f) {
  switch (f.kind) {
    case RankFailure::Kind::kValue: TORCH_CHECK_VALUE(false, "rank ", f.rank, ": ", f.message);
    case RankFailure::Kind::kType: TORCH_CHECK_TYPE(false, "rank ", f.rank, ": ", f.message);
    case RankFailure::Kind::kIndex: TORCH_CHECK_INDEX(false, "rank ", f.rank, ": ", f.message);
    case RankFailure::Kind::kNotImplemented: TORCH_CHECK_NOT_IMPLEMENTED(false, "rank ", f.rank, ": ", f.message);
    case RankFailure::Kind::kError: break;
  }
  TORCH_CHECK(false, "rank ", f.rank, ": ", f.message);
}

}  // namespace

Communicator make_gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world,
                                    CommunicatorOptions options) {
  const char* fn = "tp::make_gloo_communicator";
  TORCH_CHECK_VALUE(store, fn, ": the store is null");
  check_rank_world(fn, rank, world);
  check_timeout(fn, options);
  // Bound to 127.0.0.1, the ranks can only reach each other on this host.
  return make_gloo(store, rank, world, options, c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
}

void run_ranks_in_threads(int64_t world, const std::function<void(Communicator&)>& fn, CommunicatorOptions options) {
  const char* name = "tp::run_ranks_in_threads";
  TORCH_CHECK_VALUE(world >= 1, name, ": world_size=", world, "; expected at least 1");
  TORCH_CHECK_VALUE(fn, name, ": fn is empty");
  check_timeout(name, options);

  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(options.timeout);  // a rank that never shows up fails the rendezvous

  std::mutex mutex;
  std::optional<RankFailure> first;  // guarded by mutex; the earliest failure in time
  auto record = [&](int64_t rank, RankFailure::Kind kind, std::string message) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!first) first = RankFailure{rank, kind, std::move(message)};
  };

  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      // The group outlives the catch: a failing rank records its error before closing
      // its connections, which is what its blocked peers then fail on.
      std::unique_ptr<Communicator> comm;
      using Kind = RankFailure::Kind;
      try {
        comm = std::make_unique<Communicator>(make_gloo_communicator(store, r, world, options));
        fn(*comm);
        // No rank closes its connections while a peer may still be using them.
        comm->barrier();
      } catch (const c10::ValueError& e) {
        record(r, Kind::kValue, e.what_without_backtrace());
      } catch (const c10::TypeError& e) {
        record(r, Kind::kType, e.what_without_backtrace());
      } catch (const c10::IndexError& e) {
        record(r, Kind::kIndex, e.what_without_backtrace());
      } catch (const c10::NotImplementedError& e) {
        record(r, Kind::kNotImplemented, e.what_without_backtrace());
      } catch (const c10::Error& e) {
        record(r, Kind::kError, e.what_without_backtrace());
      } catch (const std::exception& e) {
        record(r, Kind::kError, e.what());
      } catch (...) {
        record(r, Kind::kError, "unknown exception (not derived from std::exception)");
      }
      comm.reset();
    });
  }
  for (auto& t : threads) t.join();
  if (first) rethrow(*first);
}

Communicator connect_tcp(const std::string& master_addr, int port, int64_t rank, int64_t world,
                         CommunicatorOptions options) {
  const char* fn = "tp::connect_tcp";
  TORCH_CHECK_VALUE(!master_addr.empty(), fn, ": master_addr is empty");
  TORCH_CHECK_VALUE(port >= 1 && port <= 65535, fn, ": invalid port ", port, " (port should be in the 1..65535 range)");
  check_rank_world(fn, rank, world);
  check_timeout(fn, options);

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(port);
  store_options.isServer = rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(world);
  store_options.waitWorkers = true;
  store_options.timeout = options.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(master_addr, store_options);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, fn, ": rank ", rank, " of world_size ", world, " could not set up the TCP store at ",
                master_addr, ":", port, " within ", options.timeout.count(), " ms (",
                rank == 0 ? "hosting it" : "connecting to it",
                "; is every rank started, and is the port free on the master?): ", e.what_without_backtrace());
  }
  // Over loopback bind to 127.0.0.1; otherwise to the address this host's name
  // resolves to, so peers on other machines can reach it.
  GlooDevice device = is_loopback(master_addr) ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                               : c10d::ProcessGroupGloo::createDefaultDevice();
  return make_gloo(store, rank, world, options, device);
}

Communicator communicator_from_env(CommunicatorOptions options) {
  const int64_t rank = env_int("RANK", "this process's rank, an integer in 0..WORLD_SIZE-1");
  const int64_t world = env_int("WORLD_SIZE", "the number of ranks, an integer >= 1");
  const auto addr = detail::env_value("MASTER_ADDR");
  TORCH_CHECK_VALUE(addr,
                    "tp::communicator_from_env: MASTER_ADDR is not set; expected the "
                    "address of rank 0's host (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR "
                    "and MASTER_PORT)");
  const int64_t port = env_int("MASTER_PORT", "the TCP port rank 0 listens on, in 1..65535");
  TORCH_CHECK_VALUE(world >= 1, "tp::communicator_from_env: WORLD_SIZE=", world, "; expected at least 1");
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, "tp::communicator_from_env: RANK=", rank,
                    " is out of range for WORLD_SIZE=", world, " (RANK should be in the 0..", world - 1, " range)");
  TORCH_CHECK_VALUE(port >= 1 && port <= 65535, "tp::communicator_from_env: MASTER_PORT=", port,
                    " is out of range (MASTER_PORT should be in the 1..65535 range)");
  return connect_tcp(*addr, static_cast<int>(port), rank, world, options);
}

}  // namespace tp
