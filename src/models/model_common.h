#pragma once
// Private helpers of the models area.

#include <string>

#include <ATen/core/Tensor.h>

#include "tp/loader/checkpoint.h"

namespace tp::detail {

/// Copies checkpoint tensor `name` (the whole of it, the same on every rank) into
/// `target`: shapes must be equal and the dtype floating (not FP8).
void load_mirrored(const Checkpoint& checkpoint, const std::string& name, at::Tensor& target);

}  // namespace tp::detail
