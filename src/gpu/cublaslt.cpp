#include "gpu/cublaslt.h"

#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <ATen/cuda/CUDAContextLight.h>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <c10/util/hash.h>

#include "common/cuda_check.h"

namespace tp::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// ---- RAII owners: a check that throws between create and destroy leaks nothing. ----
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t d) const { cublasLtMatrixLayoutDestroy(d); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDeleter>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using Preference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value, const char* name,
              const MatmulSpec& spec) {
  TP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), "setting ", name, " for ",
                  spec.describe());
}

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, const char* which,
                   const MatmulSpec& spec) {
  cublasLtMatrixLayout_t raw = nullptr;
  TP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&raw, type, rows, cols, ld), "the layout of ", which, " (rows=", rows,
                  " cols=", cols, " ld=", ld, ") for ", spec.describe());
  return Layout(raw);
}

// ---- The heuristic cache --------------------------------------------------------------
struct CacheKey {
  int device;
  MatmulSpec spec;
  bool operator==(const CacheKey& o) const { return device == o.device && spec == o.spec; }
};

struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    const auto& s = k.spec;
    return c10::get_hash(k.device, s.m, s.n, s.k, s.lda, s.ldb, s.ldd, s.trans_a, s.trans_b, static_cast<int>(s.a_type),
                         static_cast<int>(s.b_type), static_cast<int>(s.d_type), static_cast<int>(s.compute),
                         static_cast<int>(s.scale_type), s.a_scale_mode, s.b_scale_mode, s.bias,
                         static_cast<int>(s.bias_type), s.align_a, s.align_b, s.align_d, s.align_bias);
  }
};

struct CachedAlgo {
  bool supported = false;
  cublasLtMatmulAlgo_t algo{};
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<CacheKey, CachedAlgo, CacheKeyHash>& cache() {
  static auto* c = new std::unordered_map<CacheKey, CachedAlgo, CacheKeyHash>();  // never destroyed:
  return *c;  // GEMMs may run from static destructors of other objects at exit
}

// ---- One workspace per (device, stream) -------------------------------------------------
// Kernels on one stream run in order, so they can share a workspace; two streams
// cannot. Allocated through torch's caching allocator so it is accounted with
// torch's memory, and kept for the life of the process (streams are few).
void* workspace(int device, cudaStream_t stream) {
  static std::mutex m;
  static auto* map = new std::unordered_map<uint64_t, c10::DataPtr>();
  const uint64_t key = (static_cast<uint64_t>(device) << 56) ^ reinterpret_cast<uintptr_t>(stream);
  std::lock_guard<std::mutex> lock(m);
  auto it = map->find(key);
  if (it == map->end()) {
    it = map->emplace(key, c10::cuda::CUDACachingAllocator::get()->allocate(kWorkspaceBytes)).first;
  }
  return it->second.get();
}

MatmulDesc make_desc(const MatmulSpec& spec, const MatmulArgs* args) {
  cublasLtMatmulDesc_t raw = nullptr;
  TP_CHECK_CUBLAS(cublasLtMatmulDescCreate(&raw, spec.compute, spec.scale_type), "the matmul descriptor of ",
                  spec.describe());
  MatmulDesc desc(raw);
  const cublasOperation_t ta = spec.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = spec.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(raw, CUBLASLT_MATMUL_DESC_TRANSA, ta, "TRANSA", spec);
  set_desc(raw, CUBLASLT_MATMUL_DESC_TRANSB, tb, "TRANSB", spec);
  if (spec.a_scale_mode >= 0) {
    set_desc(raw, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, spec.a_scale_mode, "A_SCALE_MODE", spec);
    const void* p = args ? args->a_scale : nullptr;
    set_desc(raw, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p, "A_SCALE_POINTER", spec);
  }
  if (spec.b_scale_mode >= 0) {
    set_desc(raw, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, spec.b_scale_mode, "B_SCALE_MODE", spec);
    const void* p = args ? args->b_scale : nullptr;
    set_desc(raw, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p, "B_SCALE_POINTER", spec);
  }
  if (spec.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    set_desc(raw, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "EPILOGUE", spec);
    const int32_t bias_type = spec.bias_type;
    set_desc(raw, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "BIAS_DATA_TYPE", spec);
    const void* p = args ? args->bias : nullptr;
    set_desc(raw, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p, "BIAS_POINTER", spec);
  }
  return desc;
}

struct Layouts {
  Layout a, b, d;
};

Layouts make_layouts(const MatmulSpec& spec) {
  // Stored (not op'd) shapes: A is k x m when transposed, B is k x n when not.
  return {make_layout(spec.a_type, spec.trans_a ? spec.k : spec.m, spec.trans_a ? spec.m : spec.k, spec.lda, "A", spec),
          make_layout(spec.b_type, spec.trans_b ? spec.n : spec.k, spec.trans_b ? spec.k : spec.n, spec.ldb, "B", spec),
          make_layout(spec.d_type, spec.m, spec.n, spec.ldd, "D", spec)};
}

CachedAlgo query(const MatmulSpec& spec, cublasLtHandle_t handle, const MatmulArgs& args) {
  // With the first call's pointers: the heuristic never reads them, but some
  // cuBLASLt versions validate that scale and bias pointers are set.
  auto desc = make_desc(spec, &args);
  auto layouts = make_layouts(spec);
  cublasLtMatmulPreference_t raw = nullptr;
  TP_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&raw), "the preference of ", spec.describe());
  Preference pref(raw);
  const uint64_t ws = kWorkspaceBytes;
  TP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                  "MAX_WORKSPACE_BYTES for ", spec.describe());
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(spec.align_a)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(spec.align_b)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(spec.align_d)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(spec.align_d)}};
  for (const auto& [attr, value] : aligns) {
    TP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(raw, attr, &value, sizeof(value)), "MIN_ALIGNMENT for ",
                    spec.describe());
  }
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const auto status = cublasLtMatmulAlgoGetHeuristic(handle, desc.get(), layouts.a.get(), layouts.b.get(),
                                                     layouts.d.get(), layouts.d.get(), raw, 1, &result, &count);
  // NOT_SUPPORTED (or no result) means "no kernel for this combination on this GPU":
  // an answer, not an error. INVALID_VALUE is how some cuBLASLt versions refuse an
  // unsupported scale mode, so it is an answer too; anything else is a real failure.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE || count == 0) return {};
  TP_CHECK_CUBLAS(status, "cublasLtMatmulAlgoGetHeuristic for ", spec.describe());
  return {true, result.algo};
}

}  // namespace

bool MatmulSpec::operator==(const MatmulSpec& o) const {
  return m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldd == o.ldd && trans_a == o.trans_a &&
         trans_b == o.trans_b && a_type == o.a_type && b_type == o.b_type && d_type == o.d_type &&
         compute == o.compute && scale_type == o.scale_type && a_scale_mode == o.a_scale_mode &&
         b_scale_mode == o.b_scale_mode && bias == o.bias && bias_type == o.bias_type && align_a == o.align_a &&
         align_b == o.align_b && align_d == o.align_d && align_bias == o.align_bias;
}

const char* data_type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "fp16";
    case CUDA_R_32F: return "fp32";
    case CUDA_R_8F_E4M3: return "fp8e4m3";
    case CUDA_R_8F_E5M2: return "fp8e5m2";
    case CUDA_R_8I: return "int8";
    case CUDA_R_32I: return "int32";
    default: return "other";
  }
}

namespace {
const char* scale_mode_name(int32_t mode) {
  switch (mode) {
    case -1: return "none";
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "scalar";
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return "outer_vec";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "vec128";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "blk128x128";
    default: return "other";
  }
}
}  // namespace

std::string MatmulSpec::describe() const {
  std::ostringstream out;
  out << "cublasLt matmul m=" << m << " n=" << n << " k=" << k << " (lda=" << lda << " ldb=" << ldb << " ldd=" << ldd
      << (trans_a ? " A^T" : " A") << (trans_b ? " B^T" : " B") << ") A=" << data_type_name(a_type)
      << " B=" << data_type_name(b_type) << " D=" << data_type_name(d_type);
  if (a_scale_mode >= 0 || b_scale_mode >= 0) {
    out << " scales=(" << scale_mode_name(a_scale_mode) << ", " << scale_mode_name(b_scale_mode) << ")";
  }
  if (bias) out << " bias=" << data_type_name(bias_type);
  return out.str();
}

int32_t pointer_alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int32_t a = 1;
  while (a < 256 && (v % (2 * a)) == 0) a *= 2;
  return a;
}

bool matmul(const MatmulSpec& spec, const MatmulArgs& args, const char* what) {
  TORCH_INTERNAL_ASSERT(spec.m > 0 && spec.n > 0 && spec.k > 0, what,
                        ": empty GEMM reached cuBLASLt: ", spec.describe());
  int device = 0;
  TP_CHECK_CUDA(cudaGetDevice(&device));
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const CacheKey key{device, spec};
  CachedAlgo algo;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = cache().find(key);
    if (it != cache().end()) {
      algo = it->second;
    } else {
      // Queried under the lock: a few milliseconds once per shape, and two threads
      // asking for the same new shape then ask cuBLASLt once.
      algo = query(spec, handle, args);
      cache().emplace(key, algo);
    }
  }
  if (!algo.supported) return false;

  auto desc = make_desc(spec, &args);
  auto layouts = make_layouts(spec);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const float beta_f = 0.0f;
  const int32_t beta_i = 0;
  const bool int_scale = spec.scale_type == CUDA_R_32I;
  const void* alpha = int_scale ? static_cast<const void*>(&args.alpha_i) : static_cast<const void*>(&args.alpha_f);
  const void* beta = int_scale ? static_cast<const void*>(&beta_i) : static_cast<const void*>(&beta_f);
  // C = D with beta = 0: C is never read, but cuBLASLt wants a layout for it.
  const auto status = cublasLtMatmul(handle, desc.get(), alpha, args.a, layouts.a.get(), args.b, layouts.b.get(), beta,
                                     args.d, layouts.d.get(), args.d, layouts.d.get(), &algo.algo,
                                     workspace(device, stream), kWorkspaceBytes, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The heuristic offered an algorithm that then refused these arguments: remember
    // the spec as unsupported, so the caller's fallback is taken from now on.
    std::lock_guard<std::mutex> lock(cache_mutex());
    cache()[key] = CachedAlgo{};
    return false;
  }
  TP_CHECK_CUBLAS(status, what, ": ", spec.describe());
  return true;
}

}  // namespace tp::cuda
