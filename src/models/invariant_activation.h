#pragma once
// Private: the MLP's activation under invariant numerics (tp/layers/numerics/numerics.h), for the
// decoder (src/models/decoder_layer.cpp).
//
// Why ATen's activation is not enough: its elementwise kernels run a row through a vector
// loop and its last few elements (and a thread's share's edges) through a scalar one, and
// the two evaluate exp, erf and tanh differently, so an element's last bit depends on where
// its row, its thread's share or its tensor ends. A rank's slice of the intermediate
// dimension ends elsewhere than TP 1's whole row (intermediate 1000 at TP 2: rows of 500
// where TP 1 has 1000), so silu(gate) differed from TP 1's in the last bit on shapes off the
// vector width, and every later sum spread it. Here every element, forward and backward,
// goes through one scalar function of its value alone (evaluated in float64, rounded once to
// float32, then to the tensor's dtype): the same bits wherever it lies, at every TP size,
// batch, thread count and CPU ISA.

#include <ATen/core/Tensor.h>

#include "tp/models/model_config.h"

namespace tp::detail {

/// act(x) for x float32 or bfloat16 [...], differentiable (its gradient the same way).
at::Tensor invariant_activation(Activation act, const at::Tensor& x);

}  // namespace tp::detail
