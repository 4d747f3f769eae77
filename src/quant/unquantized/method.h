#pragma once
// The unquantized method: weights in the layer's dtype. On CPU the GEMM is whichever of
// cpu::DenseGemm's backends (cpu/dense/gemm.h: at::linear, oneDNN or MKL with a packed weight, own
// AVX2/AVX-512 kernels) is fastest for the call; on CUDA cuBLASLt; other dtypes
// at::linear, the reference every other format is judged against.

#include <memory>

#include "cpu/dense/gemm.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"

namespace tp::detail {

class UnquantizedMethod final : public QuantMethod {
 public:
  std::string name() const override { return "none"; }
  bool trainable() const override { return true; }
  int64_t tp_alignment(ShardMode) const override { return 1; }
  void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                      const at::TensorOptions& options) override;
  void reset_parameters(int64_t global_in_features) override;
  void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
            const std::string& layer) override;
  /// Packs the CPU weight for the backend the table picks (cpu/dense/gemm.h); later in-place
  /// edits of a normal tensor re-pack on the next call by themselves.
  void finalize() override;
  at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const override;
  at::Tensor weight() const override { return weight_; }
  at::Tensor dequantized_weight() const override { return weight_; }
  at::ScalarType activation_dtype() const override { return weight_.scalar_type(); }
  at::Device weight_device() const override { return weight_.device(); }

  /// The CPU GEMM's view of the weight (tests, benchmarks: backend_for, counts).
  const cpu::DenseGemm& cpu_gemm() const { return cpu_gemm_; }

 private:
  at::Tensor weight_;        // [out_local, in_local], registered on the layer as "weight"
  cpu::DenseGemm cpu_gemm_;  // bound to weight_; packs made by finalize() or on first use
};

// The format table's row for kNone.
std::shared_ptr<QuantMethod> make_unquantized_method(const QuantConfig& config);
QuantizedTensors quantize_unquantized(const at::Tensor& weight, const QuantConfig& config);
at::Tensor dequantize_unquantized(const QuantizedTensors& tensors, const QuantConfig& config);
at::Tensor quantize_activation_unquantized(const at::Tensor& x, const QuantizedTensors& tensors,
                                           const QuantConfig& config);
int64_t unquantized_alignment(const QuantConfig& config, ShardMode mode);

}  // namespace tp::detail
