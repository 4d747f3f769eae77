#include "tp/layers/moe/moe_parallel_mlp.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include "cpu/parallel.h"
#include "layers/layer_common.h"
#include "layers/loading/strict_load.h"
#include "layers/moe/checkpoint.h"
#include "layers/moe/expert.h"
#include "layers/moe/expert_lora_step.h"
#include "tp/comm/collective_status.h"
#include "tp/comm/differentiable.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/split.h"

namespace tp {

namespace {

// The routed experts' passes. At inference with a quantized format (tp's own kernels, whose
// results do not depend on the thread count) one expert per thread, taken in turn from a
// shared counter (the experts' token counts differ), each GEMM then on its thread alone:
// many small GEMMs one after another spent their time starting parallel regions and
// waiting for the slowest thread (benchmarks/RESULTS.md, 2026-12-07, "issue 47: MoE
// experts"). Otherwise, and in training (the autograd graph is built in order), one after
// another with each GEMM threaded. The caller adds the outputs in expert order either way.
void run_expert_passes(size_t count, bool concurrent, const std::function<void(int64_t)>& run) {
  if (concurrent) {
    cpu::parallel_tasks(static_cast<int64_t>(count), run);
    return;
  }
  for (size_t i = 0; i < count; ++i) run(static_cast<int64_t>(i));
}

constexpr const char* kLayer = "MoEParallelMLP";

// A mirrored tensor's source, checked to be `shape` of a float dtype (float8 codes would
// be read as values).
const TensorSource& checked(const Checkpoint& checkpoint, const std::string& name, std::vector<int64_t> shape) {
  const auto& source = checkpoint.get(name, kLayer);
  TORCH_CHECK_VALUE(source.shape() == shape, kLayer, ": tensor '", name, "' has shape ",
                    c10::IntArrayRef(source.shape()), "; expected ", c10::IntArrayRef(shape));
  const auto t = source.dtype();
  TORCH_CHECK_TYPE(t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16, kLayer, ": tensor '",
                   name, "' has dtype ", t,
                   "; the router and the shared expert's gate are stored unquantized "
                   "(float64, float32, float16 or bfloat16)");
  return source;
}

// Every tensor under `prefix`, looked up so that this rank's strict check counts it as
// read: tensors another rank reads and checks (its experts), whose errors reach this
// rank through run_collectively.
void leave_to_other_ranks(const Checkpoint& checkpoint, const std::string& prefix) {
  for (const auto& name : checkpoint.names_with_prefix(prefix)) checkpoint.get(name, kLayer);
}

}  // namespace

const char* to_string(ExpertLayout layout) {
  switch (layout) {
    case ExpertLayout::kPerExpert: return "per_expert";
    case ExpertLayout::kFused: return "fused";
  }
  return "?";
}

MoEParallelMLPOptions::MoEParallelMLPOptions(int64_t hidden_size, int64_t intermediate_size, int64_t num_experts,
                                             int64_t top_k)
    : hidden_size_(hidden_size), intermediate_size_(intermediate_size), num_experts_(num_experts), top_k_(top_k) {}

MoEParallelMLPImpl::MoEParallelMLPImpl(MoEParallelMLPOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

namespace {

// The intermediate dimension's split: whole quant groups / blocks of both the column
// (gate/up rows) and the row (down columns) side.
SplitPolicy expert_split(const QuantConfig& quant) {
  return SplitPolicy{}.with_granularity(
      combine_granularity(tp_alignment(quant, ShardMode::kColumn), tp_alignment(quant, ShardMode::kRow)));
}

// The weights of ranks [first, first + count), or of each group's ranks summed (empty: even).
std::vector<double> weights_of(const std::vector<double>& w, int64_t first, int64_t count, int64_t groups = 0) {
  if (w.empty()) return {};
  std::vector<double> out;
  if (groups == 0) return {w.begin() + first, w.begin() + first + count};
  const int64_t per_group = static_cast<int64_t>(w.size()) / groups;
  for (int64_t g = 0; g < groups; ++g) {
    double sum = 0;
    for (int64_t j = 0; j < per_group; ++j) sum += w[static_cast<size_t>(g * per_group + j)];
    out.push_back(sum);
  }
  return out;
}

int64_t resolved_ep(const MoEParallelMLPOptions& o, int64_t world) {
  const int64_t ep = o.expert_parallel_size() == 0 ? world : o.expert_parallel_size();
  TORCH_CHECK_VALUE(ep >= 1 && world % ep == 0, kLayer, ": expert_parallel_size=", o.expert_parallel_size(),
                    " must divide the world size ", world,
                    " (each expert group is world / expert_parallel_size ranks; 0: one group per rank)");
  TORCH_CHECK_VALUE(o.split_weights().empty() || static_cast<int64_t>(o.split_weights().size()) == world, kLayer, ": ",
                    o.split_weights().size(), " split_weights for world size ", world,
                    " (one per rank, or none for an even split)");
  return ep;
}

}  // namespace

MoEPlacement moe_placement(const MoEParallelMLPOptions& o, int64_t world, int64_t rank) {
  const int64_t ep = resolved_ep(o, world), per_group = world / ep, group = rank / per_group;
  const auto& w = o.split_weights();
  const int64_t rot = o.split_rotation();
  return detail::with_layer_context(kLayer, [&] {
    MoEPlacement p;
    p.experts = split_for_rank(o.num_experts(), ep, group,
                               SplitPolicy{}.with_weights(weights_of(w, 0, 0, ep)).with_rotation(rot),
                               std::string(kLayer) + " experts");
    p.rows = split_for_rank(
        o.intermediate_size(), per_group, rank % per_group,
        expert_split(o.quant()).with_weights(weights_of(w, group * per_group, per_group)).with_rotation(rot),
        std::string(kLayer) + " intermediate_size");
    if (o.shared_expert_intermediate_size() > 0) {
      p.shared_rows = split_for_rank(o.shared_expert_intermediate_size(), world, rank,
                                     expert_split(o.shared_expert_quant()).with_weights(w).with_rotation(rot + 1),
                                     std::string(kLayer) + " shared_expert_intermediate_size");
    }
    return p;
  });
}

void MoEParallelMLPImpl::reset() {
  run_collectively(comm, std::string(kLayer) + " construction", [&] {
    const auto& o = options;
    detail::check_options(kLayer,
                          {{"hidden_size", o.hidden_size()},
                           {"intermediate_size", o.intermediate_size()},
                           {"num_experts", o.num_experts()}},
                          o.dtype());
    check_router_options(o.router(), o.num_experts(), o.top_k(), kLayer);
    combine_ = o.reduce_output() ? Reduction::all_reduce(comm) : Reduction::none(comm);
    TORCH_CHECK_VALUE(detail::is_expert_activation(o.activation()), kLayer, ": activation \"", o.activation(),
                      "\"; expected silu, gelu, gelu_tanh or swiglu_oai");
    TORCH_CHECK_VALUE(o.shared_expert_intermediate_size() >= 0, kLayer,
                      ": shared_expert_intermediate_size=", o.shared_expert_intermediate_size(),
                      " must be >= 0 (0: no shared expert)");
    TORCH_CHECK_VALUE(!o.shared_expert_gate() || o.shared_expert_intermediate_size() > 0, kLayer,
                      ": shared_expert_gate needs a shared expert (shared_expert_intermediate_size > 0)");
    const int64_t world = comm.world_size();
    ep_ = resolved_ep(o, world);
    const MoEPlacement mine = moe_placement(o, world, comm.rank());
    experts_ = mine.experts;
    range_ = mine.rows;
    const auto t = at::TensorOptions(o.dtype()).device(o.device());
    router_weight = register_parameter("router_weight", at::empty({o.num_experts(), o.hidden_size()}, t));
    router_bias = o.router().bias() ? register_parameter("router_bias", at::empty({o.num_experts()}, t)) : at::Tensor();
    // A buffer: updated by a balancing rule, not by gradients (DeepSeek-V3); float32 as
    // transformers keeps it.
    score_correction_bias =
        o.router().score_correction_bias()
            ? register_buffer("score_correction_bias", at::zeros({o.num_experts()}, t.dtype(at::kFloat)))
            : at::Tensor();
    auto experts = register_module("experts", std::make_shared<torch::nn::Module>("tp::MoEExperts"));
    experts_shards_.clear();
    const bool adds_down_bias = rank_in_expert_group() == 0;
    for (int64_t e = experts_.begin; e < experts_.end; ++e) {
      experts_shards_.push_back(std::make_shared<detail::ExpertShard>(*experts, std::to_string(e), o.hidden_size(),
                                                                      o.intermediate_size(), range_, o.quant(),
                                                                      o.expert_bias(), adds_down_bias, t));
    }
    shared_.reset();
    shared_range_ = {};
    if (o.shared_expert_intermediate_size() > 0) {
      shared_range_ = mine.shared_rows;
      shared_ = std::make_shared<detail::ExpertShard>(*this, "shared_expert", o.hidden_size(),
                                                      o.shared_expert_intermediate_size(), shared_range_,
                                                      o.shared_expert_quant(), /*bias=*/false,
                                                      /*adds_down_bias=*/false, t);
      std::vector<Range> shared_ranges;
      for (int64_t r = 0; r < world; ++r) shared_ranges.push_back(moe_placement(o, world, r).shared_rows);
      shared_->make_lora(kLayer, comm, shared_ranges, t);
    }
    shared_expert_gate_weight =
        o.shared_expert_gate() ? register_parameter("shared_expert_gate_weight", at::empty({1, o.hidden_size()}, t))
                               : at::Tensor();
    if (options.init_weights()) reset_parameters();
  });
  auto base = std::make_shared<detail::ExpertLoRABase>();
  base->layer = kLayer;
  base->comm = comm;
  base->ranks_per_group = comm.world_size() / ep_;
  base->hidden = options.hidden_size();
  base->intermediate = options.intermediate_size();
  base->num_experts = options.num_experts();
  base->experts = experts_;
  base->rows = range_;
  base->options = at::TensorOptions(options.dtype()).device(options.device());
  lora_ = register_module("lora", ExpertLoRA(base));  // last: its parameters follow the block's
}

void MoEParallelMLPImpl::reset_parameters() {
  // As torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) (each rank draws its own slices).
  at::NoGradGuard no_grad;
  const double h = 1.0 / std::sqrt(static_cast<double>(options.hidden_size()));
  router_weight.uniform_(-h, h);
  if (router_bias.defined()) router_bias.uniform_(-h, h);
  if (shared_expert_gate_weight.defined()) shared_expert_gate_weight.uniform_(-h, h);
  for (auto& e : experts_shards_) e->reset_parameters();
  if (shared_) shared_->reset_parameters();
}

LoRAImpl& MoEParallelMLPImpl::shared_expert_lora(const std::string& projection) const {
  TORCH_CHECK_VALUE(shared_ != nullptr, kLayer, ": it has no shared expert");
  TORCH_CHECK_VALUE(projection == "gate_up" || projection == "down", kLayer, ": the shared expert's projections are ",
                    "gate_up and down, not '", projection, "'");
  return projection == "gate_up" ? *shared_->gate_up_lora() : *shared_->down_lora();
}

at::Tensor MoEParallelMLPImpl::shared_expert_weight(const std::string& projection) const {
  shared_expert_lora(projection);
  return projection == "gate_up" ? shared_->gate_up_weight() : shared_->down_weight();
}

std::shared_ptr<torch::nn::Module> MoEParallelMLPImpl::clone(const std::optional<at::Device>& device) const {
  // A fresh layer of the same options (collective, as the construction is), then every
  // parameter and buffer copied by name: the experts' tensors live in child modules that
  // the layer's reset() makes, so the default Cloneable copy would leave them fresh.
  for (const auto& p : named_parameters())
    TORCH_CHECK_VALUE(p.key().find("lora.") == std::string::npos, kLayer, ": clone of a block with LoRA adapters (",
                      p.key(), ", ...) is not supported; clone it before adding them");
  at::NoGradGuard no_grad;
  auto copy = std::make_shared<MoEParallelMLPImpl>(options, comm);
  auto params = copy->named_parameters();
  for (const auto& p : named_parameters()) {
    params[p.key()].set_data(device && p.value().device() != *device ? p.value().to(*device) : p.value().clone());
  }
  auto buffers = copy->named_buffers();
  for (const auto& b : named_buffers()) {
    buffers[b.key()].set_data(device && b.value().device() != *device ? b.value().to(*device) : b.value().clone());
  }
  return copy;
}

std::string MoEParallelMLPImpl::quant_name() const {
  return experts_shards_.empty() ? to_string(options.quant()) : experts_shards_.front()->method().name();
}

void MoEParallelMLPImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << "tp::MoEParallelMLP(hidden_size=" << o.hidden_size() << ", intermediate_size=" << o.intermediate_size()
         << ", experts=" << o.num_experts() << ", top_k=" << o.top_k();
  if (o.router().scoring() != MoEScoring::kSoftmax) stream << ", scoring=" << to_string(o.router().scoring());
  stream << ", expert_parallel=" << ep_ << ", local_experts=" << experts_ << ", local_intermediate=" << range_;
  if (shared_) stream << ", shared_expert=" << o.shared_expert_intermediate_size();
  if (o.expert_bias()) stream << ", expert_bias=true";
  if (!o.reduce_output()) stream << ", reduce_output=false";
  if (o.quant().format != QuantFormat::kNone) stream << ", quant=" << quant_name();
  stream << ", rank=" << comm.rank() << "/" << comm.world_size() << ")";
}

std::pair<at::Tensor, at::Tensor> MoEParallelMLPImpl::route(const at::Tensor& x) const {
  const auto& r = options.router();
  at::Tensor logits =
      r.logits_in_float32() ? at::linear(x.to(at::kFloat), router_weight.to(at::kFloat)) : at::linear(x, router_weight);
  if (router_bias.defined()) logits = logits + router_bias.to(logits.scalar_type());
  return moe_route(logits, score_correction_bias, options.top_k(), r, x.scalar_type());
}

at::Tensor MoEParallelMLPImpl::forward(const at::Tensor& x_in) {
  const at::Tensor partial = forward_partial(x_in);
  const auto start = std::chrono::steady_clock::now();
  at::Tensor y = combine_.apply(partial);
  if (record_timings)
    timings.reduce_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return y;
}

at::Tensor MoEParallelMLPImpl::forward_partial(const at::Tensor& x_in) {
  detail::check_input(kLayer, x_in, options.hidden_size(), "hidden_size", options.dtype(), options.device());
  const at::Tensor x = x_in.reshape({-1, options.hidden_size()});
  const int64_t tokens = x.size(0), k = options.top_k();
  const detail::ExpertActivation act{options.activation(), options.swiglu_alpha(), options.swiglu_limit()};
  MoETimings t;
  auto clock = std::chrono::steady_clock::now();
  const auto lap = [&](double& into) {
    if (!record_timings) return;
    const auto now = std::chrono::steady_clock::now();
    into += std::chrono::duration<double>(now - clock).count();
    clock = now;
  };
  auto [weights, experts] = route(x);
  // The weights are mirrored; each rank's partial output depends on them: their gradient
  // is the sum of every rank's part (copy_to_parallel's backward), as the input's is. The
  // sum is taken in the dtype the product is computed in (float32 weights times float64
  // outputs are float64): the cast back to the weights' dtype then rounds once, as one
  // device's gradient does, not once per rank.
  weights = weights.to(at::promote_types(weights.scalar_type(), x.scalar_type()));
  weights = copy_to_parallel(weights, comm);
  const at::Tensor xp = copy_to_parallel(x, comm);
  at::Tensor out = at::zeros_like(x);
  if (!experts_shards_.empty() && tokens > 0) {
    // Grouped: the (token, slot) pairs sorted by expert, one pass per expert this rank
    // holds that has tokens (ascending, as transformers adds them).
    const at::Tensor flat = experts.reshape({-1});
    const at::Tensor order = at::argsort(flat, /*stable=*/true);
    const auto counts = at::bincount(flat, {}, options.num_experts()).cpu();
    const auto* count = counts.data_ptr<int64_t>();
    lap(t.route_s);
    struct Pass {
      const detail::ExpertShard* shard;
      int64_t expert;  // among this rank's
      at::Tensor token, slot;
    };
    std::vector<Pass> passes;
    int64_t begin = 0;
    for (int64_t e = 0; e < options.num_experts(); ++e) {
      const int64_t n = count[e], start = begin;
      begin += n;
      if (n == 0 || e < experts_.begin || e >= experts_.end) continue;  // no token, or another group's expert
      const at::Tensor pairs = order.narrow(0, start, n);
      passes.push_back({experts_shards_[static_cast<size_t>(e - experts_.begin)].get(), e - experts_.begin,
                        at::floor_divide(pairs, k), at::remainder(pairs, k)});
    }
    const detail::ExpertLoRAStep lora = lora_->step(x_in, tokens);
    std::vector<at::Tensor> ys(passes.size());
    const auto run = [&](int64_t i) {
      const Pass& p = passes[static_cast<size_t>(i)];
      ys[static_cast<size_t>(i)] =
          p.shard->forward(xp.index_select(0, p.token), act, lora.empty() ? nullptr : &lora, p.expert, p.token) *
          weights.index({p.token, p.slot}).unsqueeze(-1);
    };
    run_expert_passes(passes.size(), !at::GradMode::is_enabled() && options.quant().format != QuantFormat::kNone, run);
    // The sums in expert order (ascending, as transformers adds them), however they ran.
    for (size_t i = 0; i < passes.size(); ++i) {
      out = out.index_add(0, passes[i].token, ys[i].to(out.scalar_type()));
      if (record_timings) {
        ++t.experts_run;
        t.weight_bytes += passes[i].shard->stored_bytes();
      }
    }
    lap(t.experts_s);
  } else {
    lap(t.route_s);
  }
  if (shared_) {
    // In the input's shape: a per-row adapter selection names its first dimension's rows.
    at::Tensor shared = shared_->forward(xp.reshape(x_in.sizes()), act).reshape({-1, options.hidden_size()});
    if (shared_expert_gate_weight.defined()) {
      // The gate is mirrored; its gradient, like the routing weights', sums every rank's part.
      shared = shared * copy_to_parallel(at::sigmoid(at::linear(x, shared_expert_gate_weight)), comm);
    }
    out = out + shared;
    if (record_timings) t.weight_bytes += shared_->stored_bytes();
    lap(t.shared_s);
  }
  if (record_timings) timings = t;
  return out.reshape(x_in.sizes());
}

void MoEParallelMLPImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix,
                                      const MoECheckpointLayout& layout) {
  const auto& o = options;
  const std::string what = std::string(kLayer) + " '" + prefix + "' (" + to_string(layout.experts()) + " experts)";
  const bool fused = layout.experts() == ExpertLayout::kFused;
  const detail::MoEShape shape{o.hidden_size(), o.intermediate_size(), o.num_experts()};
  run_collectively(comm, std::string(kLayer) + ".load_weights", [&] {
    TORCH_CHECK_VALUE(!fused || splits_by_rows(o.quant()), what, ": experts in ", to_string(o.quant()),
                      " cannot be read from a fused layout (their tensors are not one row per output feature, so "
                      "an expert's gate and up halves cannot be cut from the stacked tensor); the per-expert layout "
                      "takes every format");
    const detail::LayerFacts facts{what, o.expert_bias(), quant_name(), o.quant().format == QuantFormat::kNone};
    detail::load_strictly(checkpoint, {prefix}, facts, [&](const Checkpoint& ckpt) {
      at::NoGradGuard no_grad;
      const std::string router = prefix + "." + layout.router_name();
      router_weight.copy_(checked(ckpt, router + ".weight", {o.num_experts(), o.hidden_size()}).read_all());
      if (router_bias.defined()) router_bias.copy_(checked(ckpt, router + ".bias", {o.num_experts()}).read_all());
      if (score_correction_bias.defined()) {
        score_correction_bias.copy_(checked(ckpt, router + ".e_score_correction_bias", {o.num_experts()}).read_all());
      }
      // This rank's experts, each through its methods (which check the tensors and read
      // only this rank's slices). Another group's experts are that group's to read.
      if (fused && experts_.empty()) leave_to_other_ranks(ckpt, prefix + ".experts.");
      for (int64_t e = 0; e < o.num_experts(); ++e) {
        const bool mine = e >= experts_.begin && e < experts_.end;
        if (!fused && !mine) leave_to_other_ranks(ckpt, detail::expert_name_prefix(prefix, e));
        if (!mine) continue;
        auto& shard = *experts_shards_[static_cast<size_t>(e - experts_.begin)];
        if (fused) {
          const auto view = detail::fused_expert_view(ckpt, prefix, layout, shape, e, what);
          shard.load(view.checkpoint, view.prefixes, what);
        } else {
          shard.load(ckpt, detail::per_expert_prefixes(prefix, layout, e), what);
        }
      }
      if (shared_) {
        const std::string s = prefix + "." + layout.shared_expert_name() + ".";
        shared_->load(ckpt, {s + "gate_proj", s + "up_proj", s + "down_proj"}, what);
      }
      if (shared_expert_gate_weight.defined()) {
        shared_expert_gate_weight.copy_(
            checked(ckpt, prefix + "." + layout.shared_expert_gate_name() + ".weight", {1, o.hidden_size()})
                .read_all());
      }
    });
  });
}

std::map<std::string, at::Tensor> MoEParallelMLPImpl::gather_weights(const std::string& prefix,
                                                                     const MoECheckpointLayout& layout) const {
  const auto& o = options;
  const std::string what = std::string(kLayer) + " '" + prefix + "'";
  at::NoGradGuard no_grad;
  const int64_t world = comm.world_size(), per_group = world / ep_, hidden = o.hidden_size();
  const bool bias = o.expert_bias();
  // Every rank's pieces in one flat buffer (its experts in order; each expert's gate
  // rows, up rows, down columns, biases), one all-gather, then each expert put together
  // from its group's ranks in order.
  const auto piece_numel = [&](int64_t r) { return 2 * r * hidden + hidden * r + (bias ? 2 * r + hidden : 0); };
  std::vector<MoEPlacement> places;
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < world; ++r) {
    places.push_back(moe_placement(o, world, r));
    sizes.push_back(places.back().experts.size() * piece_numel(places.back().rows.size()));
  }
  std::vector<at::Tensor> flat;
  for (const auto& shard : experts_shards_) {
    for (const auto& t : shard->local_pieces(what)) flat.push_back(t.reshape({-1}));
  }
  const auto t = at::TensorOptions(o.dtype()).device(o.device());
  const at::Tensor local = flat.empty() ? at::empty({0}, t) : at::cat(flat);
  const at::Tensor all = world == 1 ? local : comm.all_gather(local, 0, sizes);
  std::vector<detail::ExpertTensors> experts(static_cast<size_t>(o.num_experts()));
  std::vector<std::vector<detail::ExpertTensors>> pieces(static_cast<size_t>(o.num_experts()));
  int64_t offset = 0;
  for (int64_t r = 0; r < world; ++r) {
    const int64_t n = places[r].rows.size();
    for (int64_t e = places[r].experts.begin; e < places[r].experts.end; ++e) {
      const auto take = [&](std::vector<int64_t> shape) {
        int64_t numel = 1;
        for (const auto s : shape) numel *= s;
        at::Tensor piece = all.narrow(0, offset, numel).view(shape);
        offset += numel;
        return piece;
      };
      detail::ExpertTensors p;
      p.gate = take({n, hidden});
      p.up = take({n, hidden});
      p.down = take({hidden, n});
      if (bias) {
        p.gate_bias = take({n});
        p.up_bias = take({n});
        p.down_bias = take({hidden});
      }
      pieces[static_cast<size_t>(e)].push_back(p);
    }
  }
  TORCH_INTERNAL_ASSERT(offset == all.numel(), what, ": gathered ", all.numel(), " elements, used ", offset);
  for (size_t e = 0; e < pieces.size(); ++e) {
    const auto& ps = pieces[e];
    TORCH_INTERNAL_ASSERT(static_cast<int64_t>(ps.size()) == per_group, what, ": expert ", e, " has ", ps.size(),
                          " pieces; expected ", per_group);
    const auto cat = [&](at::Tensor detail::ExpertTensors::*member, int64_t dim) {
      std::vector<at::Tensor> parts;
      for (const auto& p : ps) parts.push_back(p.*member);
      return at::cat(parts, dim).contiguous();
    };
    auto& x = experts[e];
    x.gate = cat(&detail::ExpertTensors::gate, 0);
    x.up = cat(&detail::ExpertTensors::up, 0);
    x.down = cat(&detail::ExpertTensors::down, 1);
    if (bias) {
      x.gate_bias = cat(&detail::ExpertTensors::gate_bias, 0);
      x.up_bias = cat(&detail::ExpertTensors::up_bias, 0);
      x.down_bias = ps.front().down_bias.clone();
    }
  }
  auto out = detail::expert_checkpoint_tensors(prefix, layout, experts);
  const std::string router = prefix + "." + layout.router_name();
  out[router + ".weight"] = router_weight.clone();
  if (router_bias.defined()) out[router + ".bias"] = router_bias.clone();
  if (score_correction_bias.defined()) out[router + ".e_score_correction_bias"] = score_correction_bias.clone();
  if (shared_) {
    // The shared expert's slices over every rank.
    const auto mine = shared_->local_pieces(what);
    std::vector<int64_t> shared_sizes;
    for (int64_t r = 0; r < world; ++r) shared_sizes.push_back(moe_placement(o, world, r).shared_rows.size());
    const auto gather = [&](const at::Tensor& piece, int64_t dim) {
      return world == 1 ? piece.clone() : comm.all_gather(piece.contiguous(), dim, shared_sizes);
    };
    const std::string s = prefix + "." + layout.shared_expert_name() + ".";
    out[s + "gate_proj.weight"] = gather(mine[0], 0);
    out[s + "up_proj.weight"] = gather(mine[1], 0);
    out[s + "down_proj.weight"] = gather(mine[2], 1);
  }
  if (shared_expert_gate_weight.defined())
    out[prefix + "." + layout.shared_expert_gate_name() + ".weight"] = shared_expert_gate_weight.clone();
  return out;
}

}  // namespace tp
