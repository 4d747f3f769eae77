#include "tp/layers/vocab/parallel_lm_head.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <limits>

#include "layers/layer_common.h"
#include "layers/lora/lora_base.h"
#include "layers/numerics/invariant_linear.h"
#include "layers/step.h"
#include "layers/vocab/common.h"
#include "tp/comm/differentiable.h"
#include "tp/layers/vocab/loss.h"

namespace tp {

namespace {
constexpr const char* kLayer = "ParallelLMHead";
}

ParallelLMHeadOptions::ParallelLMHeadOptions(int64_t hidden_size, int64_t vocab_size)
    : hidden_size_(hidden_size), vocab_size_(vocab_size) {}

ParallelLMHeadImpl::ParallelLMHeadImpl(ParallelLMHeadOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

ParallelLMHeadImpl::ParallelLMHeadImpl(const VocabParallelEmbedding& embedding, bool gather_output, Numerics numerics)
    : options(ParallelLMHeadOptions(embedding->options.embedding_dim(), embedding->options.num_embeddings())
                  .pad_to_multiple_of(embedding->options.pad_to_multiple_of())
                  .split_weights(embedding->options.split_weights())
                  .gather_output(gather_output)
                  .dtype(embedding->options.dtype())
                  .device(embedding->options.device())
                  .numerics(numerics)),
      comm(embedding->comm),
      tied_(true) {
  weight = embedding->weight;  // the same tensor: one parameter, two uses
  reset();
}

void ParallelLMHeadImpl::reset() {
  detail::check_options(kLayer,
                        {{"hidden_size", options.hidden_size()},
                         {"vocab_size", options.vocab_size()},
                         {"pad_to_multiple_of", options.pad_to_multiple_of()}},
                        options.dtype());
  partition_ = detail::with_layer_context(kLayer, [&] {
    return partition_vocab(options.vocab_size(), comm.world_size(), options.pad_to_multiple_of(),
                           options.split_weights());
  });
  const Range rows = local_range(), real = vocab_range();
  const auto tensor_options = at::TensorOptions().dtype(options.dtype()).device(options.device());
  if (tied_) {
    TORCH_INTERNAL_ASSERT(weight.defined() && weight.size(0) == rows.size() && weight.size(1) == options.hidden_size(),
                          kLayer, ": the tied embedding's weight ", weight.sizes(), " does not match the partition");
  } else {
    weight = register_parameter("weight", at::empty({rows.size(), options.hidden_size()}, tensor_options));
  }
  numerics_ = resolve_numerics(options.numerics());
  std::shared_ptr<const detail::InvariantPlan> plan;
  if (numerics_ == Numerics::kInvariant) {
    // The vocabulary is one output segment, split at multiples of pad_to_multiple_of.
    std::vector<SegmentPlan> plans;
    for (int64_t r = 0; r < comm.world_size(); ++r)
      plans.push_back(make_segment_plan({Segment{"vocab", partition_.padded_size}}, {partition_.range(r)}));
    plan = detail::with_layer_context(kLayer, [&] {
      detail::check_invariant_supported(kLayer, *make_quant_method({}), options.device());
      return detail::column_invariant_plan(kLayer, comm, plans, options.hidden_size(), partition_.pad_to_multiple_of);
    });
  }
  // Every rank's logits depend on all of x: its gradient is the sum of the ranks' parts
  // (the default step's copy_to_parallel; the invariant step's canonical sums). No
  // QuantMethod: the head's weight may be the embedding's own (tied).
  step_ = detail::make_column_step(
      {kLayer, nullptr, Reduction::none(comm), rows.size(), options.hidden_size(), nullptr, std::move(plan)});
  auto base = std::make_shared<detail::LoRABase>();
  base->layer = kLayer;
  base->comm = comm;
  base->in_features = options.hidden_size();
  for (int64_t r = 0; r < comm.world_size(); ++r)  // B: the real rows; the padding's columns get nothing
    base->plans.push_back(make_segment_plan({Segment{"linear", options.vocab_size()}}, {partition_.real(r)}));
  base->pad_rows = rows.size() - real.size();
  base->invariant = numerics_ == Numerics::kInvariant;
  base->options = tensor_options;
  lora_ = std::make_shared<LoRAImpl>(std::move(base));
  padding_mask_ = at::Tensor();
  if (real.size() < rows.size())
    padding_mask_ =
        at::arange(rows.size(), at::TensorOptions().dtype(at::kLong).device(options.device())).ge(real.size());
  if (options.init_weights()) reset_parameters();
}

void ParallelLMHeadImpl::reset_parameters() {
  if (tied_) return;
  at::NoGradGuard no_grad;
  weight.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(options.hidden_size())));
  detail::zero_padding_rows(weight, local_range(), vocab_range());
}

void ParallelLMHeadImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::ParallelLMHead(hidden_size=" << options.hidden_size() << ", vocab_size=" << options.vocab_size()
         << ", local_vocab=" << vocab_range();
  if (partition_.padded_size != partition_.vocab_size)
    stream << ", padded=" << partition_.padded_size << ", local_rows=" << local_range();
  if (tied_) stream << ", tied=true";
  if (options.gather_output()) stream << ", gather_output=true";
  stream << ", rank=" << comm.rank() << "/" << comm.world_size() << ")";
}

at::Tensor ParallelLMHeadImpl::forward(const at::Tensor& x) {
  detail::check_input(kLayer, x, options.hidden_size(), "hidden_size", weight.scalar_type(), weight.device());
  at::Tensor logits = step_->forward(x, weight, /*bias=*/{});  // [..., local rows]
  if (lora_->active()) logits = lora_->add_to(x, std::move(logits));
  if (options.gather_output()) {
    std::vector<int64_t> sizes;
    for (int64_t r = 0; r < comm.world_size(); ++r) sizes.push_back(partition_.real(r).size());
    return gather_from_parallel(logits.narrow(-1, 0, vocab_range().size()), comm, -1, sizes);
  }
  if (padding_mask_.defined()) logits = logits.masked_fill(padding_mask_, -std::numeric_limits<double>::infinity());
  return logits;
}

LoRAImpl& ParallelLMHeadImpl::lora() {
  if (!named_children().contains("lora")) register_module("lora", lora_);
  return *lora_;
}

at::Tensor ParallelLMHeadImpl::cross_entropy(const at::Tensor& local_logits, const at::Tensor& target,
                                             int64_t ignore_index) const {
  TORCH_CHECK_VALUE(!options.gather_output(), kLayer,
                    ": cross_entropy takes the local logits; this head gathers them (gather_output=true): use "
                    "at::cross_entropy on the gathered logits, or a head without gather_output");
  return vocab_parallel_cross_entropy(local_logits, target, partition_, comm, ignore_index, numerics_);
}

at::Tensor ParallelLMHeadImpl::argmax(const at::Tensor& local_logits) const {
  if (options.gather_output()) return local_logits.argmax(-1);  // already the whole vocabulary
  return vocab_parallel_argmax(local_logits, partition_, comm);
}

at::Tensor ParallelLMHeadImpl::sample(const at::Tensor& local_logits, const SamplingParams& params, int64_t step,
                                      const at::Tensor& previous, int64_t first_row) const {
  if (options.gather_output())  // the whole vocabulary on every rank: each draws alone, the same draws
    return vocab_parallel_sample(local_logits, partition_vocab(partition_.vocab_size, 1), Communicator(), params, step,
                                 previous, first_row);
  return vocab_parallel_sample(local_logits, partition_, comm, params, step, previous, first_row);
}

void ParallelLMHeadImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  TORCH_CHECK_VALUE(!tied_, kLayer, ": this head is tied to an embedding and has no weight of its own to load from '",
                    prefix, ".weight'; load the embedding (its load_weights fills both)");
  detail::load_vocab_rows(kLayer, checkpoint, prefix + ".weight", options.vocab_size(), options.hidden_size(),
                          local_range(), vocab_range(), weight);
}

std::map<std::string, at::Tensor> ParallelLMHeadImpl::gather_weights(const std::string& prefix) const {
  if (tied_) return {};
  return {{detail::join_name(prefix, "weight"), detail::gather_vocab_rows(weight, partition_, comm)}};
}

}  // namespace tp
