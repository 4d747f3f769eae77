#include "tp/layers/moe/expert_lora.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cmath>
#include <ostream>

#include "layers/moe/expert_lora_step.h"
#include "tp/comm/collective_status.h"
#include "tp/comm/differentiable.h"

namespace tp {

namespace detail {

at::Tensor ExpertLoRABase::gate_up_rows(bool interleaved) const {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(options.device());
  const at::Tensor j = at::arange(rows.begin, rows.end, opts);
  return interleaved ? at::cat({2 * j, 2 * j + 1}) : at::cat({j, j + intermediate});
}

namespace {

// y plus scaling (x A^T) B^T for the tokens that take the adapter (all where `mask` is undefined).
at::Tensor add_one(const at::Tensor& a, const at::Tensor& b, double scaling, const at::Tensor& mask,
                   const at::Tensor& x, const at::Tensor& token, const at::Tensor& y) {
  if (!mask.defined()) return y + at::matmul(at::matmul(x, a.t()), b.t()).mul(scaling).to(y.scalar_type());
  const at::Tensor index = mask.index_select(0, token).nonzero().squeeze(-1);
  const at::Tensor d = at::matmul(at::matmul(x.index_select(0, index), a.t()), b.t()).mul(scaling);
  return y.index_add(0, index, d.to(y.scalar_type()));
}

}  // namespace

at::Tensor ExpertLoRAStep::add_gate_up(int64_t expert, const at::Tensor& x, const at::Tensor& token,
                                       at::Tensor y) const {
  for (const auto& a : adapters)
    if (a.gate_up_A.defined())
      y = add_one(a.gate_up_A[expert], a.gate_up_B[expert], a.gate_up_scaling, a.tokens, x, token, y);
  return y;
}

at::Tensor ExpertLoRAStep::add_down(int64_t expert, const at::Tensor& h, const at::Tensor& token, at::Tensor y) const {
  for (const auto& a : adapters)
    if (a.down_A.defined()) y = add_one(a.down_A[expert], a.down_B[expert], a.down_scaling, a.tokens, h, token, y);
  return y;
}

}  // namespace detail

ExpertLoRAImpl::ExpertLoRAImpl(std::shared_ptr<detail::ExpertLoRABase> base)
    : torch::nn::Module("tp::ExpertLoRA"), base_(std::move(base)), selection_(std::make_shared<LoRASelection>()) {}

void ExpertLoRAImpl::ensure_group() const {
  auto& b = *base_;
  if (b.ranks_per_group == 1 || b.ranks_per_group == b.comm.world_size() || b.group) return;
  const int64_t first = b.comm.rank() - b.rank_in_group();
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < b.ranks_per_group; ++r) ranks.push_back(first + r);
  b.group = b.comm.split(ranks);
}

ExpertLoRAImpl::Adapter& ExpertLoRAImpl::make(const std::string& name, const std::optional<LoRAConfig>& gate_up,
                                              const std::optional<LoRAConfig>& down) {
  const auto& b = *base_;
  TORCH_CHECK_VALUE(!has(name), b.layer, ": it has an adapter '", name, "' already");
  TORCH_CHECK_VALUE(gate_up || down, b.layer, ": adapter '", name, "' is on neither gate_up nor down");
  for (const auto* c : {&gate_up, &down})
    TORCH_CHECK_VALUE(!*c || (*c)->rank() > 0, b.layer, ": adapter '", name, "' has rank ", (*c)->rank(),
                      "; a rank is positive");
  const int64_t n = b.experts.size(), rows = b.rows.size();
  auto module = register_module(name, std::make_shared<torch::nn::Module>("tp::ExpertLoRAAdapter"));
  Adapter adapter;
  adapter.gate_up_config = gate_up;
  adapter.down_config = down;
  if (gate_up) {
    const int64_t r = gate_up->rank();
    adapter.gate_up_A = module->register_parameter("gate_up_A", at::zeros({n, r, b.hidden}, b.options));
    adapter.gate_up_B = module->register_parameter("gate_up_B", at::zeros({n, 2 * rows, r}, b.options));
  }
  if (down) {
    const int64_t r = down->rank();
    adapter.down_A = module->register_parameter("down_A", at::zeros({n, r, rows}, b.options));
    adapter.down_B = module->register_parameter("down_B", at::zeros({n, b.hidden, r}, b.options));
  }
  return adapters_[name] = adapter;
}

void ExpertLoRAImpl::add(const std::string& name, const std::optional<LoRAConfig>& gate_up,
                         const std::optional<LoRAConfig>& down) {
  const auto& b = *base_;
  Adapter* adapter = nullptr;
  run_collectively(b.comm, b.layer + ".lora.add", [&] { adapter = &make(name, gate_up, down); });
  ensure_group();
  // PEFT's ParamWrapper: A [r * E, in] Kaiming-uniform over the whole tensor (U(-1/sqrt(in),
  // 1/sqrt(in))), B zeros; rank 0's draw on every rank, each taking its experts and columns.
  at::NoGradGuard no_grad;
  const int64_t e = b.num_experts;
  const auto draw = [&](int64_t r, int64_t in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    at::Tensor whole = at::empty({r * e, in}, b.options).uniform_(-bound, bound);
    if (b.comm.world_size() > 1) b.comm.broadcast(whole, 0);
    return whole.view({e, r, in}).narrow(0, b.experts.begin, b.experts.size());
  };
  if (gate_up) adapter->gate_up_A.copy_(draw(gate_up->rank(), b.hidden));
  if (down) adapter->down_A.copy_(draw(down->rank(), b.intermediate).narrow(2, b.rows.begin, b.rows.size()));
}

void ExpertLoRAImpl::load(const Checkpoint& checkpoint, const std::string& name,
                          const std::optional<LoRAConfig>& gate_up, const std::string& gate_up_prefix,
                          const std::optional<LoRAConfig>& down, const std::string& down_prefix, bool interleaved) {
  const auto& b = *base_;
  const int64_t e = b.num_experts, i = b.intermediate, h = b.hidden;
  run_collectively(b.comm, b.layer + ".lora.load", [&] {
    auto& adapter = make(name, gate_up, down);
    at::NoGradGuard no_grad;
    const auto read = [&](const std::string& tensor, std::vector<int64_t> shape, const char* projection, int64_t r,
                          int64_t in, int64_t out) {
      const auto& source = checkpoint.get(tensor, b.layer);
      TORCH_CHECK_VALUE(source.shape() == shape, b.layer, ": adapter '", name, "' tensor ", tensor, " has shape ",
                        c10::IntArrayRef(source.shape()), "; expected ", c10::IntArrayRef(shape), " (rank ", r,
                        " over ", e, " experts, whose ", projection, " projection takes ", in, " inputs to ", out,
                        " outputs)");
      const auto dtype = source.dtype();
      TORCH_CHECK_VALUE(dtype == at::kDouble || dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
                        b.layer, ": adapter tensor ", tensor, " is ", dtype,
                        "; LoRA factors are float64, float32, float16 or bfloat16");
      const at::Tensor t = source.read_all();
      TORCH_CHECK_VALUE(at::isfinite(t).all().item<bool>(), b.layer, ": adapter tensor ", tensor,
                        " holds a non-finite value");
      return t.to(b.options);
    };
    const auto mine = [&](const at::Tensor& stacked) { return stacked.narrow(0, b.experts.begin, b.experts.size()); };
    if (gate_up) {
      const int64_t r = gate_up->rank();
      const at::Tensor a = read(gate_up_prefix + ".lora_A.weight", {r * e, h}, "gate_up", r, h, 2 * i);
      const at::Tensor bm = read(gate_up_prefix + ".lora_B.weight", {2 * i, r * e}, "gate_up", r, h, 2 * i);
      adapter.gate_up_A.copy_(mine(a.view({e, r, h})));
      adapter.gate_up_B.copy_(
          mine(bm.view({2 * i, r, e}).permute({2, 0, 1})).index_select(1, b.gate_up_rows(interleaved)));
    }
    if (down) {
      const int64_t r = down->rank();
      const at::Tensor a = read(down_prefix + ".lora_A.weight", {r * e, i}, "down", r, i, h);
      const at::Tensor bm = read(down_prefix + ".lora_B.weight", {h, r * e}, "down", r, i, h);
      adapter.down_A.copy_(mine(a.view({e, r, i})).narrow(2, b.rows.begin, b.rows.size()));
      adapter.down_B.copy_(mine(bm.view({h, r, e}).permute({2, 0, 1})));
    }
  });
  ensure_group();
}

std::map<std::string, at::Tensor> ExpertLoRAImpl::gather(const std::string& name, const std::string& gate_up_prefix,
                                                         const std::string& down_prefix, bool interleaved) const {
  const auto& adapter = this->adapter(name);
  const auto& b = *base_;
  const int64_t e = b.num_experts, i = b.intermediate, h = b.hidden;
  const int64_t first = b.experts.begin, n = b.experts.size();
  const bool writes_mirrored = b.rank_in_group() == 0;  // one rank of each group gives the mirrored factors
  at::NoGradGuard no_grad;
  // Every tensor whole on every rank: each rank writes its part into zeros, one sum (exact:
  // every element is written by one rank).
  const auto sum = [&](at::Tensor t) {
    if (b.comm.world_size() > 1) b.comm.all_reduce(t);
    return t;
  };
  std::map<std::string, at::Tensor> out;
  if (adapter.gate_up_A.defined()) {
    const int64_t r = adapter.gate_up_config->rank();
    at::Tensor a = at::zeros({e, r, h}, b.options), bm = at::zeros({e, 2 * i, r}, b.options);
    if (writes_mirrored) a.narrow(0, first, n).copy_(adapter.gate_up_A);
    bm.narrow(0, first, n).index_copy_(1, b.gate_up_rows(interleaved), adapter.gate_up_B);
    out[gate_up_prefix + ".lora_A.weight"] = sum(a).reshape({e * r, h});
    out[gate_up_prefix + ".lora_B.weight"] = sum(bm).permute({1, 2, 0}).reshape({2 * i, r * e});
  }
  if (adapter.down_A.defined()) {
    const int64_t r = adapter.down_config->rank();
    at::Tensor a = at::zeros({e, r, i}, b.options), bm = at::zeros({e, h, r}, b.options);
    a.narrow(0, first, n).narrow(2, b.rows.begin, b.rows.size()).copy_(adapter.down_A);
    if (writes_mirrored) bm.narrow(0, first, n).copy_(adapter.down_B);
    out[down_prefix + ".lora_A.weight"] = sum(a).reshape({e * r, i});
    out[down_prefix + ".lora_B.weight"] = sum(bm).permute({1, 2, 0}).reshape({h, r * e});
  }
  return out;
}

void ExpertLoRAImpl::remove(const std::string& name) {
  adapter(name);
  adapters_.erase(name);
  unregister_module(name);
}

std::vector<std::string> ExpertLoRAImpl::names() const {
  std::vector<std::string> out;  // in registration order: the order parameters() lists them
  for (const auto& item : named_children()) out.push_back(item.key());
  return out;
}

const ExpertLoRAImpl::Adapter& ExpertLoRAImpl::adapter(const std::string& name) const {
  const auto it = adapters_.find(name);
  TORCH_CHECK_VALUE(it != adapters_.end(), base_->layer, ": no adapter '", name, "'; it has ",
                    c10::Join(", ", names()));
  return it->second;
}

std::optional<LoRAConfig> ExpertLoRAImpl::config(const std::string& name, const std::string& projection) const {
  lora_A(name, projection);
  const auto& a = adapter(name);
  return projection == "gate_up" ? a.gate_up_config : a.down_config;
}

at::Tensor ExpertLoRAImpl::lora_A(const std::string& name, const std::string& projection) const {
  adapter(name);
  TORCH_CHECK_VALUE(projection == "gate_up" || projection == "down", base_->layer, ": projection '", projection,
                    "'; the experts' are gate_up and down");
  const auto& a = adapters_.at(name);
  return projection == "gate_up" ? a.gate_up_A : a.down_A;
}

at::Tensor ExpertLoRAImpl::lora_B(const std::string& name, const std::string& projection) const {
  lora_A(name, projection);
  const auto& a = adapters_.at(name);
  return projection == "gate_up" ? a.gate_up_B : a.down_B;
}

void ExpertLoRAImpl::share_selection(std::shared_ptr<LoRASelection> selection) {
  TORCH_CHECK_VALUE(selection != nullptr, base_->layer, ": share_selection needs a selection");
  selection_ = std::move(selection);
}

detail::ExpertLoRAStep ExpertLoRAImpl::step(const at::Tensor& x_in, int64_t tokens) const {
  detail::ExpertLoRAStep out;
  const auto& sel = *selection_;
  const auto& b = *base_;
  const auto& rows = sel.per_row();
  const bool per_row = sel.whole().empty() && !rows.empty();
  if (per_row) {
    TORCH_CHECK_VALUE(x_in.dim() >= 2 && x_in.size(0) == static_cast<int64_t>(rows.size()), b.layer,
                      ": the adapter selection names ", rows.size(), " rows; the input has shape ", x_in.sizes(),
                      " (its first dimension must be the batch's rows)");
  }
  // A mirrored factor's gradient is the sum of the group's parts (each rank's rows of the
  // expert); the same on every rank of the group, which runs the same experts on the same tokens.
  const auto summed = [&](const at::Tensor& t) {
    const Communicator* group = b.sum_group();
    return t.defined() && group != nullptr && at::GradMode::is_enabled() ? copy_to_parallel(t, *group) : t;
  };
  for (const auto& name : per_row ? sel.names() : std::vector<std::string>{sel.whole()}) {
    if (!has(name)) continue;
    const auto& a = adapters_.at(name);
    detail::ExpertLoRAStep::Active active;
    if (a.gate_up_config) active.gate_up_scaling = a.gate_up_config->scaling();
    if (a.down_config) active.down_scaling = a.down_config->scaling();
    active.gate_up_A = summed(a.gate_up_A);
    active.gate_up_B = a.gate_up_B;
    active.down_A = a.down_A;
    active.down_B = summed(a.down_B);
    if (per_row) {
      std::vector<uint8_t> take;
      for (const auto& n : rows) take.push_back(n == name ? 1 : 0);
      const at::Tensor row_mask = at::tensor(take, at::TensorOptions().dtype(at::kByte)).to(at::kBool);
      active.tokens = row_mask.repeat_interleave(tokens / static_cast<int64_t>(rows.size())).to(x_in.device());
    }
    out.adapters.push_back(std::move(active));
  }
  return out;
}

void ExpertLoRAImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::ExpertLoRA(";
  bool first = true;
  for (const auto& name : names()) {
    const auto& a = adapters_.at(name);
    stream << (first ? "" : ", ") << name << "(";
    const char* sep = "";
    for (const auto& [projection, config] :
         {std::pair{"gate_up", a.gate_up_config}, std::pair{"down", a.down_config}}) {
      if (!config) continue;
      stream << sep << projection << ": r=" << config->rank() << ", alpha=" << config->alpha()
             << (config->use_rslora() ? ", rslora" : "");
      sep = "; ";
    }
    stream << ")";
    first = false;
  }
  stream << ")";
}

}  // namespace tp
