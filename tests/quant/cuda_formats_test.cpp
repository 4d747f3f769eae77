// Every quantized format on CUDA: the four layer types at TP 1-4 (ranks as threads on
// the one GPU, over Gloo) against the same float64 reference as the CPU tests
// (quantize_activation(x) @ dequantize_weight(W)^T + b). Tagged [cuda].
//
// Tolerances: the FP8 and W8A8 paths write a bf16 GEMM output (float32 layers convert
// it back), and quantize activations on the GPU (amax / qmax per token or group, as
// the reference does; a value on a rounding boundary may round the other way); the
// weight-only paths accumulate in fp32 like the reference.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include "support/gpu_test_util.h"
#include "support/quant_layer_check.h"
#include "support/test_util.h"
#include "tp/quant/quant_config.h"

using namespace tp;
using tp::test::require_gpu;

namespace {

void check_on_cuda(const QuantConfig& config, at::ScalarType dtype, double tolerance) {
  INFO(to_string(config) << " " << c10::toString(dtype));
  test::QuantCheck check{config, dtype, tolerance};
  check.device = at::Device(at::kCUDA, 0);
  test::check_quant_layers(check);
}

}  // namespace

TEST_CASE("FP8 formats on CUDA match the float64 reference at TP 1-4", "[cuda][quant][fp8]") {
  require_gpu();
  for (auto format : {QuantFormat::kFp8PerTensor, QuantFormat::kFp8PerChannel, QuantFormat::kFp8Block}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) check_on_cuda(QuantConfig{format}, dtype, 4e-2);
  }
}

TEST_CASE("INT8 formats on CUDA match the float64 reference at TP 1-4", "[cuda][quant][int8]") {
  require_gpu();
  check_on_cuda(QuantConfig{QuantFormat::kInt8W8A8}, at::kFloat, 4e-2);
  check_on_cuda(QuantConfig{QuantFormat::kInt8W8A8}, at::kBFloat16, 4e-2);
  check_on_cuda(QuantConfig{QuantFormat::kInt8WeightOnly}, at::kFloat, 1e-3);
  check_on_cuda(QuantConfig{QuantFormat::kInt8WeightOnly}, at::kBFloat16, 3e-2);
}

TEST_CASE("INT4 formats on CUDA match the float64 reference at TP 1-4", "[cuda][quant][int4]") {
  require_gpu();
  for (auto format : {QuantFormat::kInt4Gptq, QuantFormat::kInt4Awq}) {
    for (int64_t group : {32, 128}) {
      for (bool symmetric : {true, false}) {
        QuantConfig config{format, group, symmetric};
        check_on_cuda(config, at::kFloat, 1e-3);
        check_on_cuda(config, at::kBFloat16, 3e-2);
      }
    }
  }
}
