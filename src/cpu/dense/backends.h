#pragma once
// The unquantized method's CPU GEMM backends over tensors, one function each: what
// DenseGemm (cpu/dense/gemm.h) dispatches to. Every product is y = x W^T with
//   x: [M, K] contiguous, W: [N, K] with unit-stride rows, y: [M, N] float32 or W's dtype.
// Validation is the caller's (DenseGemm::serves); these only compute.

#include <ATen/core/Tensor.h>

#include <optional>

#include "cpu/features.h"

namespace tp::cpu {

// ---- oneDNN (ATen's mkldnn ops, registered in libtorch_cpu) ----------------------------

/// Whether ATen's oneDNN ops can take `dtype` here (bfloat16 needs oneDNN's own bf16
/// ISA check, which follows ONEDNN_MAX_CPU_ISA).
bool onednn_supports(at::ScalarType dtype);
/// W reordered to oneDNN's blocked inner-product layout (mkldnn::_reorder_linear_weight).
at::Tensor onednn_pack(const at::Tensor& w);
/// y = x W^T (+ bias) on the packed weight (mkldnn::_linear_pointwise); y in x's dtype.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias);
/// Bytes a oneDNN pack holds.
int64_t onednn_packed_bytes(const at::Tensor& packed);

// ---- MKL's packed SGEMM (cblas_sgemm_pack / cblas_sgemm_compute) ------------------------

/// Whether LibTorch's MKL exports the packed SGEMM here and it passed its one-time
/// self-check (found by dlsym in the loaded libtorch_cpu: no header, no link-time
/// dependency; a LibTorch without MKL simply lacks the backend).
bool mkl_packed_available();
/// Whether the loaded libtorch_cpu exports the three functions at all (tests: then the
/// self-check must have passed).
bool mkl_packed_exported();
/// float32 W packed by cblas_sgemm_pack as the B operand (one pack serves every M).
at::Tensor mkl_pack(const at::Tensor& w);
/// y = x W^T by cblas_sgemm_compute on the pack; float32.
at::Tensor mkl_packed_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n);

// ---- own kernels (cpu/dense/kernels.h), threaded over N with ATen's pool ------------------

/// y = x W^T by the small-M kernel of `isa`; y float32 (x is widened if bfloat16).
at::Tensor gemv_linear(const at::Tensor& x, const at::Tensor& w, Isa isa);
/// W (float32 or bfloat16) packed into 16-column panels for `isa`'s kernel
/// (cpu/dense/kernels.h): [ceil(N / 16), K, 16] in W's dtype.
at::Tensor panels_pack(const at::Tensor& w, Isa isa);
/// Where panels_linear starts to cut K into blocks: when x (M x K float32) is larger
/// than this, each block's slice of x is about this size. On Intel a 512 KiB slice
/// stays in L2 while the panels pass over it; on AMD the larger slice was faster
/// (fewer passes over y, longer K streams): benchmarks/RESULTS.md, "The dense CPU
/// GEMM's built-in table".
constexpr int64_t kPanelXBlockBytes = int64_t{512} << 10;
constexpr int64_t kPanelXBlockBytesAmd = int64_t{2} << 20;
/// y = x W^T on panels packed for `isa` by its panel kernel (AVX2 or AVX-512; x
/// contiguous rows, widened to float32 if bfloat16); y float32 [M, n].
at::Tensor panels_linear(const at::Tensor& x, const at::Tensor& panels, int64_t n, Isa isa,
                         int64_t x_block_bytes = kPanelXBlockBytes);
/// y = x W^T for a bfloat16 W: tiles of rows widened to float32 by `isa`'s kernel and
/// multiplied in float32 by MKL's SGEMM into y's columns (at::mm where LibTorch does not
/// export it); y float32.
at::Tensor bf16_tiles_linear(const at::Tensor& x, const at::Tensor& w, Isa isa);

}  // namespace tp::cpu
