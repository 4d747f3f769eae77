#pragma once
// Test helper: run a program as N real processes (one per rank, torchrun-style
// environment), wait for them with a deadline, and collect exit codes and output.

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tp::test {

/// How one spawned process ended.
struct ProcessResult {
  /// The exit status when it exited; -N when signal N ended it; -1 when it was
  /// killed at the deadline.
  int exit_code = -1;
  bool timed_out = false;
  /// stdout and stderr, interleaved.
  std::string output;
};

/// Environment changes for one process: a value sets the variable, nullopt removes it.
/// Everything else is inherited from this process.
using EnvChanges = std::map<std::string, std::optional<std::string>>;

/// Starts `program args...` once per entry of `envs`, all at once, and waits for all of
/// them. A process still running at `deadline` is killed (SIGKILL), together with the
/// others still running, and reported with timed_out = true.
std::vector<ProcessResult> run_processes(const std::string& program, const std::vector<std::string>& args,
                                         const std::vector<EnvChanges>& envs, std::chrono::milliseconds deadline);

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read back,
/// released).
int free_tcp_port();

/// `program args...` as `world` ranks: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1
/// and MASTER_PORT (a free port) set, plus `extra` for every rank.
std::vector<ProcessResult> run_ranks_as_processes(const std::string& program, const std::vector<std::string>& args,
                                                  int world, std::chrono::milliseconds deadline,
                                                  const EnvChanges& extra = {});

}  // namespace tp::test
