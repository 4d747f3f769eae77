#pragma once
// The unquantized method: weights in the layer's dtype, GEMM by at::linear (ATen's
// CPU BLAS or cuBLAS), which is the reference every other format is judged against.

#include "tp/quant/quant_method.h"

namespace tp {

class UnquantizedMethod final : public QuantMethod {
 public:
  std::string name() const override { return "none"; }
  int64_t tp_alignment(ShardMode) const override { return 1; }
  void create_weights(torch::nn::Module& layer, int64_t out_local, int64_t in_local,
                      const at::TensorOptions& options) override;
  void reset_parameters(int64_t global_in_features) override;
  void load(const Checkpoint& checkpoint, const std::vector<WeightPart>& parts, ShardMode mode,
            const std::string& layer) override;
  at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& bias) const override;
  at::Tensor weight() const override { return weight_; }
  at::ScalarType activation_dtype() const override { return weight_.scalar_type(); }
  at::Device weight_device() const override { return weight_.device(); }

 private:
  at::Tensor weight_;  // [out_local, in_local], registered on the layer as "weight"
};

}  // namespace tp
