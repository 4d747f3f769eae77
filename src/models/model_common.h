#pragma once
// Private helpers of the models area.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tp/loader/checkpoint.h"
#include "tp/models/decoder_config.h"
#include "tp/quant/quant_config.h"

namespace tp::detail {

/// The format shared by the parts of one fused layer (q/k/v, gate/up); parts in
/// different formats are an error naming them (they share one weight tensor).
QuantConfig same_quant(const DecoderConfig& config, const std::vector<std::string>& modules);

/// Copies checkpoint tensor `name` (the whole of it, the same on every rank) into
/// `target`: shapes must be equal and the dtype floating (not FP8).
void load_mirrored(const Checkpoint& checkpoint, const std::string& name, at::Tensor& target);

}  // namespace tp::detail
