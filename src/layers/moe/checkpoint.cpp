#include "layers/moe/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>

namespace tp::detail {

namespace {

// The last box viewed in one fused tensor (TensorSource::view_region), shared by the views
// of its interleaved parts: the gate view and the up view of GPT-OSS's gate_up each want
// rows [2b, 2e) of the same expert (every other one), so the second takes the first's view
// (a view of the mapped file, or where the source has none, one read for both).
struct SharedRegion {
  std::mutex mutex;
  std::vector<Range> region;
  at::Tensor tensor;
};

bool same(const std::vector<Range>& a, const std::vector<Range>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Expert e of a fused tensor, rows {offset + stride * i : i < rows} of its output
// dimension, as [out, ...] (transposed back from a stored [in, out]).
class FusedExpertSource final : public TensorSource {
 public:
  struct Spec {
    const Checkpoint* checkpoint = nullptr;
    std::string fused;  // the fused tensor's name
    std::string name;   // this view's, for messages
    std::string where;
    int64_t expert = 0, offset = 0, stride = 1, rows = 0;
    bool transposed = false;  // the expert's tensor is stored [in, out] (2-D)
    // What the fused tensor must look like: [experts, ..., out_rows at rows_dim, ...].
    int64_t experts = 0, out_rows = 0;
    std::string out_what;                  // "gate/up" or "hidden"
    std::shared_ptr<SharedRegion> shared;  // the interleaved parts' common view (stride > 1)
  };
  explicit FusedExpertSource(Spec spec) : spec_(std::move(spec)) {}

  const std::string& name() const override { return spec_.name; }
  at::ScalarType dtype() const override { return source().dtype(); }
  std::vector<int64_t> shape() const override {
    const auto s = source().shape();
    std::vector<int64_t> out(s.begin() + 1, s.end());
    if (spec_.transposed) std::swap(out[0], out[1]);
    out[0] = spec_.rows;
    return out;
  }

  at::Tensor read(int64_t dim, Range range) const override {
    check_read_args(*this, dim, range);
    return view(dim, range).clone(at::MemoryFormat::Contiguous);
  }

  // Straight from the fused tensor into `dst`: an expert's contiguous rows (stride 1, stored
  // [out, ...]) as the box's bytes (read_region_into); an interleaved part's every
  // stride-th row, or a transposed expert, by ATen's copy from a view of the file.
  void read_into(int64_t dim, Range range, const at::Tensor& dst) const override {
    check_read_into_args(*this, dim, range, dst);
    if (spec_.stride != 1 || spec_.transposed) {
      dst.copy_(view(dim, range));
      return;
    }
    std::vector<Range> region = expert_region(dim, range);
    region[1] = (dim == 0 ? range : Range{0, spec_.rows}).shifted(spec_.offset);
    source().read_region_into(region, dst.unsqueeze(0));
  }

 private:
  // read(dim, range) as a read-only view of the fused tensor (TensorSource::view_region: of
  // the mapped file where the source is one): the rows of every interleaved part, then this
  // part's every stride-th one; transposed back where the expert is stored [in, out].
  at::Tensor view(int64_t dim, Range range) const {
    std::vector<Range> region = expert_region(dim, range);
    const int64_t rows_dim = spec_.transposed ? 2 : 1;  // the output dimension in the fused tensor
    const Range rows = dim == 0 ? range : Range{0, spec_.rows};
    region[static_cast<size_t>(rows_dim)] =
        spec_.stride == 1 ? rows.shifted(spec_.offset) : Range{spec_.stride * rows.begin, spec_.stride * rows.end};
    at::Tensor t;
    if (spec_.stride == 1) {
      t = source().view_region(region);
    } else {
      std::lock_guard<std::mutex> lock(spec_.shared->mutex);
      if (!spec_.shared->tensor.defined() || !same(spec_.shared->region, region)) {
        spec_.shared->tensor = at::Tensor();  // the last box's pages go first
        spec_.shared->tensor = source().view_region(region);
        spec_.shared->region = region;
      }
      t = spec_.shared->tensor;
    }
    t = t.select(0, 0);
    if (spec_.stride != 1) t = t.slice(rows_dim - 1, spec_.offset, std::numeric_limits<int64_t>::max(), spec_.stride);
    return spec_.transposed ? t.t() : t;
  }

  // The fused tensor's box for read(dim, range) of this view: expert e, `range` along a
  // dimension other than the rows (dim > 0), the rest whole; the rows' range is the caller's.
  std::vector<Range> expert_region(int64_t dim, Range range) const {
    std::vector<Range> region;
    for (const int64_t n : source().shape()) region.push_back({0, n});
    region[0] = {spec_.expert, spec_.expert + 1};
    if (dim != 0) region[static_cast<size_t>(spec_.transposed ? 1 : dim + 1)] = range;
    return region;
  }

  // The fused tensor, looked up (and so recorded as read) on first use, its shape checked.
  const TensorSource& source() const {
    std::call_once(resolved_, [&] {
      const auto& source = spec_.checkpoint->get(spec_.fused, spec_.where);
      const auto s = source.shape();
      const int64_t rows_dim = spec_.transposed ? 2 : 1;
      TORCH_CHECK_VALUE(
          (spec_.transposed ? s.size() == 3 : s.size() >= 2) && s[0] == spec_.experts && s[rows_dim] == spec_.out_rows,
          spec_.where, ": tensor '", spec_.fused, "' has shape ", c10::IntArrayRef(s), "; expected [", spec_.experts,
          spec_.transposed ? ", <in>, " : ", ", spec_.out_rows, spec_.transposed ? "" : ", ...",
          "]: experts first, then one ", spec_.out_what, " output per ", spec_.transposed ? "column" : "row");
      source_ = &source;
    });
    return *source_;
  }
  Spec spec_;
  mutable std::once_flag resolved_;
  mutable const TensorSource* source_ = nullptr;
};

std::string join(const std::string& a, const std::string& b) { return a + "." + b; }

// "<fused>" for the weight, "<fused>_<suffix>" for the rest.
std::string fused_tensor_name(const std::string& fused, const std::string& suffix) {
  return suffix == "weight" ? fused : fused + "_" + suffix;
}

}  // namespace

std::string expert_name_prefix(const std::string& prefix, int64_t e) {
  return prefix + ".experts." + std::to_string(e) + ".";
}

ExpertPrefixes per_expert_prefixes(const std::string& prefix, const MoECheckpointLayout& layout, int64_t e) {
  const std::string p = expert_name_prefix(prefix, e);
  return {p + layout.gate_name(), p + layout.up_name(), p + layout.down_name()};
}

FusedExpertView fused_expert_view(const Checkpoint& checkpoint, const std::string& prefix,
                                  const MoECheckpointLayout& layout, const MoEShape& shape, int64_t e,
                                  const std::string& what) {
  const std::string experts = prefix + ".experts";
  const std::string gate_up = join(experts, layout.gate_up_name()), down = join(experts, layout.down_name());
  const std::string where = what + " (fused expert layout" +
                            (layout.interleaved_gate_up() ? std::string(", gate/up interleaved") : std::string()) +
                            (layout.transposed() ? std::string(", transposed") : std::string()) + ")";
  FusedExpertView view;
  // Synthetic prefixes the methods append their suffixes to; the sources keep the fused
  // tensors' own names (with the expert) for messages.
  const auto names = checkpoint.names_with_prefix(experts + ".");
  for (const auto& fused : {gate_up, down}) {
    const bool found = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
      return n == fused || n.rfind(fused + "_", 0) == 0;  // the weight, or a format's "<name>_blocks", ...
    });
    TORCH_CHECK_VALUE(found, where, ": the checkpoint has no tensor '", fused, "' (nor '", fused,
                      "_<suffix>'): the fused layout keeps every expert's projection in one tensor; a checkpoint "
                      "with one tensor per expert, '",
                      experts, ".0.<name>.weight', is the per-expert layout");
  }
  const std::string e_str = "[" + std::to_string(e) + "]";
  view.prefixes = {gate_up + e_str + ".gate", gate_up + e_str + ".up", down + e_str};
  for (const auto& name : names) {
    const bool is_gate_up = name == gate_up || name.rfind(gate_up + "_", 0) == 0;
    const bool is_down = name == down || name.rfind(down + "_", 0) == 0;
    if (!is_gate_up && !is_down) continue;  // not this layout's: strict loading names it
    const std::string fused = is_gate_up ? gate_up : down;
    const std::string suffix = name == fused ? "weight" : name.substr(fused.size() + 1);
    const bool transposed = layout.transposed() && suffix == "weight";
    FusedExpertSource::Spec spec;
    spec.checkpoint = &checkpoint;
    spec.fused = name;
    spec.where = where;
    spec.expert = e;
    spec.transposed = transposed;
    spec.experts = shape.experts;
    spec.out_rows = spec.rows = is_gate_up ? 2 * shape.intermediate : shape.hidden;
    spec.out_what = is_gate_up ? "gate/up" : "hidden";
    if (is_down) {
      spec.name = name + e_str;
      view.checkpoint.add(join(view.prefixes.down, suffix), std::make_shared<FusedExpertSource>(spec));
      continue;
    }
    spec.rows = shape.intermediate;
    spec.stride = layout.interleaved_gate_up() ? 2 : 1;
    spec.shared = std::make_shared<SharedRegion>();
    for (const bool up : {false, true}) {
      spec.offset = up ? (layout.interleaved_gate_up() ? 1 : shape.intermediate) : 0;
      spec.name = name + e_str + (up ? ".up" : ".gate");
      view.checkpoint.add(join(up ? view.prefixes.up : view.prefixes.gate, suffix),
                          std::make_shared<FusedExpertSource>(spec));
    }
  }
  return view;
}

std::map<std::string, at::Tensor> expert_checkpoint_tensors(const std::string& prefix,
                                                            const MoECheckpointLayout& layout,
                                                            const std::vector<ExpertTensors>& experts) {
  std::map<std::string, at::Tensor> out;
  const bool bias = !experts.empty() && experts.front().gate_bias.defined();
  if (layout.experts() == ExpertLayout::kPerExpert) {
    for (size_t e = 0; e < experts.size(); ++e) {
      const auto p = per_expert_prefixes(prefix, layout, static_cast<int64_t>(e));
      const auto& t = experts[e];
      out[p.gate + ".weight"] = t.gate;
      out[p.up + ".weight"] = t.up;
      out[p.down + ".weight"] = t.down;
      if (!bias) continue;
      out[p.gate + ".bias"] = t.gate_bias;
      out[p.up + ".bias"] = t.up_bias;
      out[p.down + ".bias"] = t.down_bias;
    }
    return out;
  }
  // [gate | up] rows per expert, or gate and up rows alternating.
  const auto fuse = [&](const at::Tensor& gate, const at::Tensor& up) {
    return layout.interleaved_gate_up() ? at::stack({gate, up}, 1).flatten(0, 1) : at::cat({gate, up}, 0);
  };
  std::vector<at::Tensor> gu, d, gub, db;
  for (const auto& t : experts) {
    gu.push_back(fuse(t.gate, t.up));
    d.push_back(t.down);
    if (bias) {
      gub.push_back(fuse(t.gate_bias, t.up_bias));
      db.push_back(t.down_bias);
    }
  }
  const std::string gate_up = prefix + ".experts." + layout.gate_up_name();
  const std::string down = prefix + ".experts." + layout.down_name();
  at::Tensor gu3 = at::stack(gu), d3 = at::stack(d);
  if (layout.transposed()) {
    gu3 = gu3.transpose(1, 2);
    d3 = d3.transpose(1, 2);
  }
  out[gate_up] = gu3.contiguous();
  out[down] = d3.contiguous();
  if (bias) {
    out[fused_tensor_name(gate_up, "bias")] = at::stack(gub);
    out[fused_tensor_name(down, "bias")] = at::stack(db);
  }
  return out;
}

}  // namespace tp::detail
