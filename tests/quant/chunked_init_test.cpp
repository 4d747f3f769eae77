// reset_parameters draws and quantizes a large weight a range of rows at a time, and
// the INT4 finalize() unpacks and repacks it a range at a time (quant/random_weight.h:
// for_each_row_chunk), so that neither holds a float32 copy of the whole weight. These
// layers are large enough for several chunks, with a last one that is not a whole
// block / panel: every row must land where it belongs.

#include "support/tp_catch.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <string>
#include <vector>

#include "quant/int4/cpu_kernels.h"
#include "quant/int4/packing.h"
#include "quant/random_weight.h"
#include "support/quant_formats.h"
#include "support/test_util.h"
#include "tp/quant/quant_method.h"
#include "tp/quant/quantize.h"

using namespace tp;

TEST_CASE("quantized layers large enough for several init chunks hold one well-placed random weight", "[quant]") {
  // 2056 x 2048: 4.2 M elements = 2048-row chunks (at kRandomInitChunkElements = 4 M)
  // ... so two chunks of which the last has 8 rows: not a whole 128-row FP8 block,
  // nor a 16-row INT4 panel.
  const int64_t n = 2056, k = 2048;
  REQUIRE(n * k > tp::detail::kRandomInitChunkElements);
  const double bound = 1.0 / std::sqrt(static_cast<double>(k));
  for (const std::string& name : test::quantized_format_variants()) {
    INFO(name);
    const QuantConfig config = parse_quant_config(name);
    torch::nn::Module layer;
    const auto method = make_quant_method(config);
    method->create_weights(layer, n, k, at::TensorOptions().dtype(at::kFloat));
    method->reset_parameters(k);
    QuantizedTensors stored;
    for (const auto& p : layer.named_parameters()) stored[p.key()] = p.value();
    if (config.format == QuantFormat::kFp8PerTensor) {
      // The layer keeps its one scale per row: the same in every row.
      const at::Tensor s = stored.at("weight_scale");
      CHECK(at::equal(s, s[0].expand_as(s)));
      stored["weight_scale"] = s.reshape({-1})[0];
    }
    if (config.format == QuantFormat::kFp8Block) {
      // Per row too: each block's scale in all of its 128 rows.
      const at::Tensor s = stored.at("weight_scale_inv");
      const at::Tensor blocks = s.slice(0, 0, n, 128);
      CHECK(at::equal(blocks.repeat_interleave(128, 0).narrow(0, 0, n), s));
      stored["weight_scale_inv"] = blocks;
    }
    // The stored tensors are one random weight: U(-bound, bound) up to the format's
    // rounding, in every row (a chunk written to the wrong rows leaves rows of the
    // initial zeros: a row's spread would be 0).
    const at::Tensor w = dequantize_weight(stored, config).to(at::kDouble);
    CHECK(w.abs().max().item<double>() <= bound * 1.2);
    const at::Tensor row_std = w.std(1);
    CHECK(row_std.min().item<double>() > bound / std::sqrt(3.0) * 0.8);
    CHECK(row_std.max().item<double>() < bound / std::sqrt(3.0) * 1.2);
    // The kernels (INT4: repacked in chunks) compute with exactly those tensors.
    const at::Tensor x = test::randn({3, k}, 901).to(at::kFloat);
    const at::Tensor xq = quantize_activation(x, stored, config).to(at::kDouble);
    const at::Tensor ref = at::matmul(xq, w.t());
    CHECK(test::relative_error(method->apply(x, std::nullopt), ref) <= 1e-5);
    CHECK(at::equal(method->dequantized_weight().to(at::kDouble), w));
  }
}

TEST_CASE("int4_cpu_concat of packs of row ranges equals the pack of the whole weight", "[quant][cpu_kernels]") {
  const int64_t n = 72, k = 256, g = 64;  // ranges of 32, 32 and 8 rows: the last panel half full
  const auto codes = at::randint(0, 16, {n, k}, test::generator(31), at::TensorOptions().dtype(at::kInt));
  const auto zero = at::randint(0, 16, {k / g, n}, test::generator(32), at::TensorOptions().dtype(at::kInt));
  for (bool f16_everywhere : {true, false}) {
    INFO("float16 scales in every part: " << f16_everywhere);
    at::Tensor scale = at::rand({k / g, n}, test::generator(33)).add_(0.01).to(at::kHalf).to(at::kFloat);
    if (!f16_everywhere) scale[0][40] = 1.0f + 1.0f / 4096;  // not a float16: that part keeps float32
    const auto whole = tp::detail::int4_cpu_pack(codes, scale, zero, g);
    std::vector<tp::detail::Int4CpuWeight> parts;
    for (int64_t first : {0, 32, 64}) {
      const int64_t rows = std::min<int64_t>(32, n - first);
      parts.push_back(tp::detail::int4_cpu_pack(codes.narrow(0, first, rows), scale.narrow(1, first, rows).contiguous(),
                                                zero.narrow(1, first, rows).contiguous(), g));
    }
    const auto joined = tp::detail::int4_cpu_concat(std::move(parts));
    CHECK(joined.n == whole.n);
    CHECK(joined.panels == whole.panels);
    CHECK(at::equal(joined.codes, whole.codes));
    CHECK(joined.scales.scalar_type() == whole.scales.scalar_type());
    CHECK(at::equal(joined.scales, whole.scales));
    CHECK(at::equal(joined.zeros, whole.zeros));
  }
}
