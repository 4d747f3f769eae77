#include "tp/loader/load_shard.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace tp {

namespace {

// The dimension of the stored tensor that `mode` splits, after flip_tp.
int64_t split_dim(ShardMode mode, const LoadOptions& options) {
  const bool column = (mode == ShardMode::kColumn) != options.flip_tp;
  return column ? 0 : 1;
}

// Converts a logical range of the split dimension to stored elements: divides by
// scale_span * elm_packing, refusing boundaries that would cut a block or a packed
// element (that would silently mix two ranks' data).
Range stored_range(const TensorSource& source, int64_t dim, Range range, const LoadOptions& options,
                   const std::string& what) {
  TORCH_CHECK_VALUE(options.scale_span >= 1 && options.elm_packing >= 1, what, ": tensor '", source.name(),
                    "': scale_span (", options.scale_span, ") and elm_packing (", options.elm_packing,
                    ") must be >= 1");
  const int64_t div = options.scale_span * options.elm_packing;
  if (div == 1) return range;
  const char* unit = options.scale_span > 1 ? "scale_span" : "elm_packing";
  const bool begin_ok = range.begin % div == 0;
  // A partial last block is fine when the range ends exactly at the logical end.
  const bool end_at_tail = options.logical_size >= 0 && range.end == options.logical_size;
  const bool end_ok = range.end % div == 0 || end_at_tail;
  TORCH_CHECK_VALUE(begin_ok && end_ok, what, ": tensor '", source.name(), "': shard range ", range, " of dim ", dim,
                    " is not a multiple of ", unit, "=", div, " (one stored element covers ", div,
                    " logical elements); align the shard to multiples of ", div);
  return {range.begin / div, (range.end + div - 1) / div};
}

}  // namespace

at::Tensor load_shard(const TensorSource& source, ShardMode mode, Range range, const LoadOptions& options,
                      const std::string& what) {
  const auto shape = source.shape();
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const int64_t dim = split_dim(mode, options);
  // 0-d scales, and dims of width 1 (per-tensor, or per-channel along the other
  // dim), are the same on every rank.
  if (ndim == 0) return source.read_all();
  if (ndim == 1 && dim == 1) return source.read_all();  // row-parallel bias: replicated
  TORCH_CHECK_VALUE(dim < ndim, what, ": tensor '", source.name(), "' has ", ndim, " dims but ", to_string(mode),
                    " mode", options.flip_tp ? " with flip_tp" : "", " splits dim ", dim);
  if (shape[dim] == 1) return source.read_all();
  const Range stored = stored_range(source, dim, range, options, what);
  TORCH_CHECK_VALUE(stored.end <= shape[dim], what, ": tensor '", source.name(), "': shard range ", range, " (stored ",
                    stored, ") is past the end of dim ", dim, " of size ", shape[dim]);
  return source.read(dim, stored);
}

void load_shard_into(const TensorSource& source, ShardMode mode, Range range, const at::Tensor& dst,
                     const LoadOptions& options, const std::string& what) {
  const auto shape = source.shape();
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const int64_t dim = split_dim(mode, options);
  // A rank that owns none of the split dimension has nothing to write (a width-1 dimension
  // would otherwise come back whole and not fit its empty destination); the tensor's shape
  // is the caller's to check, on every rank.
  if (range.size() == 0 && dst.defined() && dst.numel() == 0) return;
  const bool whole = ndim == 0 || (ndim == 1 && dim == 1) || (dim < ndim && shape[dim] == 1);
  if (whole || dim >= ndim) {
    const at::Tensor shard = load_shard(source, mode, range, options, what);
    TORCH_CHECK_VALUE(dst.defined() && dst.sizes() == shard.sizes(), what, ": tensor '", source.name(),
                      "': its shard is ", shard.sizes(), " but the destination is ",
                      dst.defined() ? dst.sizes() : c10::IntArrayRef{});
    dst.copy_(shard);
    return;
  }
  const Range stored = stored_range(source, dim, range, options, what);
  TORCH_CHECK_VALUE(stored.end <= shape[dim], what, ": tensor '", source.name(), "': shard range ", range, " (stored ",
                    stored, ") is past the end of dim ", dim, " of size ", shape[dim]);
  source.read_into(dim, stored, dst);
}

at::Tensor load_shard(const TensorSource& source, ShardMode mode, const SegmentPlan& plan, const LoadOptions& options,
                      const std::string& what) {
  const auto shape = source.shape();
  const int64_t dim = split_dim(mode, options);
  if (static_cast<int64_t>(shape.size()) > dim && shape[dim] != 1) {
    const int64_t div = options.scale_span * options.elm_packing;
    const int64_t logical = options.logical_size >= 0 ? options.logical_size : shape[dim] * div;
    TORCH_CHECK_VALUE((logical + div - 1) / div == shape[dim] && logical == plan.global_size, what, ": fused tensor '",
                      source.name(), "' has ", shape[dim], " stored elements in dim ", dim,
                      " but the layout's segments add up to ", plan.global_size, " logical elements");
  }
  std::vector<at::Tensor> pieces;
  pieces.reserve(plan.pieces.size());
  for (const auto& piece : plan.pieces) {
    LoadOptions piece_options = options;
    // Only the fused tensor's end is a logical end; a segment boundary inside it is not.
    if (piece.fused_source().end != plan.global_size) piece_options.logical_size = -1;
    pieces.push_back(load_shard(source, mode, piece.fused_source(), piece_options, what));
  }
  // Width-1 and replicated tensors come back whole from each piece: return one.
  if (static_cast<int64_t>(shape.size()) <= dim || shape[dim] == 1)
    return pieces.empty() ? source.read_all() : pieces[0];
  return at::cat(pieces, dim);
}

void check_finite(const at::Tensor& shard, const TensorSource& source, const std::string& what) {
  if (!at::isFloatingType(shard.scalar_type()) || shard.numel() == 0) return;
  const at::Tensor bad = at::logical_not(at::isfinite(shard));
  if (!bad.any().item<bool>()) return;
  // The first non-finite value, by its index in the slice.
  int64_t flat = bad.reshape({-1}).nonzero().view({-1})[0].item<int64_t>();
  std::vector<int64_t> index(static_cast<size_t>(shard.dim()));
  for (int64_t d = shard.dim() - 1; d >= 0; --d) {
    index[d] = flat % shard.size(d);
    flat /= shard.size(d);
  }
  const double value = shard.reshape({-1})[bad.reshape({-1}).nonzero().view({-1})[0]].item<double>();
  TORCH_CHECK_VALUE(false, what, ": tensor '", source.name(), "' holds a non-finite value (", value, ") at index ",
                    c10::IntArrayRef(index), " of the slice this rank read (shape ", shard.sizes(), ", of ",
                    c10::IntArrayRef(source.shape()),
                    " in the checkpoint); a scale must be finite, or every output it scales is NaN or infinite. "
                    "The checkpoint is corrupt");
}

}  // namespace tp
