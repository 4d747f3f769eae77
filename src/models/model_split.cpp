#include "tp/models/model_split.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "tp/models/layer_options.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/heads.h"
#include "tp/shard/vocab.h"

namespace tp {

SplitPolicy model_split_policy(const ModelConfig& config, int64_t layer, SplitKind kind) {
  if (config.split_weights.empty()) return {};
  const int64_t rotation = kind == SplitKind::kAttention ? layer : layer + 1;
  return SplitPolicy{}.with_weights(config.split_weights).with_rotation(rotation);
}

namespace {

std::string ratio(const std::vector<double>& w) {
  std::ostringstream s;
  for (size_t r = 0; r < w.size(); ++r) s << (r ? ":" : "") << w[r];
  return s.str();
}

// With KV heads replicated, each group of world / num_kv_heads ranks holds one KV head and
// its query heads whatever its weights: the groups' weights must be equal.
void check_replica_groups(const std::vector<double>& w, int64_t kv_heads, const std::string& source) {
  const int64_t world = static_cast<int64_t>(w.size()), per = world / kv_heads;
  std::vector<double> sums(static_cast<size_t>(kv_heads), 0.0);
  for (int64_t r = 0; r < world; ++r) sums[static_cast<size_t>(r / per)] += w[static_cast<size_t>(r)];
  const double mean = std::accumulate(sums.begin(), sums.end(), 0.0) / static_cast<double>(kv_heads);
  const bool equal = std::all_of(sums.begin(), sums.end(), [&](double s) { return std::abs(s - mean) <= 1e-9 * mean; });
  if (equal) return;
  std::vector<double> fixed;
  for (int64_t r = 0; r < world; ++r) {
    const double x = w[static_cast<size_t>(r)] * mean / sums[static_cast<size_t>(r / per)];
    fixed.push_back(std::round(x * 1000.0) / 1000.0);
  }
  TORCH_CHECK_VALUE(false, "split_weights ", ratio(w), ": ", source, " has num_key_value_heads=", kv_heads, " over ",
                    world, " ranks, so each group of ", per,
                    " consecutive ranks holds one KV head and its query heads whatever its weights; the groups' "
                    "weights must have equal sums (the nearest that do: ",
                    ratio(fixed), ")");
}

void check_weights(const std::vector<double>& w, int64_t world) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(w.size()) == world, "split_weights ", ratio(w), ": ", w.size(),
                    " weights for a world of ", world, " ranks (one per rank, or none for an even split)");
  for (size_t r = 0; r < w.size(); ++r) {
    TORCH_CHECK_VALUE(std::isfinite(w[r]) && w[r] > 0, "split_weights ", ratio(w), ": rank ", r, "'s weight ", w[r],
                      " must be a finite positive number (a rank that should hold nothing does not belong in the "
                      "model's world)");
  }
}

std::string layer_name(int64_t layer) { return "layer " + std::to_string(layer); }

template <typename F>
auto shard_call(const F& f) {
  try {
    return f();
  } catch (const ShardError& e) {
    TORCH_CHECK_VALUE(false, "split plan: ", e.what());
  }
}

// Every rank's units of every cut: the calls the layers make.
SplitPlan plan_units(const ModelConfig& config, int64_t world, int64_t num_layers, int64_t pad) {
  const auto& w = config.split_weights;
  SplitPlan plan;
  plan.model = config.source;
  plan.weights = w;
  plan.world = world;
  for (int64_t i = 0; i < num_layers; ++i) {
    const auto opts = decoder_layer_options(config, i);
    std::vector<LayerShare> shares(static_cast<size_t>(world));
    // The attention: the heads QKVParallelLinear plans, its format's alignment added.
    const auto qkv_method = make_quant_method(opts.qkv.quant());
    const SplitPolicy heads = opts.qkv.split()
                                  .with_granularity(combine_granularity(opts.qkv.split().granularity,
                                                                        qkv_method->tp_alignment(ShardMode::kColumn)))
                                  .with_partial_tail(qkv_method->allows_partial_block(ShardMode::kColumn));
    for (int64_t r = 0; r < world; ++r) {
      const HeadPlan p = shard_call([&] {
        return plan_heads(config.num_attention_heads, config.num_key_value_heads, config.head_dim, world, r, heads,
                          opts.qkv.query_granularity());
      });
      shares[static_cast<size_t>(r)].q_heads = p.q_heads.size();
      shares[static_cast<size_t>(r)].kv_heads = p.kv_heads.size();
    }
    if (config.is_moe(i)) {
      const auto moe = moe_layer_options(config, i, config.dtype);
      for (int64_t r = 0; r < world; ++r) {
        const MoEPlacement p = moe_placement(moe, world, r);
        auto& s = shares[static_cast<size_t>(r)];
        s.experts = p.experts.size();
        s.expert_rows = p.rows.size();
        s.shared_rows = p.shared_rows.size();
      }
    } else {
      const auto& column = config.gated_mlp ? opts.gate_up.quant() : opts.up.quant();
      const SplitPolicy rows =
          opts.down.split().with_partial_tail(make_quant_method(column)->allows_partial_block(ShardMode::kColumn));
      const auto ranges = shard_call([&] { return split(config.intermediate_size, world, rows, "intermediate_size"); });
      for (int64_t r = 0; r < world; ++r)
        shares[static_cast<size_t>(r)].mlp_rows = ranges[static_cast<size_t>(r)].size();
    }
    plan.layers.push_back(shares);
  }
  const VocabPartition vocab = shard_call([&] { return partition_vocab(config.vocab_size, world, pad, w); });
  for (int64_t r = 0; r < world; ++r) plan.vocab_rows.push_back(vocab.range(r).size());
  plan.split_bytes.assign(static_cast<size_t>(world), 0);
  plan.whole_bytes.assign(static_cast<size_t>(world), 0);
  return plan;
}

// Per cut of a plan, each rank's units: [cut][rank], cuts in the order `names` gets them.
std::vector<std::vector<int64_t>> cuts_of(const SplitPlan& plan, const ModelConfig& config,
                                          std::vector<std::string>* names = nullptr) {
  std::vector<std::vector<int64_t>> cuts;
  const auto add = [&](std::vector<int64_t> held, int64_t total, const std::string& what) {
    cuts.push_back(std::move(held));
    if (names) names->push_back(std::to_string(total) + " " + what);
  };
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    std::vector<int64_t> q, rows, shared;
    for (const auto& x : plan.layers[i]) {
      q.push_back(x.q_heads);
      rows.push_back(config.is_moe(static_cast<int64_t>(i)) ? x.experts * x.expert_rows : x.mlp_rows);
      shared.push_back(x.shared_rows);
    }
    const std::string where = " of " + layer_name(static_cast<int64_t>(i));
    add(q, config.num_attention_heads, "query heads" + where + "'s attention");
    if (config.is_moe(static_cast<int64_t>(i))) {
      add(rows, config.moe.num_experts, "experts' rows" + where);
      if (config.moe.shared_expert_intermediate_size > 0)
        add(shared, config.moe.shared_expert_intermediate_size, "shared expert's rows" + where);
    } else {
      add(rows, config.intermediate_size, "intermediate rows" + where + "'s MLP");
    }
  }
  add(plan.vocab_rows, std::accumulate(plan.vocab_rows.begin(), plan.vocab_rows.end(), int64_t{0}), "vocabulary rows");
  return cuts;
}

// The first cut a rank holds none of where the even split gives it some ("rank 0 gets none
// of the 8 query heads of layer 0's attention"), or "". (A cut too coarse for every rank even
// evenly, one 128-block of KV heads over two ranks, leaves a rank idle there at any weights.)
std::string first_empty_share(const SplitPlan& plan, const SplitPlan& even, const ModelConfig& config) {
  std::vector<std::string> names;
  const auto cuts = cuts_of(plan, config, &names);
  const auto even_cuts = cuts_of(even, config);
  for (size_t c = 0; c < cuts.size(); ++c) {
    for (size_t r = 0; r < cuts[c].size(); ++r) {
      if (cuts[c][r] == 0 && even_cuts[c][r] > 0) return "rank " + std::to_string(r) + " gets none of the " + names[c];
    }
  }
  return "";
}

// The weights nearest `w` on the way to the even split that give every rank some of every
// cut the even split gives it some of, printed to three places (and checked so).
std::string weights_that_work(ModelConfig config, const SplitPlan& even, int64_t world, int64_t num_layers,
                              int64_t pad) {
  const std::vector<double> w = config.split_weights;
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  for (int step = 1; step <= 100; ++step) {
    const double t = step / 100.0;
    std::vector<double> mixed;
    for (double x : w) {
      const double f = (1 - t) * x / sum + t / static_cast<double>(world);
      mixed.push_back(std::round(f * 1000.0) / 1000.0);
    }
    config.split_weights = mixed;
    if (first_empty_share(plan_units(config, world, num_layers, pad), even, config).empty()) return ratio(mixed);
  }
  return "";
}

}  // namespace

SplitPlan plan_model_split(const ModelConfig& config, int64_t world, int64_t num_layers,
                           int64_t pad_vocab_to_multiple_of) {
  const auto& w = config.split_weights;
  if (w.empty()) return plan_units(config, world, num_layers, pad_vocab_to_multiple_of);
  check_weights(w, world);
  if (world > config.num_key_value_heads) check_replica_groups(w, config.num_key_value_heads, config.source);
  SplitPlan plan = plan_units(config, world, num_layers, pad_vocab_to_multiple_of);
  ModelConfig even_config = config;
  even_config.split_weights.clear();
  const SplitPlan even = plan_units(even_config, world, num_layers, pad_vocab_to_multiple_of);
  const std::string empty = first_empty_share(plan, even, config);
  if (!empty.empty()) {
    const std::string fix = weights_that_work(config, even, world, num_layers, pad_vocab_to_multiple_of);
    TORCH_CHECK_VALUE(false, "split_weights ", ratio(w), " cannot be honoured by ", config.source, ": ", empty,
                      " (the even split gives it some), so its device would idle there; ",
                      fix.empty() ? "no weights between these and the even split give every rank its share"
                                  : "the nearest weights that give every rank a share of everything: " + fix);
  }
  return plan;
}

std::string SplitPlan::to_string() const {
  constexpr int kColumn = 22;
  std::ostringstream s;
  s << "split plan of " << (model.empty() ? "the model" : model) << " over " << world << " rank"
    << (world == 1 ? "" : "s") << ": " << (weights.empty() ? "even" : "weights " + ratio(weights)) << "\n";
  const auto row = [&](const std::string& label, const auto& cell) {
    s << std::left << std::setw(kColumn) << label;
    for (int64_t r = 0; r < world; ++r) s << std::left << std::setw(kColumn) << cell(static_cast<size_t>(r));
    s << "\n";
  };
  row("", [](size_t r) { return "rank " + std::to_string(r); });
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& l = layers[i];
    const std::string name = layer_name(static_cast<int64_t>(i));
    row(name + " attention",
        [&](size_t r) { return "q " + std::to_string(l[r].q_heads) + " kv " + std::to_string(l[r].kv_heads); });
    if (l[0].experts > 0 || l[0].expert_rows > 0 || l[0].mlp_rows == 0) {
      row(name + " experts",
          [&](size_t r) { return std::to_string(l[r].experts) + " x " + std::to_string(l[r].expert_rows) + " rows"; });
      if (l[0].shared_rows > 0)
        row(name + " shared", [&](size_t r) { return std::to_string(l[r].shared_rows) + " rows"; });
    } else {
      row(name + " mlp", [&](size_t r) { return std::to_string(l[r].mlp_rows) + " rows"; });
    }
  }
  row("vocabulary", [&](size_t r) { return std::to_string(vocab_rows[r]) + " rows"; });
  const int64_t split_total = std::accumulate(split_bytes.begin(), split_bytes.end(), int64_t{0});
  if (split_total > 0) {
    const double weight_sum = std::accumulate(weights.begin(), weights.end(), 0.0);
    row("split bytes", [&](size_t r) {
      std::ostringstream c;
      c << split_bytes[r] << " (" << std::fixed << std::setprecision(1)
        << 100.0 * static_cast<double>(split_bytes[r]) / static_cast<double>(split_total) << "%)";
      return c.str();
    });
    row("weight", [&](size_t r) {
      std::ostringstream c;
      c << std::fixed << std::setprecision(1)
        << (weights.empty() ? 100.0 / static_cast<double>(world) : 100.0 * weights[r] / weight_sum) << "%";
      return c.str();
    });
    row("whole bytes", [&](size_t r) { return std::to_string(whole_bytes[r]); });
  }
  return s.str();
}

}  // namespace tp
