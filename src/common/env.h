#pragma once
// Reading the environment variables the comm module understands (TP_COMM_TIMEOUT_MS,
// TP_ALLREDUCE, and torchrun's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT).

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace tp::detail {

/// The variable's value; nullopt when it is unset or empty (`VAR= cmd` means "unset").
inline std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// A whole base-10 integer (optional sign, nothing else, no surrounding blanks) that
/// fits in int64_t; nullopt otherwise.
inline std::optional<int64_t> parse_int64(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front()))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
  return static_cast<int64_t>(v);
}

}  // namespace tp::detail
