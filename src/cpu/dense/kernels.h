#pragma once
// The unquantized method's own CPU kernels, one entry point per ISA: plain functions
// over raw pointers (host memory), sizes and strides. Only <cstdint> here, so the
// per-ISA translation units that include it share no inline code with the rest.
//
// Every kernel computes y[i, n] = sum_k x[i, k] * w[n, k] for i in [0, m), n in [n0, n1):
//   x: [m, k] float32, row stride ld_x
//   w: [N, k] float32, or bfloat16 as its raw 16 bits, row stride ld_w
//   y: [m, N] float32, row stride ld_y (columns outside [n0, n1) are not touched)
// in float32 arithmetic: fused multiply-adds along K (dot-product form, so W is read
// in its stored row-major layout and bfloat16 is widened in registers: no converted
// copy), a horizontal sum per output and K block. For m <= 4 one pass streams W once
// (decode: memory-bound); for more rows W is walked in blocks of 48 rows x 1024
// columns that stay in L2 while every group of 4 rows of x passes over them, so W
// still comes from memory once per call.

#include <cstdint>

namespace tp::cpu {

void gemv_f32_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                     int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_scalar(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                      int64_t ld_y, int64_t n0, int64_t n1);

void gemv_f32_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                   int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_avx2(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                    int64_t ld_y, int64_t n0, int64_t n1);

void gemv_f32_avx512(const float* x, int64_t m, int64_t k, int64_t ld_x, const float* w, int64_t ld_w, float* y,
                     int64_t ld_y, int64_t n0, int64_t n1);
void gemv_bf16_avx512(const float* x, int64_t m, int64_t k, int64_t ld_x, const uint16_t* w, int64_t ld_w, float* y,
                      int64_t ld_y, int64_t n0, int64_t n1);

// ---- the panels backend: W packed once into 16-column panels -----------------------------
//
// For M past a few rows the dot-product form above is bound by loads (every x
// vector meets only R rows of W) and by the horizontal sums. The panels kernels work
// in outer-product form instead, on copies laid out for it:
//   panels: W[N, K] as ceil(N / 16) panels of 16 columns; panel p is K x 16 floats
//           (or bfloat16s), k-major (its row kk holds W[16p .. 16p + 15, kk]),
//           columns past N zero.
//   x:      the M rows split into ceil(M / max_rows) chunks whose sizes differ by at
//           most one (17 rows: 9 + 8, not 16 + 1), chunk c k-major: x[r, kk] of its
//           rows at begin(c) * k + kk * rows(c) + (r - begin(c)).
// A chunk of up to 16 (AVX-512) or 6 (AVX2) rows keeps its 16 x rows outputs of a
// panel in registers for the whole K; one weight vector and one broadcast per row
// feed rows FMAs, so the weight is loaded once per chunk and never summed across
// lanes. K is walked as 4 interleaved quarters, so each thread reads 4 sequential
// streams of W (one stream left the DRAM reads well below the machine's rate). The first chunk
// streams the panel from memory (prefetched ahead); later chunks find it in L2. When
// all of x would not stay in L2 (large M), K is cut into blocks that do (panels_linear,
// cpu/dense/backends.cpp), and each block's partial sums are added into y.
// Why not cpu/panel_gemm.h (the weight-only formats' GEMM, which decodes 256-k
// chunks into an L1 buffer): with a copying "decoder" over these same panels it was
// far slower than this kernel (there each thread reads one stream, 16 KB at a time,
// and y is re-read every 256 k). Figures: benchmarks/RESULTS.md, "Measurements behind the CPU kernels' shapes".
constexpr int64_t kPanelCols = 16;
constexpr int64_t kPanelRowsAvx2 = 6;         // 6 x 2 accumulators + 2 W + 1 broadcast of 16 ymm
constexpr int64_t kPanelRowsAvx512 = 16;      // 16 accumulators + 1 W + 1 broadcast of 32 zmm
constexpr int64_t kPanelPairRowsAvx512 = 12;  // two panels at once: 24 accumulators + 2 W + 1 broadcast

/// panels[p] for p in [p0, p1) from W[N, K] (row stride ld_w), in the layout above.
/// bfloat16 panels hold W's raw bits (half the bytes: the kernels widen them exactly);
/// for the AVX2 kernel (`halves_interleaved`) a row's 16 values are stored as columns
/// 0, 8, 1, 9, ..., 7, 15, so that one 256-bit load splits into both halves with a
/// shift and a mask (cheaper than two zero-extensions).
void pack_panels_f32(const float* w, int64_t n, int64_t k, int64_t ld_w, float* panels, int64_t p0, int64_t p1);
void pack_panels_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t ld_w, uint16_t* panels, int64_t p0, int64_t p1,
                      bool halves_interleaved);
/// x[m, k] (row stride ld_x) into the chunked layout above, max_rows rows per chunk.
/// (Not cpu/panel_gemm.h's panel_pack_x: that one cuts fixed blocks of its own
/// tile's 6 / 8 rows, zero-padding the last; these chunks are 16 / 12 / 6 rows, balanced.)
void pack_panel_x(const float* x, int64_t m, int64_t k, int64_t ld_x, int64_t max_rows, float* out);

/// One call of a panel kernel: a chunk of `rows` x rows (1..kPanelRows* of the ISA)
/// against kc rows of one panel (or of two neighbouring ones, the pair kernel):
///   y[r, j] = (y[r, j] if accumulate, else 0) + sum_kk x[kk * rows + r] * panel[kk * 16 + j]
/// for j < cols (the columns within N; up to 32 for a pair, whose second panel is at
/// panel + panel_stride); x and panel point at the K block's first row.
struct PanelTask {
  int64_t rows = 0;
  const float* x = nullptr;
  const void* panel = nullptr;  ///< float or bfloat16 (raw bits), as the entry point says
  int64_t panel_stride = 0;     ///< elements from a panel to the next (pair kernel)
  int64_t kc = 0;
  float* y = nullptr;
  int64_t ld_y = 0;
  int64_t cols = 0;
  bool accumulate = false;
  /// The panel comes from memory (its first chunk): prefetch ahead along it. (Later
  /// chunks find it in L2. Pulling the next panel into L2 from them instead, spread
  /// over their steps, was slower: the prefetches take the fill buffers the L2 -> L1
  /// loads need; benchmarks/RESULTS.md, "Measurements behind the CPU kernels' shapes".)
  bool stream = false;
  /// Large M (panels_linear's K blocks): bytes of the next task's panels that this
  /// chunk pulls into L2 while it computes (from prefetch_next, and as much again
  /// panel_stride further for the second panel of a pair), so that the next task's first
  /// chunk finds its weights in cache instead of waiting on memory. nullptr: none.
  const void* prefetch_next = nullptr;
  int64_t prefetch_bytes = 0;
};

void panel_chunk_f32_avx2(const PanelTask& t);
void panel_chunk_bf16_avx2(const PanelTask& t);
void panel_chunk_f32_avx512(const PanelTask& t);
void panel_chunk_bf16_avx512(const PanelTask& t);
/// Up to kPanelPairRowsAvx512 rows against two neighbouring panels (for large M, where
/// one panel's 16 x 16 block is bound by loads).
void panel_pair_f32_avx512(const PanelTask& t);
void panel_pair_bf16_avx512(const PanelTask& t);

/// The pair kernel's float32 register tile for 10-12 rows, in assembly
/// (cpu/dense/panel_tile_avx512.cpp): tile[r, j] += sum over `steps` k of x[kk * rows + r] *
/// w[kk * 16 + j] (j < 16) or w[panel_stride + kk * 16 + j - 16] (j >= 16), for the
/// tile's rows x 32 floats; meanwhile one 64-byte line at `prefetch` (and panel_stride
/// floats on) per two steps goes to L2, the address advancing prefetch_inc bytes.
struct PanelTileArgs {
  int64_t rows = 0;  ///< 10, 11 or 12
  const float* x = nullptr;
  const float* w = nullptr;
  int64_t panel_stride = 0;  ///< floats
  int64_t steps = 0;
  float* tile = nullptr;
  const char* prefetch = nullptr;  ///< never null: an address already in cache when there is nothing to fetch
  int64_t prefetch_inc = 0;
};
void panel_pair_tile_f32_avx512(const PanelTileArgs& a);

/// The AVX2 chunk kernel's register tile for 4-6 rows, in assembly (cpu/dense/panel_tile_avx2.cpp):
/// tile[r, j] += sum over `steps` steps i and quarters s < 4 of x[kk * rows + r] *
/// w[kk * 16 + j] with kk = s * quarter + i, for the tile's rows x 16 floats; with
/// `stream` it prefetches 32 rows ahead along every quarter, and each step sends one
/// 64-byte line at `prefetch` to L2, the address advancing prefetch_inc bytes.
struct PanelQuarterTileArgs {
  int64_t rows = 0;  ///< 4, 5 or 6
  const float* x = nullptr;
  const void* w = nullptr;  ///< float32, or bfloat16 in AVX2's interleaved halves
  int64_t quarter = 0;      ///< rows (k) from one quarter of the K block to the next
  int64_t steps = 0;
  float* tile = nullptr;
  bool stream = false;
  const char* prefetch = nullptr;  ///< never null: an address already in cache when there is nothing to fetch
  int64_t prefetch_inc = 0;
};
void panel_quarter_tile_f32_avx2(const PanelQuarterTileArgs& a);
void panel_quarter_tile_bf16_avx2(const PanelQuarterTileArgs& a);

/// dst[r, c] = float(src[r, c]) for a rows x cols block of bfloat16 (raw bits): exact,
/// the bits shifted into a float's high half. The bf16_tiles backend's per-tile widening.
void bf16_to_f32_scalar(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);
void bf16_to_f32_avx2(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);
void bf16_to_f32_avx512(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);

}  // namespace tp::cpu
