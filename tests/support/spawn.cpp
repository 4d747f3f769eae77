#include "support/spawn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace tp::test {
namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

/// This process's environment with `changes` applied, as NAME=VALUE strings.
std::vector<std::string> environment_with(const EnvChanges& changes) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (changes.count(name) == 0) env.push_back(entry);
  }
  for (const auto& [name, value] : changes) {
    if (value) env.push_back(name + "=" + *value);
  }
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int decode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1;
}

}  // namespace

std::vector<ProcessResult> run_processes(const std::string& program, const std::vector<std::string>& args,
                                         const std::vector<EnvChanges>& envs, std::chrono::milliseconds deadline) {
  const size_t n = envs.size();
  std::vector<ProcessResult> results(n);
  std::vector<pid_t> pids(n, -1);
  std::vector<std::string> logs(n);
  std::vector<bool> done(n, false);

  auto kill_all = [&] {
    for (size_t i = 0; i < n; ++i) {
      if (pids[i] > 0 && !done[i]) {
        ::kill(pids[i], SIGKILL);
        int status = 0;
        ::waitpid(pids[i], &status, 0);
        done[i] = true;
      }
    }
  };

  for (size_t i = 0; i < n; ++i) {
    // Each process writes stdout and stderr to its own file, read back at the end.
    char log_template[] = "/tmp/tp_spawn_XXXXXX";
    const int fd = ::mkstemp(log_template);
    if (fd < 0) {
      kill_all();
      fail("mkstemp");
    }
    logs[i] = log_template;

    std::vector<std::string> argv_strings{program};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<std::string> env_strings = environment_with(envs[i]);
    std::vector<char*> argv = c_strings(argv_strings);
    std::vector<char*> envp = c_strings(env_strings);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fd, STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, fd);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(fd);
    if (rc != 0) {
      errno = rc;
      kill_all();
      fail("posix_spawn " + program);
    }
    pids[i] = pid;
  }

  const auto stop_at = std::chrono::steady_clock::now() + deadline;
  size_t remaining = n;
  while (remaining > 0) {
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      int status = 0;
      const pid_t r = ::waitpid(pids[i], &status, WNOHANG);
      if (r == pids[i]) {
        results[i].exit_code = decode(status);
        done[i] = true;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > stop_at) {
      for (size_t i = 0; i < n; ++i) {
        if (!done[i]) results[i].timed_out = true;
      }
      kill_all();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  for (size_t i = 0; i < n; ++i) {
    results[i].output = read_file(logs[i]);
    ::unlink(logs[i].c_str());
  }
  return results;
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) fail("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    fail("bind/getsockname on 127.0.0.1:0");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::vector<ProcessResult> run_ranks_as_processes(const std::string& program, const std::vector<std::string>& args,
                                                  int world, std::chrono::milliseconds deadline,
                                                  const EnvChanges& extra) {
  const std::string port = std::to_string(free_tcp_port());
  std::vector<EnvChanges> envs;
  for (int r = 0; r < world; ++r) {
    EnvChanges env = extra;
    env["RANK"] = std::to_string(r);
    env["LOCAL_RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(world);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = port;
    envs.push_back(std::move(env));
  }
  return run_processes(program, args, envs, deadline);
}

}  // namespace tp::test
