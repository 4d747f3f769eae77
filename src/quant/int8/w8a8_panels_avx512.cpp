// The W8A8 panel kernel on AVX512_VNNI from the w8a8_panels crossover (w8a8_kernels.h), built
// with the AVX-512 flags and entered only where the CPU has AVX512_VNNI.
//
// Roles as in oneDNN's int8 GEMM, with the operands swapped so that the weight is never
// copied: vpdpbusd multiplies a u8 vector by an s8 one, 4 products per int32 lane. The
// vector operand is x: 16 tokens x 4 bytes of K, packed per call into panels
// (w8a8_pack_x_panels, x + 128 as u8); the broadcast operand is 4 bytes of one weight
// row, read in place from the [N, K] tensor. An accumulator is then 16 tokens of one
// output channel, whole: no horizontal sum per output (the dot-product tiles' cost,
// w8a8_kernels_body.h), and every x byte loaded feeds NW products, every weight dword
// MX. The tile is MX panels (16 MX tokens) x NW = 12 weight rows: at MX = 2, 24
// accumulators, 2 x vectors and a broadcast take 27 of the 32 zmm, and each step of 4
// bytes of K is 2 + 12 loads for 24 vpdpbusd.
//
// Blocking: the tile runs over the whole K (its 12 weight rows, 12 K bytes, stay in L2
// while every panel of the block passes; the panels stream from L2 / L3, MX x 64 bytes
// per 24 vpdpbusd); tokens in blocks of about kBlockBytes of panels, so a prefill of
// thousands of tokens does not stream all of x per weight tile. Threads split N
// (the dispatcher).
//
// Epilogue: (acc - 128 row_sum) as int32 (mod 2^32, as the dot-product path), then
// (float(a) * x_scale) * w_scale, the reference's order, 16 tokens per vector, through
// a small buffer into y's [token, channel] layout.

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// "(may be) used uninitialized" (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/int8/w8a8_kernels.h"

namespace tp::detail {

namespace {

constexpr int kNw = 12;                       // weight rows per tile
constexpr int64_t kPanel = kW8a8PanelTokens;  // tokens per panel (one zmm of int32)
constexpr int64_t kBlockBytes = 4 << 20;      // panels per token block: ~4 MiB (see above)

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

inline int32_t load_dword(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// out[j * MX + p] += the products of `count` steps of 4 bytes: panel p's 16 tokens
// (x[p], 64 bytes per step) by weight row j's dword (w[j], wstride bytes per step), as
// 16 int32 lanes. Used for the partial last step of K only; GCC 12 stores every
// accumulator on each step of such a loop, hence the main loop in assembly below.
template <int MX>
void steps(const uint8_t* const* x, const int8_t* const* w, int64_t wstride, int64_t count, int32_t* out) {
  __m512i acc[kNw][MX];
  for (int j = 0; j < kNw; ++j)
    for (int p = 0; p < MX; ++p) acc[j][p] = _mm512_loadu_si512(out + (j * MX + p) * kPanel);
  for (int64_t c = 0; c < count; ++c) {
    __m512i xv[MX];
    for (int p = 0; p < MX; ++p) xv[p] = _mm512_loadu_si512(x[p] + c * 64);
    for (int j = 0; j < kNw; ++j) {
      const __m512i b = _mm512_set1_epi32(load_dword(w[j] + c * wstride));
      for (int p = 0; p < MX; ++p) acc[j][p] = _mm512_dpbusd_epi32(acc[j][p], xv[p], b);
    }
  }
  for (int j = 0; j < kNw; ++j)
    for (int p = 0; p < MX; ++p) _mm512_storeu_si512(out + (j * MX + p) * kPanel, acc[j][p]);
}

// The main loop. Registers: accumulators zmm0..zmm(12 MX - 1) (row j, panel p in
// zmm(j MX + p)), x in zmm24 / zmm25, the broadcast dword in zmm26. The 12 rows are
// addressed from three bases, 4 rows apart, as base, base + ld, base + 2 ld and
// base + ld3 (ld3 = 3 ld): 9 general registers in all, where 12 row pointers would
// not leave enough for the loop. One step of 4 bytes per iteration (STEP(D): the step at
// D bytes of the rows, 16 D of x). No software prefetch: prefetching each row 1 KiB
// ahead measured no faster at M = 16 to 256 (benchmarks/RESULTS.md, 2026-12-07, issue
// 47 part 2).
// clang-format off
#define TP_ROW1(ADDR, A) \
  "vpbroadcastd " ADDR ", %%zmm26\n\t" "vpdpbusd %%zmm26, %%zmm24, %%zmm" #A "\n\t"
#define TP_ROW2(ADDR, A, B) \
  "vpbroadcastd " ADDR ", %%zmm26\n\t" "vpdpbusd %%zmm26, %%zmm24, %%zmm" #A "\n\t" \
  "vpdpbusd %%zmm26, %%zmm25, %%zmm" #B "\n\t"
#define TP_GROUP1(D, R, A0, A1, A2, A3) \
  TP_ROW1(#D "(%[" #R "])", A0) TP_ROW1(#D "(%[" #R "],%[ld],1)", A1) \
  TP_ROW1(#D "(%[" #R "],%[ld],2)", A2) TP_ROW1(#D "(%[" #R "],%[ld3],1)", A3)
#define TP_GROUP2(D, R, A0, B0, A1, B1, A2, B2, A3, B3) \
  TP_ROW2(#D "(%[" #R "])", A0, B0) TP_ROW2(#D "(%[" #R "],%[ld],1)", A1, B1) \
  TP_ROW2(#D "(%[" #R "],%[ld],2)", A2, B2) TP_ROW2(#D "(%[" #R "],%[ld3],1)", A3, B3)
#define TP_STEP1(D) \
  "vmovdqu64 16*" #D "(%[x]), %%zmm24\n\t" \
  TP_GROUP1(D, r0, 0, 1, 2, 3) TP_GROUP1(D, r4, 4, 5, 6, 7) TP_GROUP1(D, r8, 8, 9, 10, 11)
#define TP_STEP2(D) \
  "vmovdqu64 16*" #D "(%[x]), %%zmm24\n\t" "vmovdqu64 16*" #D "(%[x],%[dx],1), %%zmm25\n\t" \
  TP_GROUP2(D, r0, 0, 1, 2, 3, 4, 5, 6, 7) TP_GROUP2(D, r4, 8, 9, 10, 11, 12, 13, 14, 15) \
  TP_GROUP2(D, r8, 16, 17, 18, 19, 20, 21, 22, 23)
#define TP_Z(A) "vpxord %%zmm" #A ", %%zmm" #A ", %%zmm" #A "\n\t"
#define TP_S(A) "vmovdqu64 %%zmm" #A ", 64*" #A "(%[out])\n\t"
#define TP_Z12 TP_Z(0) TP_Z(1) TP_Z(2) TP_Z(3) TP_Z(4) TP_Z(5) TP_Z(6) TP_Z(7) TP_Z(8) TP_Z(9) TP_Z(10) TP_Z(11)
#define TP_Z24 TP_Z12 TP_Z(12) TP_Z(13) TP_Z(14) TP_Z(15) TP_Z(16) TP_Z(17) TP_Z(18) TP_Z(19) TP_Z(20) \
  TP_Z(21) TP_Z(22) TP_Z(23)
#define TP_S12 TP_S(0) TP_S(1) TP_S(2) TP_S(3) TP_S(4) TP_S(5) TP_S(6) TP_S(7) TP_S(8) TP_S(9) TP_S(10) TP_S(11)
#define TP_S24 TP_S12 TP_S(12) TP_S(13) TP_S(14) TP_S(15) TP_S(16) TP_S(17) TP_S(18) TP_S(19) TP_S(20) \
  TP_S(21) TP_S(22) TP_S(23)
#define TP_TILE_ASM(ZERO, STEP, STORE) \
  __asm__ volatile( \
      ZERO \
      "test %[n], %[n]\n\t" \
      "jz 2f\n\t" \
      "1:\n\t" \
      STEP(0) \
      "add $64, %[x]\n\t" \
      "add $4, %[r0]\n\t" \
      "add $4, %[r4]\n\t" \
      "add $4, %[r8]\n\t" \
      "dec %[n]\n\t" \
      "jnz 1b\n\t" \
      "2:\n\t" \
      STORE \
      : [x] "+r"(x0), [r0] "+r"(r0), [r4] "+r"(r4), [r8] "+r"(r8), [n] "+r"(n) \
      : [dx] "r"(dx), [ld] "r"(ld), [ld3] "r"(ld3), [out] "r"(out) \
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", \
        "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", \
        "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", \
        "xmm26")
// clang-format on

// One tile: rows at base + j ld (j < 12), x panels x[0..MX); the kf whole steps in place,
// then the partial last step from tails (the rows' last k % 4 bytes, zero padded) when
// there is one. out as steps' (int32 [12 MX][16]).
template <int MX>
void tile(const uint8_t* const* x, const int8_t* base, int64_t ld, int64_t kf, const int8_t* const* tails,
          bool has_tail, int32_t* out) {
  const uint8_t* x0 = x[0];
  const int64_t dx = x[MX - 1] - x[0];
  const int8_t* r0 = base;
  const int8_t* r4 = base + 4 * ld;
  const int8_t* r8 = base + 8 * ld;
  const int64_t ld3 = 3 * ld;
  int64_t n = kf;
  if constexpr (MX == 2) TP_TILE_ASM(TP_Z24, TP_STEP2, TP_S24);
  if constexpr (MX == 1) TP_TILE_ASM(TP_Z12, TP_STEP1, TP_S12);
  if (has_tail) {
    const uint8_t* xt[MX];
    for (int p = 0; p < MX; ++p) xt[p] = x[p] + kf * 64;
    steps<MX>(xt, tails, 0, 1, out);
  }
}

}  // namespace

void w8a8_gemm_avx512_vnni_panels(const uint8_t* xp, int64_t m, const float* x_scale, const W8a8WeightView& w, float* y,
                                  int64_t ld_y, int64_t n0, int64_t n1) {
  if (m <= 0 || n0 >= n1) return;
  const int64_t kf = w.k / 4, rest = w.k % 4;
  const int64_t panel_bytes = w8a8_panel_bytes(w.k);
  const int64_t panels = (m + kPanel - 1) / kPanel;
  int64_t block = kBlockBytes / (panel_bytes > 0 ? panel_bytes : 1) / 2 * 2;  // panels per block, pairs whole
  if (block < 2) block = 2;
  alignas(64) int32_t acc[kNw * 2 * kPanel];
  alignas(64) float out[kNw][2 * kPanel];
  alignas(4) int8_t tail[kNw][4] = {};
  const int8_t* tails[kNw];
  for (int j = 0; j < kNw; ++j) tails[j] = tail[j];
  std::vector<int8_t> pad;  // a last tile of fewer than 12 rows, copied and zero padded
  for (int64_t b0 = 0; b0 < panels; b0 += block) {
    const int64_t b1 = imin(panels, b0 + block);
    for (int64_t r0 = n0; r0 < n1; r0 += kNw) {
      const int nw = static_cast<int>(imin(kNw, n1 - r0));
      const int8_t* base = w.data + r0 * w.ld;
      int64_t ld = w.ld;
      if (nw < kNw) {
        if (pad.empty()) {
          pad.assign(static_cast<size_t>(kNw * w.k), 0);
          for (int j = 0; j < nw; ++j) std::memcpy(pad.data() + j * w.k, base + j * w.ld, static_cast<size_t>(w.k));
        }
        base = pad.data();
        ld = w.k;
      }
      if (rest != 0) {
        for (int j = 0; j < kNw; ++j) {
          std::memset(tail[j], 0, 4);
          std::memcpy(tail[j], base + j * ld + 4 * kf, static_cast<size_t>(rest));
        }
      }
      for (int64_t p0 = b0; p0 < b1; p0 += 2) {
        const int mx = p0 + 1 < b1 ? 2 : 1;
        const uint8_t* x[2] = {xp + p0 * panel_bytes, xp + (p0 + mx - 1) * panel_bytes};
        if (mx == 2)
          tile<2>(x, base, ld, kf, tails, rest != 0, acc);
        else
          tile<1>(x, base, ld, kf, tails, rest != 0, acc);
        const int64_t i0 = p0 * kPanel;
        const int64_t tokens = imin(m - i0, mx * kPanel);
        const int64_t stride = mx * kPanel;  // acc row j at acc + j * stride
        for (int p = 0; p < mx; ++p) {
          const int64_t valid = imin(kPanel, tokens - p * kPanel);
          if (valid <= 0) break;
          const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
          const __m512 xs = _mm512_maskz_loadu_ps(mask, x_scale + i0 + p * kPanel);
          for (int j = 0; j < nw; ++j) {
            __m512i v = _mm512_loadu_si512(acc + j * stride + p * kPanel);
            v = _mm512_sub_epi32(
                v, _mm512_set1_epi32(static_cast<int32_t>(128u * static_cast<uint32_t>(w.row_sum[r0 + j]))));
            const __m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), xs), _mm512_set1_ps(w.scale[r0 + j]));
            _mm512_store_ps(&out[j][p * kPanel], f);
          }
        }
        for (int64_t i = 0; i < tokens; ++i) {
          float* yi = y + (i0 + i) * ld_y + r0;
          for (int j = 0; j < nw; ++j) yi[j] = out[j][i];
        }
      }
    }
  }
}

}  // namespace tp::detail
