#include "tp/layers/vocab/vocab_parallel_embedding.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "layers/layer_common.h"
#include "layers/lora/lora_base.h"
#include "layers/vocab/common.h"
#include "tp/comm/differentiable.h"
#include "tp/layers/sequence_parallel.h"

namespace tp {

namespace {
constexpr const char* kLayer = "VocabParallelEmbedding";
}

VocabParallelEmbeddingOptions::VocabParallelEmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
    : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options_, Communicator comm_)
    : options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void VocabParallelEmbeddingImpl::reset() {
  detail::check_options(kLayer,
                        {{"num_embeddings", options.num_embeddings()},
                         {"embedding_dim", options.embedding_dim()},
                         {"pad_to_multiple_of", options.pad_to_multiple_of()}},
                        options.dtype());
  partition_ = detail::with_layer_context(kLayer, [&] {
    return partition_vocab(options.num_embeddings(), comm.world_size(), options.pad_to_multiple_of(),
                           options.split_weights());
  });
  const auto tensor_options = at::TensorOptions().dtype(options.dtype()).device(options.device());
  weight = register_parameter("weight", at::empty({local_range().size(), options.embedding_dim()}, tensor_options));
  auto base = std::make_shared<detail::LoRABase>();
  base->layer = kLayer;
  base->comm = comm;
  base->row = true;
  base->embedding = true;
  base->in_features = options.num_embeddings();
  for (int64_t r = 0; r < comm.world_size(); ++r) {
    base->in_ranges.push_back(partition_.range(r));
    base->in_real.push_back(partition_.real(r));
  }
  base->plans = {plan_single("embedding", options.embedding_dim(), 1, 0)};
  base->a_suffix = ".lora_embedding_A";
  base->b_suffix = ".lora_embedding_B";
  base->options = tensor_options;
  lora_ = std::make_shared<LoRAImpl>(std::move(base));
  if (options.init_weights()) reset_parameters();
}

LoRAImpl& VocabParallelEmbeddingImpl::lora() {
  if (!named_children().contains("lora")) register_module("lora", lora_);
  return *lora_;
}

void VocabParallelEmbeddingImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  weight.normal_(0.0, 1.0);
  detail::zero_padding_rows(weight, local_range(), vocab_range());
}

void VocabParallelEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::VocabParallelEmbedding(num_embeddings=" << options.num_embeddings()
         << ", embedding_dim=" << options.embedding_dim() << ", local_vocab=" << vocab_range();
  if (partition_.padded_size != partition_.vocab_size)
    stream << ", padded=" << partition_.padded_size << ", local_rows=" << local_range();
  if (options.sequence_parallel()) stream << ", sequence_parallel=true";
  stream << ", rank=" << comm.rank() << "/" << comm.world_size() << ")";
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  detail::check_token_ids(kLayer, ids, options.num_embeddings(), weight.device());
  TORCH_CHECK_VALUE(!options.sequence_parallel() || ids.dim() >= 1, kLayer,
                    ": sequence_parallel splits dim 0 of the ids, but they are a 0-d tensor");
  const Range rows = local_range(), real = vocab_range();
  // The ids this rank owns, as local rows; the others look up row 0 and are zeroed
  // after, so no gradient reaches a row through a token another rank owns. A rank with
  // no rows looks up a zero row appended to its (empty) table, which keeps its output
  // in the graph: every rank takes part in the backward collectives.
  const at::Tensor mine = ids.ge(real.begin).logical_and(ids.lt(real.end));
  const at::Tensor local = (ids - rows.begin).masked_fill(mine.logical_not(), 0);
  const at::Tensor table = rows.size() == 0 ? at::constant_pad_nd(weight, {0, 0, 0, 1}) : weight;
  at::Tensor partial = at::embedding(table, local).masked_fill(mine.logical_not().unsqueeze(-1), 0);
  if (lora_->active()) partial = lora_->add_to(ids, std::move(partial));  // before the one reduction
  if (options.sequence_parallel())
    return reduce_scatter_to_sequence_parallel(partial, comm, 0, sequence_sizes(ids.size(0), comm.world_size()));
  // Exact sums: the partial embeddings are zeros but for one rank's row.
  return reduce_from_parallel(partial, comm, AllReduceStrategy::kAuto, WirePrecision::kNative);
}

void VocabParallelEmbeddingImpl::load_weights(const Checkpoint& checkpoint, const std::string& prefix) {
  detail::load_vocab_rows(kLayer, checkpoint, prefix + ".weight", options.num_embeddings(), options.embedding_dim(),
                          local_range(), vocab_range(), weight);
}

std::map<std::string, at::Tensor> VocabParallelEmbeddingImpl::gather_weights(const std::string& prefix) const {
  return {{detail::join_name(prefix, "weight"), detail::gather_vocab_rows(weight, partition_, comm)}};
}

}  // namespace tp
