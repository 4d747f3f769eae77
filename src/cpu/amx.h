#pragma once
// Whether this process may run AMX tile instructions, decided once at run time. Three
// things must hold: the CPU has the tiles (CPUID, and XCR0 says the OS saves their
// state: cpu/features.h), Linux granted this process the tile data state (it is off
// until a process asks, arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); a kernel
// before 5.16 has no such request and no AMX for user space), and nothing capped it:
// TP_CPU_ISA below avx512, or TP_CPU_AMX=0. Kernels that use tiles are compiled in
// *_amx.cpp files (the AVX-512 flags plus -mamx-*) and entered only when usable.

#include <cstdint>
#include <string>

namespace tp::cpu {

struct AmxStatus {
  bool usable = false;  ///< bf16 and int8 tiles may be used
  std::string why;      ///< what decided it: "granted", or the reason they may not
};

/// Decided on the first call (the permission request is process-wide and made once).
const AmxStatus& amx_status();

/// c = a b for one 16 x 16 float32 tile: a [16, 32] bf16 (row stride lda elements),
/// b [32, 16] bf16 in AMX's VNNI pairs (bp [16, 32]: bp[r, 2 j + q] = b[2 r + q, j],
/// row stride ldb elements), c row stride ldc; TDPBF16PS, accumulated in float32.
/// Only when amx_status().usable (cpu/amx_tile_amx.cpp).
void amx_bf16_tile_16x16x32(const uint16_t* a, int64_t lda, const uint16_t* bp, int64_t ldb, float* c, int64_t ldc);

}  // namespace tp::cpu
