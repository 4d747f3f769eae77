// What kAuto resolves to: the selector's golden cases at every threshold of the
// built-in table and of a loaded one, the same answer on every rank, forced and
// impossible choices, host detection (ranks on different hosts never take shared
// memory), loading and validating tuning tables, and the debug log.

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "support/comm_test_util.h"

using Catch::Contains;
using tp::AllReduceRule;
using tp::AllReduceStrategy;
using tp::AllReduceTable;
using tp::AllReduceTableEntry;
using tp::Communicator;
using tp::CommunicatorOptions;
using namespace tp::comm_test;

namespace {

constexpr auto kPg = AllReduceStrategy::kProcessGroup;
constexpr auto kRd = AllReduceStrategy::kRecursiveDoubling;
constexpr auto kOne = AllReduceStrategy::kSharedMemoryOneShot;
constexpr auto kTwo = AllReduceStrategy::kSharedMemoryTwoShot;

/// A file under /tmp removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char name[] = "/tmp/tp-table-XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    ::close(fd);
    path_ = name;
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const char* kGoodTable = R"({
  "format": "tp-allreduce-table", "version": 1, "note": "hand-written for the tests",
  "entries": [
    {"device": "cpu", "world_size": 2, "same_host": true,
     "rules": [{"max_bytes": 100, "strategy": "shm_two_shot"},
               {"max_bytes": 1000, "strategy": "recursive_doubling"},
               {"max_bytes": 4096, "strategy": "shm_one_shot"},
               {"max_bytes": null, "strategy": "process_group"}],
     "measured_us": {"1024": {"process_group": 300.5, "shm_one_shot": 4.25}}},
    {"device": "cpu", "world_size": 3, "same_host": true,
     "rules": [{"max_bytes": null, "strategy": "recursive_doubling"}]},
    {"device": "cpu", "world_size": 2, "same_host": false,
     "rules": [{"max_bytes": 64, "strategy": "process_group"}, {"max_bytes": null, "strategy": "recursive_doubling"}]}
  ]
})";

/// Each rank's resolve_all_reduce over `tensors`, as threads of a world-`world` group.
std::vector<std::vector<AllReduceStrategy>> resolve_on_every_rank(int64_t world, const std::vector<at::Tensor>& tensors,
                                                                  CommunicatorOptions options) {
  std::vector<std::vector<AllReduceStrategy>> out(world);
  tp::run_ranks_in_threads(
      world,
      [&](Communicator& comm) {
        for (const auto& t : tensors) out[comm.rank()].push_back(comm.resolve_all_reduce(t));
      },
      options);
  return out;
}

/// A group of ranks as threads with one options object per rank (run_ranks_in_threads
/// shares one), e.g. to give ranks different host ids.
void run_with_options(const std::vector<CommunicatorOptions>& options, const std::function<void(Communicator&)>& fn,
                      std::vector<std::string>& errors) {
  const int64_t world = static_cast<int64_t>(options.size());
  auto store = c10::make_intrusive<c10d::HashStore>();
  errors.assign(world, "");
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      errors[r] = error_of([&] {
        Communicator comm = tp::make_gloo_communicator(store, r, world, options[r]);
        fn(comm);
        comm.barrier();
      });
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("the built-in table: auto takes each rule's strategy up to its threshold and the next one after", "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  EnvGuard no_table("TP_ALLREDUCE_TABLE", std::nullopt);
  const AllReduceTable& table = AllReduceTable::builtin();
  REQUIRE_NOTHROW(table.validate());
  for (int64_t world : {2, 3, 4}) {
    const AllReduceTableEntry* entry = table.find(world, /*same_host=*/true);
    REQUIRE(entry != nullptr);
    // Golden cases: threshold +-1 float32 element, and in bytes with a 1-byte dtype... as
    // every dtype sees the rule in bytes: float32 and bfloat16 at the threshold.
    std::vector<at::Tensor> tensors;
    std::vector<AllReduceStrategy> expected;
    for (size_t k = 0; k < entry->rules.size(); ++k) {
      const AllReduceRule& rule = entry->rules[k];
      if (rule.max_bytes < 0) continue;
      const AllReduceStrategy next = entry->rules[k + 1].strategy;
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        const int64_t at_threshold = rule.max_bytes / c10::elementSize(dtype);
        tensors.push_back(at::empty({at_threshold - 1}, dtype));
        expected.push_back(rule.strategy);
        tensors.push_back(at::empty({at_threshold}, dtype));
        expected.push_back(rule.strategy);
        tensors.push_back(at::empty({at_threshold + 1}, dtype));
        expected.push_back(next);
      }
    }
    tensors.push_back(at::empty({1}, at::kLong));  // shared memory reduces no int64
    expected.push_back(kPg);
    tensors.push_back(at::empty({1}, at::kInt));  // but int32 (invariant numerics' float bits)
    expected.push_back(entry->rules.front().strategy);
    tensors.push_back(at::empty({0}, at::kFloat));
    expected.push_back(entry->rules.front().strategy);
    const auto got = resolve_on_every_rank(world, tensors, test_options());
    for (int64_t rank = 0; rank < world; ++rank) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        INFO("world=" << world << " rank=" << rank << " numel=" << tensors[i].numel() << " dtype="
                      << tensors[i].scalar_type() << " bytes=" << tensors[i].numel() * tensors[i].element_size());
        CHECK(got[rank][i] == expected[i]);
      }
      CHECK(got[rank] == got[0]);  // the same answer on every rank
    }
  }
}

TEST_CASE("a loaded table drives auto at its thresholds, and unlisted world sizes take the nearest smaller entry",
          "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  EnvGuard no_table("TP_ALLREDUCE_TABLE", std::nullopt);
  TempFile file(kGoodTable);
  CommunicatorOptions options = test_options();
  options.all_reduce_table = file.path();
  const std::vector<int64_t> bytes = {4, 100, 104, 1000, 1004, 4096, 4100, 1 << 20};
  const std::vector<AllReduceStrategy> expected = {kTwo, kTwo, kRd, kRd, kOne, kOne, kPg, kPg};
  std::vector<at::Tensor> tensors;
  for (int64_t b : bytes) tensors.push_back(at::empty({b / 4}, at::kFloat));
  SECTION("the option") {
    const auto got = resolve_on_every_rank(2, tensors, options);
    for (int64_t rank = 0; rank < 2; ++rank) {
      for (size_t i = 0; i < bytes.size(); ++i) {
        INFO("rank=" << rank << " bytes=" << bytes[i]);
        CHECK(got[rank][i] == expected[i]);
      }
    }
  }
  SECTION("TP_ALLREDUCE_TABLE") {
    EnvGuard env("TP_ALLREDUCE_TABLE", file.path());
    const auto got = resolve_on_every_rank(2, tensors, test_options());
    CHECK(got[0] == expected);
    CHECK(got[1] == expected);
  }
  SECTION("world 4 uses the world-3 entry; world 8 too") {
    for (int64_t world : {4, 8}) {
      const auto got = resolve_on_every_rank(world, tensors, options);
      for (int64_t rank = 0; rank < world; ++rank) {
        CHECK(got[rank] == std::vector<AllReduceStrategy>(bytes.size(), kRd));
      }
    }
  }
  SECTION("a forced strategy wins over the table; world 1 and integers take the process group") {
    options.all_reduce = kOne;
    const auto got = resolve_on_every_rank(2, tensors, options);
    CHECK(got[0] == std::vector<AllReduceStrategy>(bytes.size(), kOne));
    Communicator solo;
    CHECK(solo.resolve_all_reduce(at::empty({10})) == kPg);
    CHECK(solo.resolve_all_reduce(at::empty({10}), kRd) == kRd);
  }
}

TEST_CASE("tuning tables round-trip through JSON, and a bad one is an error naming the file and the problem",
          "[comm]") {
  const AllReduceTable good = AllReduceTable::parse(kGoodTable, "good.json");
  REQUIRE(good.entries.size() == 3);
  CHECK(good.entries[0].rules.size() == 4);
  CHECK(good.entries[0].rules[3].max_bytes == -1);
  CHECK(good.entries[2].same_host == false);
  CHECK(good.find(2, false)->rules[0].strategy == kPg);
  CHECK(good.find(7, true)->world_size == 3);
  CHECK(good.find(1, true)->world_size == 2);  // smaller than every entry: the smallest
  CHECK(good.find(4, false)->world_size == 2);
  // to_json -> parse gives the same rules (measured_us is informational).
  AllReduceTable copy = AllReduceTable::parse(good.to_json("note"), "copy");
  REQUIRE(copy.entries.size() == good.entries.size());
  for (size_t i = 0; i < good.entries.size(); ++i) {
    CHECK(copy.entries[i].world_size == good.entries[i].world_size);
    CHECK(copy.entries[i].same_host == good.entries[i].same_host);
    REQUIRE(copy.entries[i].rules.size() == good.entries[i].rules.size());
    for (size_t k = 0; k < good.entries[i].rules.size(); ++k) {
      CHECK(copy.entries[i].rules[k].max_bytes == good.entries[i].rules[k].max_bytes);
      CHECK(copy.entries[i].rules[k].strategy == good.entries[i].rules[k].strategy);
    }
  }
  AllReduceTable builtin_copy = AllReduceTable::parse(AllReduceTable::builtin().to_json(), "builtin copy");
  CHECK(builtin_copy.entries.size() == AllReduceTable::builtin().entries.size());

  auto entry = [](const std::string& rules, const std::string& same_host = "true") {
    return std::string(R"({"format": "tp-allreduce-table", "version": 1, "entries": [{"device": "cpu", )") +
           R"("world_size": 2, "same_host": )" + same_host + R"(, "rules": )" + rules + "}]}";
  };
  struct Bad {
    std::string json;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {"{", "invalid JSON in the all-reduce table at byte 1"},
      {R"({"format": "something-else", "entries": []})", "\"format\" is \"something-else\""},
      {R"({"format": "tp-allreduce-table", "version": 2, "entries": []})", "version 2 is not supported"},
      {R"({"format": "tp-allreduce-table", "entries": []})", "no entries"},
      {R"({"format": "tp-allreduce-table", "entriez": []})", "unknown top-level key \"entriez\""},
      {R"({"entries": []})", "missing \"format\""},
      {entry(R"([{"max_bytes": 10, "strategy": "shm_one_shot"}])"),
       "the last rule must have max_bytes null (no limit), not 10"},
      {entry(R"([{"max_bytes": null, "strategy": "shm_one_shot"}, {"max_bytes": null, "strategy": "process_group"}])"),
       "max_bytes null (no limit) must be the last rule"},
      {entry(R"([{"max_bytes": 10, "strategy": "shm_one_shot"}, {"max_bytes": 10, "strategy": "shm_two_shot"}, )"
             R"({"max_bytes": null, "strategy": "process_group"}])"),
       "max_bytes 10 must be larger than the previous rule's 10"},
      {entry(R"([{"max_bytes": null, "strategy": "shm_two_shot"}])", "false"),
       "shm_two_shot needs every rank on one host, but this entry is for same_host false"},
      {entry(R"([{"max_bytes": null, "strategy": "auto"}])"), "strategy \"auto\" is not allowed in a table"},
      {entry(R"([{"max_bytes": null, "strategy": "carrier_pigeon"}])"), "unknown all-reduce strategy 'carrier_pigeon'"},
      {entry(R"([{"max_bytes": -5, "strategy": "process_group"}])"), "max_bytes must be a non-negative integer"},
      {entry(R"([{"strategy": "process_group"}])"), "missing \"max_bytes\""},
      {entry(R"([])"), "rules is empty"},
      {entry(R"([{"max_bytes": null, "strategy": "process_group", "speed": 3}])"), "unknown key \"speed\""},
      {R"({"format": "tp-allreduce-table", "entries": [{"device": "cuda", "world_size": 2, "same_host": true, )"
       R"("rules": [{"max_bytes": null, "strategy": "process_group"}]}]})",
       "device \"cuda\" is not supported"},
      {R"({"format": "tp-allreduce-table", "entries": [)"
       R"({"world_size": 2, "same_host": true, "rules": [{"max_bytes": null, "strategy": "process_group"}]}, )"
       R"({"world_size": 2, "same_host": true, "rules": [{"max_bytes": null, "strategy": "process_group"}]}]})",
       "appears twice"},
      {R"({"format": "tp-allreduce-table", "entries": [{"world_size": 2, "rules": []}]})", "missing \"same_host\""},
  };
  for (const Bad& b : bad) {
    INFO("json: " << b.json);
    TempFile file(b.json);
    const std::string error = error_of([&] { AllReduceTable::load(file.path()); });
    CHECK_THAT(error, Contains("all-reduce table " + file.path() + ": "));
    CHECK_THAT(error, Contains(b.message));
  }
  CHECK_THAT(error_of([] { AllReduceTable::load("/nonexistent/table.json"); }),
             Contains("all-reduce table /nonexistent/table.json: cannot be opened"));
  // Through a communicator: the option and TP_ALLREDUCE_TABLE, at world 1 and in a group.
  TempFile broken(R"({"format": "tp-allreduce-table", "entries": [}})");
  CommunicatorOptions options = test_options();
  options.all_reduce_table = broken.path();
  // Every rank reads the table before it connects, so each one's own error is the table's,
  // never a connection a failing peer closed (CI once saw that race at world 2).
  for (int64_t world : {2, 3, 4}) {
    CHECK_THROWS_WITH(tp::run_ranks_in_threads(
                          world, [](Communicator&) {}, options),
                      Contains("all-reduce table " + broken.path()));
  }
  EnvGuard env("TP_ALLREDUCE_TABLE", broken.path());
  CHECK_THROWS_WITH(Communicator(), Contains("all-reduce table " + broken.path()));
}

TEST_CASE("ranks on different hosts never take shared memory, and forcing it is an error naming the hosts", "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  EnvGuard no_table("TP_ALLREDUCE_TABLE", std::nullopt);
  EnvGuard no_host("TP_COMM_HOST_ID", std::nullopt);
  const std::vector<int64_t> sizes = {1, 15, 256, 4096, 1 << 16, 1 << 20};
  SECTION("different host ids") {
    std::vector<CommunicatorOptions> options(3, test_options());
    options[0].host_id = "node-a";
    options[1].host_id = "node-a";
    options[2].host_id = "node-b";
    std::vector<int> on_one_host(3, 1);
    std::vector<std::vector<AllReduceStrategy>> chosen(3);
    std::vector<std::string> forced(3), errors;
    std::vector<at::Tensor> results(3);
    run_with_options(
        options,
        [&](Communicator& comm) {
          const int64_t r = comm.rank();
          on_one_host[r] = comm.ranks_on_one_host();
          for (int64_t n : sizes) chosen[r].push_back(comm.resolve_all_reduce(at::empty({n})));
          at::Tensor t = rank_input(kSeed + 90, r, {1000}, at::kFloat);
          comm.all_reduce(t);  // auto: no shared memory
          results[r] = t;
          at::Tensor u = at::ones({8});
          forced[r] = error_of([&] { comm.all_reduce(u, kOne); });
        },
        errors);
    for (int64_t rank = 0; rank < 3; ++rank) {
      INFO("rank " << rank << " error: " << errors[rank]);
      CHECK(errors[rank] == "");
      CHECK_FALSE(on_one_host[rank]);
      CHECK(chosen[rank] == chosen[0]);
      for (auto s : chosen[rank]) CHECK((s == kPg || s == kRd));
      CHECK(at::allclose(results[rank].to(at::kDouble), reference_sum(kSeed + 90, 3, {1000}, at::kFloat), 1e-5, 1e-5));
      CHECK_THAT(forced[rank], Contains("shm_one_shot needs every rank on this host"));
      CHECK_THAT(forced[rank], Contains("rank 2 on 'node-b'"));
    }
  }
  SECTION("the same host id, and TP_COMM_HOST_ID") {
    EnvGuard env("TP_COMM_HOST_ID", std::string("rack-7"));
    std::vector<CommunicatorOptions> options(2, test_options());
    CHECK(options[0].host_id == "rack-7");
    std::vector<int> on_one_host(2, 0);
    std::vector<std::string> errors;
    run_with_options(
        options, [&](Communicator& comm) { on_one_host[comm.rank()] = comm.ranks_on_one_host(); }, errors);
    CHECK(errors == std::vector<std::string>{"", ""});
    CHECK(on_one_host[0]);
    CHECK(on_one_host[1]);
  }
  SECTION("by default the hostname decides: threads of one process are on one host") {
    std::vector<int> on_one_host(2, 0);
    tp::run_ranks_in_threads(
        2, [&](Communicator& comm) { on_one_host[comm.rank()] = comm.ranks_on_one_host(); }, test_options());
    CHECK(on_one_host[0]);
    CHECK(on_one_host[1]);
  }
}

TEST_CASE("TP_COMM_DEBUG=1 logs each all_reduce's strategy and why", "[comm]") {
  EnvGuard no_force("TP_ALLREDUCE", std::nullopt);
  std::ostringstream captured;
  std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
  std::string error;
  {
    EnvGuard env("TP_COMM_DEBUG", std::string("1"));
    error = error_of([] {
      Communicator comm;
      at::Tensor t = at::ones({16});
      comm.all_reduce(t);
      comm.all_reduce(t, kRd);
    });
  }
  std::cerr.rdbuf(old);
  CHECK(error == "");
  const std::string log = captured.str();
  INFO("log:\n" << log);
  CHECK_THAT(log, Contains("[tp comm] rank 0/1 all_reduce Float[16] 64 bytes -> process_group (auto: table built-in"));
  CHECK_THAT(log, Contains("-> recursive_doubling (requested by the call), wire native"));
  EnvGuard bad("TP_COMM_DEBUG", std::string("yes"));
  CHECK_THROWS_WITH(Communicator(), Contains("TP_COMM_DEBUG='yes' is not valid"));
}
