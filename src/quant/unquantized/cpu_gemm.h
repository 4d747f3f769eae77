#pragma once
// The unquantized method's CPU GEMM: y = x W^T (+ bias) for float32 and bfloat16
// layers, by whichever backend is fastest for the call's shape, dtype, ISA and thread
// count. The choice is a pure function of those (select_cpu_gemm), observable
// (CpuGemm::counts, CpuGemm::backend_for) and forcible (TP_CPU_GEMM=<name>).
//
//   backend      what runs                                          prepacked weight
//   at_linear    at::linear (MKL sgemm; ATen's / oneDNN's bf16 GEMM)  -
//   onednn       oneDNN inner product on a weight reordered once     a second copy of W,
//                to oneDNN's blocked layout (mkldnn::_linear_        in oneDNN's layout
//                pointwise, shipped in LibTorch)
//   gemv         own AVX2 / AVX-512 kernel for small M, threaded      -
//                over N (cpu_gemm_kernels.h): streams W once
//   bf16_tiles   bfloat16 W converted to float32 one tile of rows     -
//                at a time, float32 GEMM on the tile (machines
//                without native bf16 arithmetic)
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

#include "common/cpu_features.h"

namespace tp::detail {

/// The CPU GEMM backends of the unquantized method.
enum class CpuGemmBackend {
  kAtLinear,   ///< at::linear
  kOneDnn,     ///< oneDNN inner product with a weight reordered once ("onednn")
  kGemv,       ///< own small-M kernel, AVX2 / AVX-512 / portable ("gemv")
  kBf16Tiles,  ///< bfloat16 weight converted per tile, float32 GEMM ("bf16_tiles")
};
constexpr int kCpuGemmBackendCount = 4;

/// "at_linear", "onednn", "gemv", "bf16_tiles".
const char* to_string(CpuGemmBackend backend);

/// Parses the names above (case-insensitive); c10::ValueError naming the valid ones otherwise.
CpuGemmBackend parse_cpu_gemm_backend(const std::string& name);

/// What the choice of a backend depends on.
struct CpuGemmProblem {
  int64_t m = 0, n = 0, k = 0;           ///< x: [m, k], W: [n, k]
  at::ScalarType dtype = at::kFloat;     ///< of x and W (float32 or bfloat16)
  CpuIsa isa = CpuIsa::kScalar;          ///< cpu_isa(): what own kernels may use
  bool native_bf16 = false;              ///< bf16 dot products in hardware (AVX512_BF16 / AMX), within isa
  int threads = 1;                       ///< at::get_num_threads()
};

/// The problem for a call made now: cpu_isa(), cpu_features(), at::get_num_threads().
CpuGemmProblem cpu_gemm_problem(int64_t m, int64_t n, int64_t k, at::ScalarType dtype);

/// Whether `backend` can compute `p` at all (dtype, oneDNN in this build). at_linear
/// can compute everything.
bool cpu_gemm_supports(CpuGemmBackend backend, const CpuGemmProblem& p);

/// The built-in table's choice: a pure function of `p`, from the measurements in
/// cpu_gemm.cpp.
CpuGemmBackend select_cpu_gemm(const CpuGemmProblem& p);

/// The backend forced by TP_CPU_GEMM (read once; unset, empty or "auto": none). An
/// unknown name is a c10::ValueError.
std::optional<CpuGemmBackend> forced_cpu_gemm();

/// Calls per backend over every CpuGemm in the process since it started (what ran,
/// after any fallback): benchmarks diff it around a row to name the kernel, as they do
/// Communicator::all_reduce_counts for strategies.
std::map<CpuGemmBackend, int64_t> cpu_gemm_counts();

/// Largest M the gemv backend is chosen for (it reads W once per 4 rows of x).
constexpr int64_t kCpuGemvMaxM = 4;

/// One layer's weight with what the CPU GEMMs need prepared. Thread-safe: linear() may
/// run concurrently; a stale prepacked weight is rebuilt under a lock.
class CpuGemm {
 public:
  /// Binds `weight` ([N, K], the layer's parameter: shares its storage) and prepacks it
  /// for the backends the table may pick for it on this machine. Calling it again
  /// re-binds and re-packs.
  void prepare(const at::Tensor& weight);

  /// Whether `x` (any CPU dtype) against the bound weight is a call the backends here
  /// serve: CPU, float32 or bfloat16, matching dtypes, unit-stride weight rows.
  bool serves(const at::Tensor& x) const;

  /// y = x W^T (+ bias), x: [..., K], bias: [N] or none, y: [..., N]; by
  /// backend_for(x, bias).
  at::Tensor linear(const at::Tensor& x, const std::optional<at::Tensor>& bias) const;

  /// The same by `backend` (tests and benchmarks force each one). A backend that
  /// cannot compute the call, or a call that needs autograd, runs at_linear.
  at::Tensor linear(const at::Tensor& x, const std::optional<at::Tensor>& bias, CpuGemmBackend backend) const;

  /// The backend linear(x, bias) runs: at_linear for calls that need autograd or that
  /// serves() refuses, else TP_CPU_GEMM when set and able, else select_cpu_gemm.
  CpuGemmBackend backend_for(const at::Tensor& x, const std::optional<at::Tensor>& bias = std::nullopt) const;

  /// Calls per backend since prepare() (what ran, after any fallback).
  std::map<CpuGemmBackend, int64_t> counts() const;

  /// How many times the oneDNN weight was (re)packed since prepare(): 1 after a pack,
  /// +1 each time a changed weight made it stale (tests).
  int64_t packs() const { return packs_.load(); }

  /// Bytes held by the prepacked weight (0 when none).
  int64_t packed_bytes() const;

 private:
  struct Key {
    const void* data = nullptr;
    int64_t version = -1;  // -1: an inference tensor (no version counter)
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype = at::kFloat;
    bool operator==(const Key& o) const {
      return data == o.data && version == o.version && sizes == o.sizes && strides == o.strides && dtype == o.dtype;
    }
  };
  static Key key_of(const at::Tensor& w);
  bool can_run(const at::Tensor& x, const std::optional<at::Tensor>& bias) const;  // else at::linear
  at::Tensor onednn_weight() const;  // the current oneDNN pack, rebuilt when stale
  at::Tensor run(CpuGemmBackend backend, const at::Tensor& x2d, const std::optional<at::Tensor>& bias) const;

  at::Tensor weight_;  // [N, K], shares the layer's parameter
  mutable std::mutex mutex_;
  mutable at::Tensor onednn_;  // oneDNN's blocked copy of weight_, or undefined
  mutable Key onednn_key_;
  mutable std::atomic<int64_t> packs_{0};
  mutable std::array<std::atomic<int64_t>, kCpuGemmBackendCount> counts_{};
};

}  // namespace tp::detail
