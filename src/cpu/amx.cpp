#include "cpu/amx.h"

#include <cerrno>
#include <cstring>

#include "common/env.h"
#include "cpu/features.h"

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define TP_LINUX_X86_64 1
#else
#define TP_LINUX_X86_64 0
#endif

namespace tp::cpu {

namespace {

#if TP_LINUX_X86_64
// arch_prctl codes and the tile data state component (Linux's x86 uapi prctl header, from 5.16).
constexpr long kArchGetXcompPerm = 0x1022;
constexpr long kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;
#endif

AmxStatus decide() {
  const Features& f = features();
  if (!(f.amx_tile && f.amx_bf16 && f.amx_int8))
    return {false, "the CPU (or the OS's XCR0) has no AMX bf16 / int8 tiles"};
  if (isa() != Isa::kAvx512) return {false, std::string("TP_CPU_ISA caps the kernels at ") + to_string(isa())};
  if (const auto env = detail::env_value("TP_CPU_AMX"); env && *env == "0") return {false, "TP_CPU_AMX=0"};
#if TP_LINUX_X86_64
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return {false, std::string("Linux refused the tile data permission (arch_prctl: ") + std::strerror(errno) + ")"};
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0 || !((granted >> kXfeatureXtiledata) & 1u))
    return {false, "Linux did not grant the tile data state after the request"};
  return {true, "granted"};
#else
  return {false, "AMX permission is requested on Linux x86-64 only"};
#endif
}

}  // namespace

const AmxStatus& amx_status() {
  static const AmxStatus status = decide();
  return status;
}

}  // namespace tp::cpu
