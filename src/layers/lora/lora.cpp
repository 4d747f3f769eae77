#include "tp/layers/lora/lora.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <ostream>
#include <set>

#include "layers/lora/lora_base.h"
#include "tp/comm/collective_status.h"
#include "tp/comm/differentiable.h"
#include "tp/loader/load_shard.h"

namespace tp {

double LoRAConfig::scaling() const {
  return use_rslora_ ? alpha_ / std::sqrt(static_cast<double>(rank_)) : alpha_ / static_cast<double>(rank_);
}

void LoRASelection::select(const std::string& name) {
  whole_ = name;
  per_row_.clear();
}

void LoRASelection::select_rows(std::vector<std::string> per_row) {
  const bool same = !per_row.empty() && std::all_of(per_row.begin(), per_row.end(),
                                                    [&](const std::string& n) { return n == per_row.front(); });
  if (same) return select(per_row.front());
  whole_.clear();
  per_row_ = std::move(per_row);
}

std::vector<std::string> LoRASelection::names() const {
  std::set<std::string> names(per_row_.begin(), per_row_.end());
  if (!whole_.empty()) names.insert(whole_);
  names.erase("");
  return {names.begin(), names.end()};
}

namespace {

// The rows of B that are replicas of rows other ranks hold (a replicated KV head): forward
// the identity, backward their gradients summed over the holders, so the copies stay equal
// under an optimizer. Every rank calls it for the same segments (the replicas are global).
struct SumReplicaGrads : torch::autograd::Function<SumReplicaGrads> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& b, const detail::LoRABase* base,
                            int64_t local_offset) {
    ctx->saved_data["offset"] = local_offset;
    ctx->saved_data["base"] = reinterpret_cast<int64_t>(base);
    return b.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* base = reinterpret_cast<const detail::LoRABase*>(ctx->saved_data["base"].toInt());
    const int64_t offset = ctx->saved_data["offset"].toInt();
    at::Tensor g = grads[0].contiguous();
    at::Tensor buffer = at::zeros({base->replica_rows, g.size(1)}, g.options());
    const int64_t rows = g.size(0);
    for (const auto& p : base->replicas) {
      const int64_t begin = std::max(p.local_offset, offset), end = std::min(p.local_offset + p.rows, offset + rows);
      if (begin < end)
        buffer.narrow(0, p.slot_offset + begin - p.local_offset, end - begin)
            .copy_(g.narrow(0, begin - offset, end - begin));
    }
    base->comm.all_reduce(buffer);
    g = g.clone();
    for (const auto& p : base->replicas) {
      const int64_t begin = std::max(p.local_offset, offset), end = std::min(p.local_offset + p.rows, offset + rows);
      if (begin < end)
        g.narrow(0, begin - offset, end - begin)
            .copy_(buffer.narrow(0, p.slot_offset + begin - p.local_offset, end - begin));
    }
    return {g, at::Tensor(), at::Tensor()};
  }
};

bool recording(const at::Tensor& x, const at::Tensor& y) {
  return at::GradMode::is_enabled() && (x.requires_grad() || y.requires_grad());
}

void check_name(const std::string& layer, const std::string& name) {
  TORCH_CHECK_VALUE(!name.empty() && name.find('.') == std::string::npos, layer,
                    ": an adapter's name must be non-empty and hold no '.'; got '", name, "'");
}

}  // namespace

LoRAImpl::LoRAImpl(std::shared_ptr<const detail::LoRABase> base)
    : base_(std::move(base)), selection_(std::make_shared<LoRASelection>()) {}

std::vector<std::string> LoRAImpl::segment_names() const {
  std::vector<std::string> out;
  for (const auto& piece : base_->plan().pieces) out.push_back(piece.name);
  return out;
}

size_t LoRAImpl::segment_index(const std::string& segment) const {
  const auto names = segment_names();
  const auto it = std::find(names.begin(), names.end(), segment);
  TORCH_CHECK_VALUE(it != names.end(), base_->layer, ": no segment '", segment, "'; it has ", c10::Join(", ", names));
  return static_cast<size_t>(it - names.begin());
}

LoRAImpl::Adapter& LoRAImpl::make(const std::string& name, const LoRAConfig& config, const std::vector<bool>& on) {
  const auto& b = *base_;
  check_name(b.layer, name);
  TORCH_CHECK_VALUE(!b.invariant, b.layer,
                    ": LoRA adapters are not covered by invariant numerics (use numerics=default)");
  TORCH_CHECK_VALUE(!has(name), b.layer, ": it has an adapter '", name, "' already");
  TORCH_CHECK_VALUE(config.rank() > 0 && std::isfinite(config.alpha()), b.layer, ": adapter '", name,
                    "' needs rank > 0 and a finite alpha; got rank ", config.rank(), ", alpha ", config.alpha());
  Adapter adapter;
  adapter.config = config;
  adapter.module = std::make_shared<torch::nn::Module>("tp::LoRAAdapter");
  adapter.prepared = std::make_shared<Adapter::Prepared>();
  const auto& plan = b.plan();
  const int64_t r = config.rank();
  for (size_t s = 0; s < plan.pieces.size(); ++s) {
    if (!on[s]) {
      adapter.A.emplace_back();
      adapter.B.emplace_back();
      continue;
    }
    auto segment = std::make_shared<torch::nn::Module>("tp::LoRASegment");
    const int64_t b_rows = plan.pieces[s].size();
    adapter.A.push_back(segment->register_parameter("lora_A", at::zeros({r, b.a_columns()}, b.options)));
    adapter.B.push_back(segment->register_parameter("lora_B", at::zeros({b_rows, r}, b.options)));
    adapter.module->register_module(plan.pieces[s].name, segment);
  }
  register_module(name, adapter.module);
  return adapters_.emplace(name, std::move(adapter)).first->second;
}

void LoRAImpl::add(const std::string& name, const LoRAConfig& config, const std::vector<std::string>& segments) {
  const auto names = segment_names();
  std::vector<bool> on(names.size(), segments.empty());
  for (const auto& s : segments) on[segment_index(s)] = true;
  // Checked and allocated collectively (a refusal reaches every rank); then the random
  // factor is rank 0's draw on every rank (the broadcast outside run_collectively, whose
  // rank-local part holds no collective). PEFT's defaults: a linear layer's A ~
  // kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)) over the whole [r, in], B
  // zeros; an embedding's A zeros, B ~ N(0, 1).
  Adapter* adapter = nullptr;
  const auto& b = *base_;
  run_collectively(b.comm, b.layer + ".lora.add", [&] { adapter = &make(name, config, on); });
  at::NoGradGuard no_grad;
  const double bound = 1.0 / std::sqrt(static_cast<double>(b.in_features));
  for (size_t s = 0; s < adapter->A.size(); ++s) {
    if (!adapter->A[s].defined()) continue;
    at::Tensor& random = b.embedding ? adapter->B[s] : adapter->A[s];
    at::Tensor whole = b.embedding ? at::empty(random.sizes(), b.options).normal_()
                                   : at::empty({config.rank(), b.in_features}, b.options).uniform_(-bound, bound);
    if (b.comm.world_size() > 1) b.comm.broadcast(whole, 0);
    const Range cols = b.a_source(b.comm.rank());
    random.copy_(b.embedding ? whole : whole.narrow(1, cols.begin, cols.size()));
  }
}

void LoRAImpl::load(const Checkpoint& checkpoint, const std::string& name, const LoRAConfig& config,
                    const std::vector<std::string>& prefixes) {
  const auto& b = *base_;
  const auto& plan = b.plan();
  TORCH_CHECK_VALUE(prefixes.size() == plan.pieces.size(), b.layer, ": load of adapter '", name, "' needs ",
                    plan.pieces.size(), " prefixes (", c10::Join(", ", segment_names()), "); got ", prefixes.size());
  std::vector<bool> on;
  for (const auto& p : prefixes) on.push_back(!p.empty());
  run_collectively(b.comm, b.layer + ".lora.load", [&] {
    auto& adapter = make(name, config, on);
    at::NoGradGuard no_grad;
    const int64_t r = config.rank();
    for (size_t s = 0; s < prefixes.size(); ++s) {
      if (!on[s]) continue;
      const auto& piece = plan.pieces[s];
      const auto read = [&](const std::string& suffix, std::vector<int64_t> shape, ShardMode mode, Range range) {
        const std::string tensor = prefixes[s] + suffix;
        const auto& source = checkpoint.get(tensor, b.layer);
        TORCH_CHECK_VALUE(source.shape() == shape, b.layer, ": adapter '", name, "' tensor ", tensor, " has shape ",
                          c10::IntArrayRef(source.shape()), "; expected ", c10::IntArrayRef(shape), " (rank ", r,
                          ", the base's ", b.in_features, " inputs and segment '", piece.name, "' of ",
                          piece.segment_size, " outputs)");
        const auto dtype = source.dtype();
        TORCH_CHECK_VALUE(dtype == at::kDouble || dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
                          b.layer, ": adapter tensor ", tensor, " is ", dtype,
                          "; LoRA factors are float64, float32, "
                          "float16 or bfloat16");
        at::Tensor t = load_shard(source, mode, range, {}, b.layer);
        TORCH_CHECK_VALUE(t.numel() == 0 || at::isfinite(t).all().item<bool>(), b.layer, ": adapter tensor ", tensor,
                          " holds a non-finite value");
        return t;
      };
      const Range in_cols = b.a_source(b.comm.rank());
      adapter.A[s]
          .narrow(1, b.a_offset(b.comm.rank()), in_cols.size())
          .copy_(read(b.a_suffix, {r, b.in_features}, ShardMode::kRow, in_cols));
      adapter.B[s].copy_(read(b.b_suffix, {piece.segment_size, r}, ShardMode::kColumn, piece.source));
    }
  });
}

std::map<std::string, at::Tensor> LoRAImpl::gather(const std::string& name,
                                                   const std::vector<std::string>& prefixes) const {
  const auto& adapter = adapters_.at(name);
  const auto& b = *base_;
  TORCH_CHECK_VALUE(prefixes.size() == adapter.A.size(), b.layer, ": gather of adapter '", name, "' needs ",
                    adapter.A.size(), " prefixes");
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> out;
  for (size_t s = 0; s < adapter.A.size(); ++s) {
    if (!adapter.A[s].defined()) continue;
    at::Tensor a = adapter.A[s], bm = adapter.B[s];
    if (b.row) {
      std::vector<int64_t> sizes;
      for (int64_t r = 0; r < b.comm.world_size(); ++r) sizes.push_back(b.a_source(r).size());
      a = gather_from_parallel(a.narrow(1, b.a_offset(b.comm.rank()), sizes[b.comm.rank()]), b.comm, 1, sizes);
    } else {
      // Each distinct piece of the segment once (replicas from their first holder), in order.
      std::vector<int64_t> sizes;
      for (const auto& p : b.plans) sizes.push_back(p.pieces[s].size());
      const at::Tensor all = gather_from_parallel(bm, b.comm, 0, sizes);
      std::vector<std::pair<int64_t, at::Tensor>> blocks;
      int64_t offset = 0;
      for (const auto& p : b.plans) {
        const Range src = p.pieces[s].source;
        const bool seen =
            std::any_of(blocks.begin(), blocks.end(), [&](const auto& x) { return x.first == src.begin; });
        if (!seen && src.size() > 0) blocks.emplace_back(src.begin, all.narrow(0, offset, src.size()));
        offset += src.size();
      }
      std::sort(blocks.begin(), blocks.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      std::vector<at::Tensor> parts;
      for (auto& blk : blocks) parts.push_back(blk.second);
      bm = at::cat(parts, 0);
    }
    out[prefixes[s] + b.a_suffix] = a.is_same(adapter.A[s]) ? a.clone() : a.contiguous();
    out[prefixes[s] + b.b_suffix] = bm.is_same(adapter.B[s]) ? bm.clone() : bm.contiguous();
  }
  return out;
}

void LoRAImpl::remove(const std::string& name) {
  TORCH_CHECK_VALUE(has(name), base_->layer, ": no adapter '", name, "'");
  adapters_.erase(name);
  unregister_module(name);
}

void LoRAImpl::merge_into(const std::string& name, at::Tensor weight, bool unmerge) {
  config(name);
  auto& adapter = adapters_.at(name);
  const auto& b = *base_;
  TORCH_CHECK_VALUE(adapter.merged == unmerge, b.layer, ": adapter '", name, "' is ",
                    adapter.merged ? "merged already" : "not merged");
  const at::Tensor a0 = [&] {
    for (const auto& a : adapter.A)
      if (a.defined()) return a;
    return at::Tensor();
  }();
  TORCH_CHECK_VALUE(weight.scalar_type() == a0.scalar_type() && weight.dim() == 2, b.layer, ": merging adapter '", name,
                    "' needs an unquantized base weight of the adapter's dtype (", a0.scalar_type(), "); it is ",
                    weight.scalar_type(), " ", weight.sizes(), " (a quantized base keeps its adapter separate)");
  at::NoGradGuard no_grad;
  const double scaling = (unmerge ? -1.0 : 1.0) * adapter.config.scaling();
  const auto& plan = b.plan();
  for (size_t s = 0; s < adapter.A.size(); ++s) {
    if (!adapter.A[s].defined()) continue;
    const at::Tensor delta = at::matmul(adapter.B[s], adapter.A[s]).mul_(scaling);
    if (b.embedding)
      weight.add_(delta.t());  // the table is [rows, dim]: (B A)^T, zero on its padding rows
    else
      (b.row ? weight : weight.narrow(0, plan.pieces[s].local_offset, plan.pieces[s].size())).add_(delta);
  }
  adapter.merged = !unmerge;
}

bool LoRAImpl::merged(const std::string& name) const {
  config(name);
  return adapters_.at(name).merged;
}

std::vector<std::string> LoRAImpl::names() const {
  std::vector<std::string> out;  // in registration order: the order parameters() lists them
  for (const auto& item : named_children()) out.push_back(item.key());
  return out;
}

const LoRAConfig& LoRAImpl::config(const std::string& name) const {
  const auto it = adapters_.find(name);
  TORCH_CHECK_VALUE(it != adapters_.end(), base_->layer, ": no adapter '", name, "'; it has ",
                    c10::Join(", ", names()));
  return it->second.config;
}

at::Tensor LoRAImpl::lora_A(const std::string& name, const std::string& segment) const {
  config(name);
  return adapters_.at(name).A.at(segment_index(segment));
}

at::Tensor LoRAImpl::lora_B(const std::string& name, const std::string& segment) const {
  config(name);
  return adapters_.at(name).B.at(segment_index(segment));
}

void LoRAImpl::share_selection(std::shared_ptr<LoRASelection> selection) {
  TORCH_CHECK_VALUE(selection != nullptr, base_->layer, ": share_selection needs a selection");
  selection_ = std::move(selection);
}

bool LoRAImpl::active() const {
  if (adapters_.empty()) return false;
  const auto live = [&](const std::string& n) { return has(n) && !adapters_.at(n).merged; };
  const bool any_merged =
      std::any_of(adapters_.begin(), adapters_.end(), [](const auto& item) { return item.second.merged; });
  if (any_merged) {
    // The base computes the merged adapter for every row: no row may ask for another, or for none.
    const std::string& whole = selection_->whole();
    TORCH_CHECK_VALUE(!whole.empty() && has(whole) && adapters_.at(whole).merged, base_->layer,
                      ": an adapter is merged into the base, so every row takes it; select it for the whole batch, "
                      "or unmerge it before selecting ",
                      whole.empty() ? std::string("rows or none") : "'" + whole + "'");
    return false;
  }
  if (!selection_->whole().empty()) return live(selection_->whole());
  for (const auto& n : selection_->per_row())
    if (!n.empty() && live(n)) return true;
  return false;
}

at::Tensor LoRAImpl::delta(const Adapter& adapter, const at::Tensor& x) const {
  const auto& b = *base_;
  const double scaling = adapter.config.scaling();
  if (b.embedding) {
    // The ids this rank holds looked up in its rows of A^T (zeros for the others, as the
    // base's table does), then through B like a row layer's partial h.
    const Range rows = b.in_ranges.at(b.comm.rank()), real = b.in_real.at(b.comm.rank());
    const at::Tensor mine = x.ge(real.begin).logical_and(x.lt(real.end));
    const at::Tensor local = (x - rows.begin).masked_fill(mine.logical_not(), 0);
    const at::Tensor a_t = adapter.A[0].t();
    const at::Tensor table = rows.size() == 0 ? at::constant_pad_nd(a_t, {0, 0, 0, 1}) : a_t;
    const at::Tensor h = at::embedding(table, local).masked_fill(mine.logical_not().unsqueeze(-1), 0);
    return at::matmul(h, copy_to_parallel(adapter.B[0], b.comm).t()).mul_(scaling);
  }
  if (b.row) {
    // This rank's columns of A give a partial h; B is mirrored, its gradient the sum of the
    // ranks' parts (copy_to_parallel's backward). The result joins the base's partial sum.
    const at::Tensor h = at::matmul(x, adapter.A[0].t());
    return at::matmul(h, copy_to_parallel(adapter.B[0], b.comm).t()).mul_(scaling);
  }
  std::vector<at::Tensor> a;
  for (const auto& t : adapter.A)
    if (t.defined()) a.push_back(t);
  const at::Tensor a_cat = a.size() == 1 ? a[0] : at::cat(a, 0);
  at::Tensor h;
  if (b.entry.op == ReduceOp::kAllGather || b.input_parallel) {
    // Sequence parallelism: this rank's tokens through A (mirrored: its gradient summed over
    // the ranks' tokens), then gathered like the base's input (backward: reduce-scatter).
    // An input that entered through copy_to_parallel: A's gradient summed, x's left to it.
    Reduction entry = b.entry;
    if (entry.dim < 0) entry.dim += x.dim();
    h = at::matmul(x, copy_to_parallel(a_cat, b.comm).t());
    if (entry.op == ReduceOp::kAllGather) h = entry.apply(h);
  } else {
    // Mirrored input: x A^T is the same on every rank; its gradient (hence A's and x's) the
    // sum of every rank's rows' parts.
    h = copy_to_parallel(at::matmul(x, a_cat.t()), b.comm);
  }
  const auto& plan = b.plan();
  std::vector<at::Tensor> out;
  int64_t col = 0;
  const int64_t r = adapter.config.rank();
  for (size_t s = 0; s < plan.pieces.size(); ++s) {
    const int64_t rows = plan.pieces[s].size();
    if (!adapter.A[s].defined()) {
      auto shape = h.sizes().vec();
      shape.back() = rows;
      out.push_back(at::zeros(shape, h.options()));
      continue;
    }
    at::Tensor bs = adapter.B[s];
    if (b.replica_rows > 0) bs = SumReplicaGrads::apply(bs, &b, plan.pieces[s].local_offset);
    out.push_back(at::matmul(h.narrow(-1, col, r), bs.t()));
    col += r;
  }
  if (b.pad_rows > 0) {  // the LM head's padding columns: nothing added
    auto shape = h.sizes().vec();
    shape.back() = b.pad_rows;
    out.push_back(at::zeros(shape, h.options()));
  }
  return (out.size() == 1 ? out[0] : at::cat(out, -1)).mul_(scaling);
}

// The inference path's factors: every A the adapter has, concatenated, and each B, in the
// dtype the small GEMMs run in, stamped with the version counters of the tensors they came
// from and made again once one changed (an optimizer step, a load). A bfloat16 / float16
// layer keeps float32 copies too: at one row, ATen's 16-bit GEMMs of these shapes cost
// more than the float32 ones with the conversions (2026-12-07 in benchmarks/RESULTS.md);
// from two rows on, its 16-bit addmm into the output wins by far.
struct LoRAImpl::Adapter::Prepared {
  struct Factors {
    std::vector<std::pair<const void*, int64_t>> stamp;
    at::Tensor a_cat;
    std::vector<at::Tensor> b;
  };
  Factors native, widened;
  std::mutex mutex;
};

namespace {

std::vector<std::pair<const void*, int64_t>> stamp_of(const std::vector<at::Tensor>& a,
                                                      const std::vector<at::Tensor>& b) {
  std::vector<std::pair<const void*, int64_t>> out;
  for (const auto* list : {&a, &b})
    for (const auto& t : *list)
      if (t.defined()) out.emplace_back(t.data_ptr(), static_cast<int64_t>(t._version()));
  return out;
}

}  // namespace

void LoRAImpl::add_in_place(const Adapter& adapter, const at::Tensor& x, at::Tensor& y) const {
  // No autograd: y += scaling (x A^T) B^T, each segment's product added into y's own
  // columns (the gradient paths' collectives are identities forward).
  const auto& b = *base_;
  if (b.embedding) {  // a lookup, not a GEMM: the autograd path's arithmetic, recorded by nothing
    at::NoGradGuard no_grad;
    y.add_(delta(adapter, x));
    return;
  }
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor y2 = y.view({-1, y.size(-1)});
  const bool widen =
      x.is_cpu() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) && x2.size(0) == 1;
  at::Tensor a_cat;
  std::vector<at::Tensor> bs;
  {
    auto& p = *adapter.prepared;
    std::lock_guard<std::mutex> lock(p.mutex);
    auto& f = widen ? p.widened : p.native;
    auto stamp = stamp_of(adapter.A, adapter.B);
    if (!f.a_cat.defined() || f.stamp != stamp) {
      at::NoGradGuard no_grad;
      const auto dtype = widen ? at::kFloat : x.scalar_type();
      std::vector<at::Tensor> a;
      f.b.clear();
      for (size_t s = 0; s < adapter.A.size(); ++s) {
        if (adapter.A[s].defined()) a.push_back(adapter.A[s].to(dtype));
        f.b.push_back(adapter.A[s].defined() ? adapter.B[s].to(dtype) : at::Tensor());
      }
      f.a_cat = (a.size() == 1 ? a[0] : at::cat(a, 0)).contiguous();
      f.stamp = std::move(stamp);
    }
    a_cat = f.a_cat;
    bs = f.b;
  }
  const at::Tensor h = at::matmul(widen ? x2.to(at::kFloat) : x2, a_cat.t());
  const double scaling = adapter.config.scaling();
  const auto& plan = b.plan();
  const int64_t r = adapter.config.rank();
  int64_t col = 0;
  for (size_t s = 0; s < plan.pieces.size(); ++s) {
    if (!adapter.A[s].defined()) continue;
    const auto& piece = plan.pieces[s];
    at::Tensor out = b.row ? y2 : y2.narrow(1, piece.local_offset, piece.size());
    const at::Tensor hs = b.row ? h : h.narrow(1, col, r);
    if (out.size(1) > 0) {
      if (widen)
        out.add_(at::matmul(hs, bs[s].t()), scaling);
      else
        out.addmm_(hs, bs[s].t(), 1.0, scaling);
    }
    col += r;
  }
}

at::Tensor LoRAImpl::add_to(const at::Tensor& x, at::Tensor y) const {
  const auto& sel = *selection_;
  if (!sel.whole().empty()) {
    if (!has(sel.whole())) return y;
    const auto& adapter = adapters_.at(sel.whole());
    const bool in_place = !at::GradMode::is_enabled() && base_->entry.op != ReduceOp::kAllGather && y.is_contiguous();
    if (in_place) {
      add_in_place(adapter, x, y);
      return y;
    }
    at::Tensor d = delta(adapter, x);
    return recording(x, y) || recording(d, d) ? y + d : y.add_(d);
  }
  const auto& rows = sel.per_row();
  if (rows.empty()) return y;
  TORCH_CHECK_VALUE(x.dim() >= 2 && x.size(0) == static_cast<int64_t>(rows.size()), base_->layer,
                    ": the adapter selection names ", rows.size(), " rows; the input has shape ", x.sizes(),
                    " (its first dimension must be the batch's rows)");
  TORCH_CHECK_VALUE(base_->entry.op != ReduceOp::kAllGather, base_->layer,
                    ": a per-row adapter selection is not taken under sequence parallelism (the tokens are split "
                    "over the ranks); select one adapter for the whole batch");
  // Grouped: one pair of GEMMs per adapter over its rows, no per-row loop.
  for (const auto& name : sel.names()) {
    if (!has(name)) continue;
    std::vector<int64_t> idx;
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i] == name) idx.push_back(static_cast<int64_t>(i));
    const at::Tensor index = at::tensor(idx, at::TensorOptions().dtype(at::kLong)).to(x.device());
    const auto& adapter = adapters_.at(name);
    if (!at::GradMode::is_enabled()) {
      // The rows' own delta through the inference path, then added into their rows.
      const at::Tensor xs = x.index_select(0, index);
      auto shape = y.sizes().vec();
      shape[0] = xs.size(0);
      at::Tensor d = at::zeros(shape, y.options());
      add_in_place(adapter, xs, d);
      y.index_add_(0, index, d);
      continue;
    }
    const at::Tensor d = delta(adapter, x.index_select(0, index));
    y = recording(x, y) || recording(d, d) ? y.index_add(0, index, d) : y.index_add_(0, index, d);
  }
  return y;
}

void LoRAImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::LoRA(";
  bool first = true;
  for (const auto& [name, a] : adapters_) {
    stream << (first ? "" : ", ") << name << "(r=" << a.config.rank() << ", alpha=" << a.config.alpha()
           << (a.config.use_rslora() ? ", rslora" : "") << ")";
    first = false;
  }
  stream << ")";
}

}  // namespace tp
