#pragma once
// The unquantized method's CPU GEMM: y = x W^T (+ bias) for float32 and bfloat16
// layers, by whichever backend is fastest for the call's shape, dtype, ISA and thread
// count. The choice is a pure function of those (select_dense_backend), observable
// (DenseGemm::counts, DenseGemm::backend_for) and forcible (TP_CPU_GEMM=<name>).
//
//   backend      what runs                                          prepacked weight
//   at_linear    at::linear (MKL sgemm; ATen's / oneDNN's bf16 GEMM)  -
//   onednn       oneDNN inner product on a weight reordered once     a copy of W in oneDNN's
//                (mkldnn::_reorder_linear_weight / _linear_pointwise) blocked layout (~ W's size)
//   mkl_packed   MKL's packed SGEMM (cblas_sgemm_pack / _compute,    a copy of W in MKL's
//                exported by LibTorch's MKL, found at run time)      panels (larger than W)
//   gemv         own AVX2 / AVX-512 kernel for small M, threaded      -
//                over N (cpu/dense/kernels.h): reads W once
//   panels       own AVX2 / AVX-512 outer-product kernel, threaded     a copy of W in 16-column
//                over N (cpu/dense/kernels.h): W read once per call   k-major panels (W's size)
//   bf16_tiles   bfloat16 W widened to float32 one tile of rows at    -
//                a time, float32 GEMM (at::mm) on the tile (machines
//                without bf16 arithmetic)
//
// At most one packed copy is made per layer: the one the table picks for its shape on
// this machine (forcing another backend packs for it on first use).
//
// The prepacked weight is made by prepare() (the method's finalize) and made again
// whenever the weight changed since: another storage, shape or dtype, or a newer
// version counter (every in-place write through the tensor or a view of it: copy_,
// an optimizer step, load_state_dict). Inference tensors carry no version counter;
// for them only a new storage is noticed, so whoever writes into one in place calls
// prepare() again (the layers' load_weights does).
//
// Autograd: the prepacked and own kernels have no backward. A call that needs a graph
// (grad mode on and x, W or the bias requiring grad) always takes at_linear.

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cpu/features.h"
#include "cpu/tensor_stamp.h"

namespace tp::cpu {

/// The CPU GEMM backends of the unquantized method.
enum class DenseBackend {
  kAtLinear,   ///< at::linear
  kOneDnn,     ///< oneDNN inner product with a weight reordered once ("onednn")
  kGemv,       ///< own small-M kernel, AVX2 / AVX-512 / portable ("gemv")
  kBf16Tiles,  ///< bfloat16 weight converted per tile, float32 GEMM ("bf16_tiles")
  kMklPacked,  ///< MKL's packed SGEMM with the weight packed once ("mkl_packed")
  kPanels,     ///< own AVX2 / AVX-512 kernel on W packed once into 16-column panels ("panels")
};
constexpr int kDenseBackendCount = 6;

/// "at_linear", "onednn", "gemv", "bf16_tiles", "mkl_packed", "panels".
const char* to_string(DenseBackend backend);

/// Parses the names above (case-insensitive); c10::ValueError naming the valid ones otherwise.
DenseBackend parse_dense_backend(const std::string& name);

/// What the choice of a backend depends on.
struct DenseProblem {
  int64_t m = 0, n = 0, k = 0;        ///< x: [m, k], W: [n, k]
  at::ScalarType dtype = at::kFloat;  ///< of x and W (float32 or bfloat16)
  Isa isa = Isa::kScalar;             ///< cpu::isa(): what own kernels may use
  bool native_bf16 = false;           ///< bf16 dot products in hardware (AVX512_BF16 / AMX), within isa
  bool amx_bf16 = false;              ///< of which AMX's bf16 tiles (Intel, Sapphire Rapids on)
  bool amd = false;                   ///< an AMD (or Hygon) CPU, where MKL's kernels trail oneDNN's
  int threads = 1;                    ///< at::get_num_threads() (no table row needs it yet)
  bool onednn = false;                ///< ATen's oneDNN ops take this dtype here
  bool mkl_packed = false;            ///< MKL's packed SGEMM found (float32 only)
  bool allow_packs = true;            ///< TP_CPU_GEMM_PACK is not 0: a packed copy of W may be kept

  /// bf16 arithmetic worth taking: AMX, or AMD's AVX512_BF16 (Intel's AVX512_BF16
  /// alone does not pay: benchmarks/RESULTS.md, "The dense CPU GEMM's built-in table").
  bool bf16_arithmetic() const { return native_bf16 && (amx_bf16 || amd); }
};

/// The problem for a call made now: cpu::isa(), features(), at::get_num_threads(),
/// the libraries' capabilities and TP_CPU_GEMM_PACK.
DenseProblem dense_problem(int64_t m, int64_t n, int64_t k, at::ScalarType dtype);

/// Whether `backend` can compute `p` at all here (dtype; oneDNN's bf16 support; MKL's
/// packed SGEMM found). at_linear can compute everything.
bool dense_supports(DenseBackend backend, const DenseProblem& p);

/// The built-in table's choice (cpu/dense/table.h): a pure function of `p` (no
/// environment, no state). DenseGemm asks DenseTable::active(), which
/// TP_CPU_GEMM_TABLE may replace.
DenseBackend select_dense_backend(const DenseProblem& p);

/// The backend forced by TP_CPU_GEMM (read once; unset, empty or "auto": none). An
/// unknown name is a c10::ValueError.
std::optional<DenseBackend> forced_dense_backend();

/// Calls per backend over every DenseGemm in the process since it started (what ran,
/// after any fallback): benchmarks diff it around a row to name the kernel, as they do
/// Communicator::all_reduce_counts for strategies.
std::map<DenseBackend, int64_t> dense_backend_counts();

/// One layer's weight with what the CPU GEMMs need prepared. Thread-safe: linear() may
/// run concurrently; a stale prepacked weight is rebuilt under a lock.
class DenseGemm {
 public:
  /// Binds `weight` ([N, K], the layer's parameter: shares its storage) and prepacks it
  /// for the backend the table picks for it on this machine. Calling it again re-binds
  /// and re-packs (the method's finalize).
  void prepare(const at::Tensor& weight);

  /// Binds `weight` without packing: a pack is made on first use (a freshly created
  /// layer, whose weight reset_parameters or a load is about to fill).
  void bind(const at::Tensor& weight);

  /// Whether `x` (any CPU dtype) against the bound weight is a call the backends here
  /// serve: CPU, float32 or bfloat16, matching dtypes, unit-stride weight rows.
  bool serves(const at::Tensor& x) const;

  /// y = x W^T (+ bias), x: [..., K], bias: [N] or none, y: [..., N]; by
  /// backend_for(x, bias).
  at::Tensor linear(const at::Tensor& x, const std::optional<at::Tensor>& bias) const;

  /// The same by `backend` (tests and benchmarks force each one). A backend that
  /// cannot compute the call, or a call that needs autograd, runs at_linear.
  at::Tensor linear(const at::Tensor& x, const std::optional<at::Tensor>& bias, DenseBackend backend) const;

  /// The backend linear(x, bias) runs: at_linear for calls that need autograd or that
  /// serves() refuses, else TP_CPU_GEMM when set and able, else select_dense_backend.
  DenseBackend backend_for(const at::Tensor& x, const std::optional<at::Tensor>& bias = std::nullopt) const;

  /// Calls per backend since prepare() (what ran, after any fallback).
  std::map<DenseBackend, int64_t> counts() const;

  /// How many times the oneDNN weight was (re)packed since prepare(): 1 after a pack,
  /// +1 each time a changed weight made it stale (tests).
  int64_t packs() const { return packs_.load(); }

  /// Bytes held by the prepacked weight (0 when none).
  int64_t packed_bytes() const;

 private:
  bool can_run(const at::Tensor& x, const std::optional<at::Tensor>& bias) const;  // else at::linear
  // The current pack for `backend` (kOneDnn or kMklPacked), made or re-made when stale.
  at::Tensor packed(DenseBackend backend) const;
  at::Tensor make_pack(DenseBackend backend) const;
  at::Tensor run(DenseBackend backend, const at::Tensor& x2d, const std::optional<at::Tensor>& bias) const;

  struct Pack {
    at::Tensor data;  // undefined: none
    TensorStamp key;  // of the weight it was made from
  };
  at::Tensor weight_;  // [N, K], shares the layer's parameter
  mutable std::mutex mutex_;
  mutable std::array<Pack, kDenseBackendCount> packs_by_backend_;
  mutable std::atomic<int64_t> packs_{0};
  mutable std::array<std::atomic<int64_t>, kDenseBackendCount> counts_{};
};

}  // namespace tp::cpu
