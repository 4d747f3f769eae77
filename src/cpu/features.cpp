#include "cpu/features.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>

#include "common/env.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TP_X86 1
#else
#define TP_X86 0
#endif

namespace tp::cpu {

namespace {

#if TP_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned reg, int i) { return (reg >> i) & 1u; }
#endif

Features detect() {
  Features f;
#if TP_X86
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  const Regs l0 = cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &l0.b, 4);
  std::memcpy(vendor + 4, &l0.d, 4);
  std::memcpy(vendor + 8, &l0.c, 4);
  f.amd = std::strcmp(vendor, "AuthenticAMD") == 0 || std::strcmp(vendor, "HygonGenuine") == 0;
  if (max_leaf < 7) return f;
  const Regs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.c, 27);
  if (!osxsave) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;   // opmask, upper ZMM, high ZMM
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  const Regs l7 = cpuid(7, 0);
  const Regs l7s1 = cpuid(7, 1);
  f.fma = ymm && bit(l1.c, 12);
  f.f16c = ymm && bit(l1.c, 29);
  f.avx2 = ymm && bit(l7.b, 5);
  f.avx_vnni = ymm && bit(l7s1.a, 4);
  f.avx512f = zmm && bit(l7.b, 16);
  f.avx512dq = zmm && bit(l7.b, 17);
  f.avx512bw = zmm && bit(l7.b, 30);
  f.avx512vl = zmm && bit(l7.b, 31);
  f.avx512vnni = zmm && bit(l7.c, 11);
  f.avx512vbmi = zmm && bit(l7.c, 1);
  f.avx512bf16 = zmm && bit(l7s1.a, 5);
  // Linux enables AMX tile state only after a process asks (arch_prctl); CPUID and
  // XCR0 say whether it can.
  f.amx_bf16 = tiles && bit(l7.d, 22);
  f.amx_tile = tiles && bit(l7.d, 24);
  f.amx_int8 = tiles && bit(l7.d, 25);
#endif
  return f;
}

Isa max_isa_of(const Features& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c) return Isa::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return Isa::kAvx2;
  return Isa::kScalar;
}

}  // namespace

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

std::string Features::describe() const {
  std::string out;
  const auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(amd, "amd");
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx_vnni, "avx_vnni");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512vnni, "avx512_vnni");
  add(avx512vbmi, "avx512_vbmi");
  add(avx512bf16, "avx512_bf16");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  add(amx_int8, "amx_int8");
  return out.empty() ? "none" : out;
}

const Features& features() {
  static const Features features = detect();
  return features;
}

Isa max_isa() { return max_isa_of(features()); }

Isa parse_isa(const std::string& name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (lower == to_string(isa)) return isa;
  }
  TORCH_CHECK_VALUE(false, "unknown CPU ISA '", name, "'; expected scalar, avx2 or avx512");
}

Isa isa() {
  static const Isa isa = [] {
    const Isa best = max_isa();
    const auto env = detail::env_value("TP_CPU_ISA");
    if (!env) return best;
    const Isa asked = parse_isa(*env);
    TORCH_CHECK_VALUE(static_cast<int>(asked) <= static_cast<int>(best), "TP_CPU_ISA=", *env,
                      " asks for more than this CPU supports (", to_string(best), "; features: ", features().describe(),
                      ")");
    return asked;
  }();
  return isa;
}

}  // namespace tp::cpu
