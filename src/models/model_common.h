#pragma once
// Private helpers of the models area.

#include <string>

#include <ATen/core/Tensor.h>

#include "tp/loader/checkpoint.h"
#include "tp/models/model_config.h"

namespace tp::detail {

/// Copies checkpoint tensor `name` (the whole of it, the same on every rank) into
/// `target`: shapes must be equal and the dtype floating (not FP8).
void load_mirrored(const Checkpoint& checkpoint, const std::string& name, at::Tensor& target);

/// The MLP's activation under the default numerics, as transformers computes each.
at::Tensor activation(Activation act, const at::Tensor& x);

}  // namespace tp::detail
