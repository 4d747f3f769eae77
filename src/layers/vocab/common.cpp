#include "layers/vocab/common.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <sstream>
#include <vector>

#include "tp/loader/load_shard.h"
#include "tp/shard/shard_mode.h"

namespace tp::detail {

void check_token_ids(const char* layer, const at::Tensor& ids, int64_t vocab_size, const at::Device& device) {
  TORCH_CHECK_VALUE(ids.defined(), layer, ": the token ids are an undefined tensor");
  TORCH_CHECK_TYPE(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt, layer,
                   ": token ids must be int64 or int32; got ", ids.scalar_type());
  TORCH_CHECK_VALUE(ids.device() == device, layer, ": the token ids are on ", ids.device(), " but the weights are on ",
                    device);
  if (ids.numel() == 0) return;
  const at::Tensor bad = ids.lt(0).logical_or(ids.ge(vocab_size));
  if (!bad.any().item<bool>()) return;
  const at::Tensor flat = bad.reshape(-1).nonzero().select(1, 0);
  const int64_t first = flat[0].item<int64_t>();
  const int64_t id = ids.reshape(-1)[first].item<int64_t>();
  std::ostringstream where;
  int64_t rest = first;
  std::vector<int64_t> index(ids.dim());
  for (int64_t d = ids.dim() - 1; d >= 0; --d) {
    index[d] = rest % ids.size(d);
    rest /= ids.size(d);
  }
  TORCH_CHECK_VALUE(false, layer, ": token id ", id, " at index ", c10::IntArrayRef(index), " of the ids ", ids.sizes(),
                    " is outside the vocabulary [0, ", vocab_size, ")", flat.numel() > 1 ? " (and " : "",
                    flat.numel() > 1 ? std::to_string(flat.numel() - 1) + " more)" : std::string());
}

void zero_padding_rows(at::Tensor& weight, Range rows, Range real) {
  at::NoGradGuard no_grad;
  const int64_t real_rows = real.size();
  if (real_rows < rows.size()) weight.narrow(0, real_rows, rows.size() - real_rows).zero_();
}

void load_vocab_rows(const char* layer, const Checkpoint& checkpoint, const std::string& name, int64_t vocab_size,
                     int64_t hidden, Range rows, Range real, at::Tensor& weight) {
  const auto& source = checkpoint.get(name, layer);
  const std::vector<int64_t> want{vocab_size, hidden};
  TORCH_CHECK_VALUE(source.shape() == want, layer, ": tensor '", source.name(), "' has shape ",
                    c10::IntArrayRef(source.shape()), "; expected [", vocab_size, ", ", hidden,
                    "] (num_embeddings, embedding_dim: the vocabulary without padding)");
  const auto dtype = source.dtype();
  TORCH_CHECK_TYPE(at::isFloatingType(dtype) && !at::isFloat8Type(dtype), layer, ": tensor '", source.name(),
                   "' has dtype ", dtype, "; an embedding table is stored in a floating dtype (float32, bfloat16, ",
                   "float16, float64), never quantized");
  at::NoGradGuard no_grad;
  if (real.size() > 0) load_shard_into(source, ShardMode::kColumn, real, weight.narrow(0, 0, real.size()), {}, layer);
  zero_padding_rows(weight, rows, real);
}

at::Tensor gather_vocab_rows(const at::Tensor& weight, const VocabPartition& partition, const Communicator& comm) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> sizes;
  for (const auto& r : partition.ranges) sizes.push_back(r.size());
  const at::Tensor all = comm.world_size() == 1 ? weight.clone() : comm.all_gather(weight.contiguous(), 0, sizes);
  return all.narrow(0, 0, partition.vocab_size).contiguous();
}

void check_local_logits(const char* op, const at::Tensor& logits, const VocabPartition& partition,
                        const Communicator& comm) {
  TORCH_CHECK_VALUE(partition.world_size() == comm.world_size(), op, ": the partition is for ", partition.world_size(),
                    " ranks but the communicator has ", comm.world_size());
  const int64_t width = partition.range(comm.rank()).size();
  TORCH_CHECK_VALUE(logits.defined() && logits.dim() >= 1 && logits.size(-1) == width, op, ": local logits of shape ",
                    logits.defined() ? logits.sizes() : c10::IntArrayRef{}, " on rank ", comm.rank(),
                    "; expected [..., ", width, "] (this rank's rows ", partition.range(comm.rank()),
                    " of the padded vocabulary)");
  TORCH_CHECK_TYPE(at::isFloatingType(logits.scalar_type()), op, ": logits must be floating point; got ",
                   logits.scalar_type());
}

at::Tensor gather_stacked(const at::Tensor& t, const Communicator& comm) {
  if (comm.world_size() == 1) return t.unsqueeze(0);
  return comm.all_gather(t.unsqueeze(0).contiguous(), 0, std::vector<int64_t>(comm.world_size(), 1));
}

}  // namespace tp::detail
