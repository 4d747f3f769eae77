#pragma once
// What this CPU can execute, read once at run time (CPUID and XGETBV), so one binary
// runs its best kernels on an AVX2-only machine and on an AVX-512 one. Kernels are
// compiled per ISA (one translation unit each, with that ISA's -m flags) and chosen
// here, never by the build machine's flags.
//
// TP_CPU_ISA (scalar | avx2 | avx512) caps the choice, so tests and benchmarks can
// force each code path the machine supports; asking for more than the CPU has is an
// error naming both.

#include <string>

namespace tp::cpu {

/// Instruction-set levels the CPU kernels are written for, in increasing order.
enum class Isa {
  kScalar,  ///< portable C++ (the reference path; any x86-64 or other CPU)
  kAvx2,    ///< AVX2 + FMA + F16C (Haswell, Zen 1-4)
  kAvx512,  ///< AVX-512 F, BW, VL, DQ (Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4-5)
};

/// "scalar", "avx2", "avx512".
const char* to_string(Isa isa);

/// The raw feature bits the kernels care about; each true only when the OS also
/// saves the registers it needs (XGETBV), so a flag here is safe to use.
struct Features {
  bool amd = false;  ///< AuthenticAMD or HygonGenuine: the GEMM table has rows of its own
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx_vnni = false;  ///< VEX-encoded VPDPBUSD (Alder Lake, Zen 5)
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;  ///< VPDPBUSD on zmm (Cascade Lake, Zen 4)
  bool avx512bf16 = false;  ///< VDPBF16PS (Cooper Lake, Sapphire Rapids, Zen 4)
  bool avx512vbmi = false;  ///< VPERMI2B, byte tables (Ice Lake, Sapphire Rapids, Zen 4; not Cooper Lake)
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;

  /// "avx2 fma f16c avx512f ..." for benchmark headers and test output.
  std::string describe() const;
};

/// This CPU's features (read once).
const Features& features();

/// The best level this CPU supports.
Isa max_isa();

/// The level kernels dispatch to: max_isa(), capped by TP_CPU_ISA when set (read
/// once). TP_CPU_ISA above what the CPU has, or an unknown name, is a c10::Error.
Isa isa();

/// Parses "scalar", "avx2", "avx512" (case-insensitive); c10::ValueError otherwise.
Isa parse_isa(const std::string& name);

}  // namespace tp::cpu
