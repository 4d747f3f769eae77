#pragma once
// Where a mixture of experts' tensors are in a checkpoint (MoECheckpointLayout), both
// ways: the prefixes an expert's QuantMethods read from, and the names and shapes
// gather_weights writes back.
//
// A fused layout (one [experts, ...] tensor per projection) is read through a view per
// expert: a small Checkpoint whose sources are expert e of the fused tensors, the gate
// or up rows of it (every other row when interleaved), transposed back to [out, in]
// where the layout stores [in, out]. A view reads only its region of the file
// (TensorSource::read_region), and resolves the fused tensor through the caller's
// checkpoint on first use, so the fused tensors a load reads are recorded as read and
// the others stay unread (strict loading still names them).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "layers/moe/expert.h"
#include "tp/layers/moe/moe_parallel_mlp.h"
#include "tp/loader/checkpoint.h"

namespace tp::detail {

/// An MoE block's sizes, for naming and checking its tensors.
struct MoEShape {
  int64_t hidden = 0, intermediate = 0, experts = 0;
};

/// Expert e's prefixes in a per-expert layout: "<prefix>.experts.<e>.<gate_name>", ...
ExpertPrefixes per_expert_prefixes(const std::string& prefix, const MoECheckpointLayout& layout, int64_t e);

/// The prefix every tensor of expert e has in a per-expert layout ("<prefix>.experts.<e>.").
std::string expert_name_prefix(const std::string& prefix, int64_t e);

/// A view of expert e of a fused layout's tensors (see the file comment), and the
/// prefixes its QuantMethods read from it. `checkpoint` must outlive the view (it is the
/// caller's recording view: the fused tensors are resolved through it). The fused
/// tensors' shapes are checked here (experts first, the gate/up rows or the hidden rows
/// where the layout puts them), each error naming the tensor and the layout.
struct FusedExpertView {
  Checkpoint checkpoint;
  ExpertPrefixes prefixes;
};
FusedExpertView fused_expert_view(const Checkpoint& checkpoint, const std::string& prefix,
                                  const MoECheckpointLayout& layout, const MoEShape& shape, int64_t e,
                                  const std::string& what);

/// An expert's whole tensors, as gather_weights assembles them: gate, up [intermediate,
/// hidden], down [hidden, intermediate], and with biases gate, up [intermediate] and
/// down [hidden] biases.
struct ExpertTensors {
  at::Tensor gate, up, down, gate_bias, up_bias, down_bias;
};

/// The tensors of every expert (experts[e]) under the layout's names: per expert
/// "<prefix>.experts.<e>.<gate_name>.weight" (".bias"), or the fused 3-D tensors,
/// interleaved and transposed as the layout stores them.
std::map<std::string, at::Tensor> expert_checkpoint_tensors(const std::string& prefix,
                                                            const MoECheckpointLayout& layout,
                                                            const std::vector<ExpertTensors>& experts);

}  // namespace tp::detail
