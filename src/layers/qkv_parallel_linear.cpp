#include "tp/layers/qkv_parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <sstream>

#include "layers/column_core.h"
#include "layers/layer_common.h"
#include "tp/comm/collective_status.h"

namespace tp {

namespace {
constexpr const char* kLayer = "QKVParallelLinear";
}

QKVParallelLinearOptions::QKVParallelLinearOptions(int64_t hidden_size, int64_t head_dim, int64_t num_heads,
                                                   int64_t num_kv_heads)
    : hidden_size_(hidden_size), head_dim_(head_dim), num_heads_(num_heads), num_kv_heads_(num_kv_heads) {}

QKVParallelLinearImpl::QKVParallelLinearImpl(QKVParallelLinearOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void QKVParallelLinearImpl::reset() {
  // Collective: a rank-local failure (options that differ between ranks, an allocation)
  // fails every rank instead of leaving the others in their first collective.
  run_collectively(comm, std::string(kLayer) + " construction", [&] {
    detail::check_options(kLayer,
                          {{"hidden_size", options.hidden_size()},
                           {"head_dim", options.head_dim()},
                           {"num_heads", options.num_heads()},
                           {"num_kv_heads", options.num_kv_heads()}},
                          options.dtype());
    detail::ColumnSpec spec{options.hidden_size(), options.bias(),   options.quant(),    options.split(),
                            options.dtype(),       options.device(), options.numerics(), 0,
                            options.head_dim()};
    spec.gather_output = options.gather_output();
    spec.sequence_parallel = options.sequence_parallel();
    spec.sequence_dim = options.sequence_dim();
    core_ = detail::make_column_core(
        kLayer, spec, comm,
        [&](int64_t r, const SplitPolicy& policy) {
          auto plan = plan_heads(options.num_heads(), options.num_kv_heads(), options.head_dim(), comm.world_size(), r,
                                 policy, options.query_granularity());
          if (r == comm.rank()) head_plan_ = plan;
          return plan.qkv_plan();
        },
        *this);
    weight = core_->weight();
    bias = core_->bias();
    if (options.init_weights()) reset_parameters();
  });
}

void QKVParallelLinearImpl::reset_parameters() { core_->reset_parameters(); }

void QKVParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::QKVParallelLinear(hidden_size=" << options.hidden_size() << ", head_dim=" << options.head_dim()
         << ", num_heads=" << options.num_heads() << ", num_kv_heads=" << options.num_kv_heads()
         << ", local_q_heads=" << head_plan_.q_heads << ", local_kv_heads=" << head_plan_.kv_heads;
  if (head_plan_.kv_replicas > 1) stream << ", kv_replicas=" << head_plan_.kv_replicas;
  detail::print_tail(stream, options.bias(), options.gather_output(), core_->method(), comm,
                     options.sequence_parallel());
}

at::Tensor QKVParallelLinearImpl::forward(const at::Tensor& x) { return core_->forward(x); }

TokenQuant QKVParallelLinearImpl::input_quant(const at::Tensor& x) const { return core_->input_quant(x); }

at::Tensor QKVParallelLinearImpl::forward_quantized(const at::Tensor& codes, const at::Tensor& scales) {
  return core_->forward_quantized(codes, scales);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> QKVParallelLinearImpl::split(const at::Tensor& y) const {
  auto parts = core_->split(y, options.gather_output());
  return {parts[0], parts[1], parts[2]};
}

void QKVParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  load_weights(checkpoint, prefix, QKVCheckpointLayout());
}

void QKVParallelLinearImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix,
                                         const QKVCheckpointLayout& layout) {
  const auto& plan = core_->plan();
  const auto& q = plan.pieces.at(0);
  const auto& k = plan.pieces.at(1);
  const auto& v = plan.pieces.at(2);
  const int64_t d = options.head_dim();
  const int64_t group = head_plan_.group_size();
  // The separate layout's messages name each tensor already; a fused one names the layout too.
  std::ostringstream what;
  what << kLayer;
  if (layout.layout() != QKVLayout::kSeparate)
    what << " (checkpoint layout " << to_string(layout.layout()) << ", " << options.num_kv_heads() << " KV groups of "
         << group << " q heads, head_dim " << d << ")";
  std::vector<WeightPart> parts;
  switch (layout.layout()) {
    case QKVLayout::kSeparate:
      parts = {{prefix + "." + layout.q_name(), q.source, q.local_offset, q.segment_size},
               {prefix + "." + layout.k_name(), k.source, k.local_offset, k.segment_size},
               {prefix + "." + layout.v_name(), v.source, v.local_offset, v.segment_size}};
      break;
    case QKVLayout::kFused: {
      const std::string name = prefix + "." + layout.fused_name();
      for (const auto* piece : {&q, &k, &v})
        parts.push_back({name, piece->fused_source(), piece->local_offset, plan.global_size});
      break;
    }
    case QKVLayout::kInterleavedGroups: {
      // Group g occupies rows [g * block, (g + 1) * block): its query heads, its k
      // head, its v head. A rank's query heads are contiguous within each group, so
      // it reads one block of q rows per group it touches, and one k and one v block
      // per KV head: each a contiguous dim-0 range, never the whole tensor.
      const std::string name = prefix + "." + layout.fused_name();
      const int64_t block = (group + 2) * d;
      const Range qh = head_plan_.q_heads;
      for (int64_t h = qh.begin; h < qh.end;) {
        const int64_t g = h / group;
        const int64_t h_end = std::min(qh.end, (g + 1) * group);
        const int64_t row = g * block + (h - g * group) * d;
        parts.push_back({name, {row, row + (h_end - h) * d}, q.local_offset + (h - qh.begin) * d, plan.global_size});
        h = h_end;
      }
      const Range kvh = head_plan_.kv_heads;
      for (int64_t g = kvh.begin; g < kvh.end; ++g) {
        const int64_t k_row = g * block + group * d;
        parts.push_back({name, {k_row, k_row + d}, k.local_offset + (g - kvh.begin) * d, plan.global_size});
        parts.push_back({name, {k_row + d, k_row + 2 * d}, v.local_offset + (g - kvh.begin) * d, plan.global_size});
      }
      break;
    }
  }
  core_->load_parts(checkpoint, parts, what.str());
}

std::map<std::string, at::Tensor> QKVParallelLinearImpl::gather_weights(const std::string& prefix,
                                                                        const QKVCheckpointLayout& layout) const {
  auto [w, b] = core_->gather_parameters();  // [Q | K | V] rows
  if (layout.layout() == QKVLayout::kInterleavedGroups) {
    // Per KV group g: its query heads' rows, then k head g's, then v head g's.
    const int64_t d = options.head_dim(), kv = options.num_kv_heads(), group = options.num_heads() / kv;
    const int64_t q_rows = options.num_heads() * d, kv_rows = kv * d;
    std::vector<int64_t> order;
    for (int64_t g = 0; g < kv; ++g) {
      for (int64_t r = 0; r < group * d; ++r) order.push_back(g * group * d + r);
      for (int64_t r = 0; r < d; ++r) order.push_back(q_rows + g * d + r);
      for (int64_t r = 0; r < d; ++r) order.push_back(q_rows + kv_rows + g * d + r);
    }
    const auto index = at::tensor(order, at::TensorOptions(at::kLong).device(w.device()));
    w = w.index_select(0, index);
    if (b.defined()) b = b.index_select(0, index);
  }
  if (layout.layout() != QKVLayout::kSeparate) {
    std::map<std::string, at::Tensor> out{{detail::join_name(prefix, layout.fused_name() + ".weight"), w}};
    if (b.defined()) out[detail::join_name(prefix, layout.fused_name() + ".bias")] = b;
    return out;
  }
  return detail::split_segments(core_->plan(), w, b, prefix, {layout.q_name(), layout.k_name(), layout.v_name()});
}

namespace {
std::vector<Range> head_ranges(const std::vector<SegmentPlan>& plans, size_t segment, int64_t head_dim) {
  std::vector<Range> out;
  for (const auto& plan : plans) {
    const Range r = plan.pieces.at(segment).source;
    out.push_back({r.begin / head_dim, r.end / head_dim});
  }
  return out;
}
}  // namespace

std::vector<Range> QKVParallelLinearImpl::q_head_ranges() const {
  return head_ranges(core_->plans(), 0, options.head_dim());
}

std::vector<Range> QKVParallelLinearImpl::kv_head_ranges() const {
  return head_ranges(core_->plans(), 1, options.head_dim());
}

SplitPolicy QKVParallelLinearImpl::attention_output_split() const {
  std::vector<double> weights;
  for (const auto& plan : core_->plans()) weights.push_back(static_cast<double>(plan.pieces.at(0).size()));
  SplitPolicy policy;
  policy.granularity = options.head_dim();
  // All ranks owning zero query heads cannot happen (num_heads > 0), so the weights are valid.
  policy.weights = std::move(weights);
  return policy;
}

const Reduction& QKVParallelLinearImpl::input_reduction() const { return core_->input_reduction(); }
const Reduction& QKVParallelLinearImpl::output_reduction() const { return core_->output_reduction(); }

LoRAImpl& QKVParallelLinearImpl::lora() {
  if (!named_children().contains("lora")) register_module("lora", core_->lora());
  return *core_->lora();
}

}  // namespace tp
