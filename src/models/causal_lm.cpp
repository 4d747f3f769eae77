#include "tp/models/causal_lm.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <numeric>
#include <set>

#include "models/model_common.h"
#include "tp/comm/collective_status.h"
#include "tp/layers/loading/load_session.h"
#include "tp/layers/numerics/heads.h"
#include "tp/loader/checkpoint.h"

namespace tp {

CausalLMImpl::CausalLMImpl(ModelConfig config_, CausalLMOptions options_, Communicator comm_)
    : config(std::move(config_)), options(std::move(options_)), comm(std::move(comm_)) {
  reset();
}

void CausalLMImpl::reset() {
  config.moe.expert_parallel_size = options.expert_parallel_size();
  config.split_weights = options.split_weights();
  config.numerics = resolve_numerics(options.numerics());
  const bool invariant = config.numerics == Numerics::kInvariant;
  const int64_t dp_size = options.attention_data_parallel_size();
  TORCH_CHECK_VALUE(dp_size == 1 || (!invariant && config.split_weights.empty()),
                    "CausalLM: attention_data_parallel_size=", dp_size, " covers the default numerics and even splits",
                    invariant ? " (numerics=invariant was asked)" : " (split_weights were given)");
  dp = AttentionDataParallel::make(comm, dp_size);
  TORCH_CHECK_VALUE(!invariant || config.split_weights.empty(),
                    "CausalLM: invariant numerics sums in chunks of an even split; weighted splits (split_weights) "
                    "are not covered (use numerics=default)");
  if (invariant) {
    TORCH_CHECK_VALUE(config.moe.num_experts == 0 && !config.parallel_residual,
                      "CausalLM: invariant numerics does not cover ",
                      config.parallel_residual ? "the parallel residual" : "mixtures of experts", " (", config.source,
                      "); use numerics=default");
  }
  // Invariant numerics sums the vocabulary in whole chunks: pad it to a multiple of one.
  const int64_t pad =
      invariant ? std::lcm(options.pad_vocab_to_multiple_of(), kInvariantChunk) : options.pad_vocab_to_multiple_of();
  const auto& c = config;
  dtype = options.dtype() == at::ScalarType::Undefined ? c.dtype : options.dtype();
  const int64_t n_layers = options.num_layers() > 0 ? options.num_layers() : c.num_hidden_layers;
  TORCH_CHECK_VALUE(n_layers <= c.num_hidden_layers, "CausalLM: num_layers=", n_layers, " but the config has ",
                    c.num_hidden_layers);
  TORCH_CHECK_VALUE(c.quant_config("lm_head").format == QuantFormat::kNone,
                    "CausalLM: a quantized lm_head is not supported");
  // A weight no layer can honour is refused here, alike on every rank, before anything is built.
  if (!c.split_weights.empty()) plan_model_split(c, comm.world_size(), n_layers, pad);
  embed_tokens =
      register_module("embed_tokens", VocabParallelEmbedding(VocabParallelEmbeddingOptions(c.vocab_size, c.hidden_size)
                                                                 .pad_to_multiple_of(pad)
                                                                 .split_weights(c.split_weights)
                                                                 .dtype(dtype)
                                                                 .device(options.device())
                                                                 .init_weights(options.init_weights()),
                                                             dp.attention));
  layers.clear();
  layer_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < n_layers; ++i) {
    layers.push_back(DecoderLayer(c, i, dtype, options.device(), dp, options.init_weights()));
    layer_list->push_back(layers.back());
  }
  norm = register_module("norm", Norm(NormOptions(c.hidden_size)
                                          .kind(c.norm)
                                          .eps(c.norm_eps)
                                          .dtype(dtype)
                                          .device(options.device())
                                          .init_weights(options.init_weights())));
  if (c.tie_word_embeddings) {
    // Holds no parameter of its own.
    lm_head = register_module("lm_head", ParallelLMHead(embed_tokens, /*gather_output=*/false, config.numerics));
  } else {
    lm_head = register_module("lm_head", ParallelLMHead(ParallelLMHeadOptions(c.hidden_size, c.vocab_size)
                                                            .pad_to_multiple_of(pad)
                                                            .split_weights(c.split_weights)
                                                            .numerics(config.numerics)
                                                            .dtype(dtype)
                                                            .device(options.device())
                                                            .init_weights(options.init_weights()),
                                                        dp.attention));
  }
  if (invariant) {
    const HeadsByRank hidden{comm, {Range{0, 1}}, 1};
    norm->scale = [hidden](const at::Tensor& w, const at::Tensor& x) {
      return scale_by_weight_invariant(w, x, hidden);
    };
  }
  rotary = RotaryEmbedding(c.rotary_dim, c.rope);
  if (c.has_local_rope) local_rotary = RotaryEmbedding(c.rotary_dim, c.local_rope);
}

void CausalLMImpl::pretty_print(std::ostream& stream) const {
  stream << "tp::CausalLM(" << to_string(config.model_type) << ", layers=" << layers.size()
         << ", hidden=" << config.hidden_size << ", heads=" << config.num_attention_heads << "/"
         << config.num_key_value_heads << ", vocab=" << config.vocab_size
         << (config.tie_word_embeddings ? ", tied" : "") << ", quant=" << config.quantization.describe()
         << ", dtype=" << dtype << ", rank=" << comm.rank() << "/" << comm.world_size() << ")";
}

at::Tensor CausalLMImpl::forward(const at::Tensor& ids, KVCache* cache, int64_t logits_to_keep) {
  TORCH_CHECK_VALUE(ids.defined() && ids.dim() == 2, "CausalLM: ids must be [batch, seq]; got ",
                    ids.defined() ? ids.sizes() : c10::IntArrayRef{});
  const int64_t b = ids.size(0), s = ids.size(1), past = cache ? cache->length : 0;
  TORCH_CHECK_VALUE(!cache || static_cast<int64_t>(cache->keys.size()) == static_cast<int64_t>(layers.size()),
                    "CausalLM: a cache for ", cache ? cache->keys.size() : 0, " layers, the model has ", layers.size());
  const auto positions =
      at::arange(past, past + s, at::TensorOptions(at::kLong).device(ids.device())).unsqueeze(0).expand({b, s});
  const auto tables = rotary_tables(positions);
  at::Tensor h = embed_tokens->forward(ids);
  // Gemma: the embeddings times sqrt(hidden) rounded to the model's dtype, as transformers does.
  if (config.scale_embeddings)
    h = h * at::scalar_tensor(std::sqrt(static_cast<double>(config.hidden_size)), h.options());
  // Each block hands the next its output and, where its last boundary is fused, that
  // output's next norm (the next block's input_layernorm, quantized for its QKV GEMM when
  // that takes codes; the final norm after the last block).
  LayerStream stream(h);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& [cos, sin] = tables[static_cast<size_t>(rotary_table_of(static_cast<int64_t>(i)))];
    const bool last = i + 1 == layers.size();
    const NextNorm next{last ? norm : layers[i + 1]->input_layernorm,
                        last ? TokenQuant::kNone : layers[i + 1]->input_quant(stream.hidden)};
    stream = layers[i]->forward(stream, next, cos, sin, cache);
  }
  if (cache) cache->length += s;
  at::Tensor normed = stream.normed.defined() ? stream.normed : norm->forward(stream.hidden);
  if (logits_to_keep > 0 && logits_to_keep < s) normed = normed.narrow(1, s - logits_to_keep, logits_to_keep);
  return finish_logits(lm_head->forward(normed));
}

std::vector<std::pair<at::Tensor, at::Tensor>> CausalLMImpl::rotary_tables(const at::Tensor& positions) const {
  std::vector<std::pair<at::Tensor, at::Tensor>> out{rotary.cos_sin(positions, dtype)};
  out.push_back(config.has_local_rope ? local_rotary.cos_sin(positions, dtype) : out.front());
  return out;
}

at::Tensor CausalLMImpl::finish_logits(const at::Tensor& local_logits) const {
  const double cap = config.final_logit_softcapping;
  if (cap <= 0) return local_logits;
  // cap * tanh(logits / cap) on the real columns; tanh would turn the padding's -inf into -cap.
  const int64_t real = lm_head->vocab_range().size();
  const at::Tensor capped = at::tanh(local_logits.narrow(-1, 0, real) / cap) * cap;
  if (real == local_logits.size(-1)) return capped;
  return at::cat({capped, local_logits.narrow(-1, real, local_logits.size(-1) - real)}, -1);
}

at::Tensor CausalLMImpl::gather_logits(const at::Tensor& local_logits) const {
  const auto& p = lm_head->partition();
  const Communicator& group = dp.attention;
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < group.world_size(); ++r) sizes.push_back(p.real(r).size());
  const at::Tensor real = local_logits.narrow(-1, 0, p.real(group.rank()).size());
  return group.world_size() == 1 ? real : group.all_gather(real.contiguous(), -1, sizes);
}

KVCache CausalLMImpl::make_cache(int64_t batch, int64_t capacity) const {
  KVCache cache;
  for (const auto& layer : layers) {
    const int64_t kv = layer->qkv->local_kv_heads();
    const auto opts = at::TensorOptions(dtype).device(options.device());
    cache.keys.push_back(at::empty({batch, kv, capacity, config.head_dim}, opts));
    cache.values.push_back(at::empty({batch, kv, capacity, config.head_dim}, opts));
  }
  return cache;
}

at::Tensor CausalLMImpl::generate_greedy(const at::Tensor& prompt, int64_t new_tokens) {
  TORCH_CHECK_VALUE(new_tokens >= 1, "CausalLM::generate_greedy: new_tokens must be >= 1; got ", new_tokens);
  GenerateOptions options;
  options.max_new_tokens = new_tokens;
  return generate(prompt, options).tokens;
}

CausalLMImpl::Generated CausalLMImpl::generate(const at::Tensor& prompt, const GenerateOptions& options) {
  TORCH_CHECK_VALUE(options.max_new_tokens >= 1, "CausalLM::generate: max_new_tokens must be >= 1; got ",
                    options.max_new_tokens);
  TORCH_CHECK_VALUE(prompt.dim() == 2 && prompt.scalar_type() == at::kLong,
                    "CausalLM::generate: the prompt must be int64 [batch, seq]; got ", prompt.scalar_type(), " ",
                    prompt.sizes());
  options.sampling.validate();
  at::NoGradGuard no_grad;
  const int64_t batch = prompt.size(0);
  // Attention data parallelism: each group decodes its own prompts, every group as many
  // steps (the MLP's collectives span them all), each row drawing as its global row.
  int64_t first_row = 0;
  if (dp.enabled()) {
    const at::Tensor mine = at::full({1}, batch, at::TensorOptions(at::kLong).device(this->options.device()));
    const at::Tensor all = comm.all_gather(mine, 0, std::vector<int64_t>(comm.world_size(), 1)).cpu();
    const int64_t per = comm.world_size() / dp.size;
    for (int64_t g = 0; g < dp.group; ++g) first_row += all[g * per].item<int64_t>();
  }
  auto cache = make_cache(batch, prompt.size(1) + options.max_new_tokens);
  std::vector<at::Tensor> out;
  const at::Tensor stops = at::tensor(options.stop_token_ids, at::kLong).to(prompt.device());
  at::Tensor done = at::zeros({batch}, prompt.options().dtype(at::kBool));
  at::Tensor lengths = at::zeros({batch}, prompt.options());
  at::Tensor history = prompt;  // the repetition penalty's: the prompt and the tokens so far
  // A group without prompts still takes every step, on no tokens.
  at::Tensor next = batch == 0 ? at::zeros({0, 1}, prompt.options()) : prompt;
  const auto& rope = config.rope;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (rope.type == RopeType::kLongRope && cache.length > 0 && cache.length <= rope.original_max_position_embeddings &&
        cache.length + next.size(1) > rope.original_max_position_embeddings) {
      // The sequence outgrows the pretrained context: the cached keys were rotated with
      // the short factors. As transformers' Phi-3 does, drop them and run the whole
      // sequence again, now with the long factors.
      cache.length = 0;
      next = history;
    }
    const at::Tensor logits = forward(next, &cache, /*logits_to_keep=*/1);  // [batch, 1, local vocab]
    const at::Tensor token = batch == 0 ? at::zeros({0}, prompt.options())
                                        : lm_head->sample(logits.select(1, 0), options.sampling, i, history,
                                                          first_row);  // [batch]
    // A stopped row shows the pad token; its input stays a token of the vocabulary (the pad
    // need not be one), and it computes on unseen.
    out.push_back(token.masked_fill(done, options.pad_token_id).unsqueeze(1));
    lengths += done.logical_not().to(at::kLong);
    if (stops.numel() > 0) done = done.logical_or(at::isin(token, stops));
    next = token.unsqueeze(1);
    history = at::cat({history, next}, 1);
    // The same tokens on every rank of a group: the same decision; the groups agree on theirs.
    bool finished = done.all().item<bool>();
    if (dp.enabled()) {
      at::Tensor open =
          at::full({1}, finished ? 0.0 : 1.0, at::TensorOptions(at::kFloat).device(this->options.device()));
      finished = comm.all_reduce(open).item<float>() == 0.0f;
    }
    if (finished) break;
  }
  return {at::cat(out, 1), lengths};
}

std::map<std::string, at::Tensor> CausalLMImpl::gather_weights() const {
  const auto& n = config.names;
  auto out = embed_tokens->gather_weights(n.embed);
  for (const auto& layer : layers) {
    auto part = layer->gather_weights();
    out.insert(part.begin(), part.end());
  }
  at::NoGradGuard no_grad;
  out[n.final_norm + ".weight"] = norm->weight.clone();
  if (norm->bias.defined()) out[n.final_norm + ".bias"] = norm->bias.clone();
  if (!config.tie_word_embeddings) {
    auto head = lm_head->gather_weights(n.lm_head);
    out.insert(head.begin(), head.end());
  }
  return out;
}

namespace {

int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

int64_t module_bytes(const torch::nn::Module& m) {
  int64_t bytes = 0;
  for (const auto& t : m.parameters()) bytes += tensor_bytes(t);
  for (const auto& t : m.buffers()) bytes += tensor_bytes(t);
  return bytes;
}

// The bytes of a decoder layer's cut modules: its projections, and a mixture's experts
// (not the router and shared expert gate every rank holds whole).
int64_t split_bytes_of(const DecoderLayerImpl& layer) {
  int64_t bytes = module_bytes(*layer.qkv) + module_bytes(*layer.o_proj);
  if (!layer.gate_up.is_empty()) bytes += module_bytes(*layer.gate_up);
  if (!layer.up_proj.is_empty()) bytes += module_bytes(*layer.up_proj);
  if (!layer.down_proj.is_empty()) bytes += module_bytes(*layer.down_proj);
  if (!layer.moe.is_empty()) {
    const auto& moe = *layer.moe;
    bytes += module_bytes(moe) - tensor_bytes(moe.router_weight) - tensor_bytes(moe.router_bias) -
             tensor_bytes(moe.score_correction_bias) - tensor_bytes(moe.shared_expert_gate_weight);
  }
  return bytes;
}

}  // namespace

void CausalLMImpl::reduce_data_parallel_grads() {
  if (!dp.enabled()) return;
  // The MLPs' and experts' parameters see every group's tokens: their gradients are whole;
  // every other's is summed once.
  std::set<const void*> whole;
  for (const auto& layer : layers) {
    const auto add = [&](const auto& holder) {
      if (holder.is_empty()) return;
      for (const auto& p : holder->parameters()) whole.insert(p.unsafeGetTensorImpl());
    };
    add(layer->gate_up);
    add(layer->up_proj);
    add(layer->down_proj);
    add(layer->moe);
  }
  at::NoGradGuard no_grad;
  for (auto& p : parameters()) {
    // A tied embedding is listed twice: summed once (insert reports it done).
    if (!p.requires_grad() || !whole.insert(p.unsafeGetTensorImpl()).second) continue;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    dp.replicas.all_reduce(p.mutable_grad());
  }
}

SplitPlan CausalLMImpl::split_plan() const {
  TORCH_CHECK_VALUE(!dp.enabled(),
                    "CausalLM::split_plan describes a tensor-parallel split; under attention data "
                    "parallelism (attention_data_parallel_size=",
                    dp.size, ") each group's attention is its own");
  SplitPlan plan = plan_model_split(config, comm.world_size(), static_cast<int64_t>(layers.size()),
                                    embed_tokens->partition().pad_to_multiple_of);
  int64_t split = module_bytes(*embed_tokens) + (config.tie_word_embeddings ? 0 : module_bytes(*lm_head));
  int64_t whole = module_bytes(*norm);
  for (const auto& layer : layers) {
    const int64_t cut = split_bytes_of(*layer);
    split += cut;
    whole += module_bytes(*layer) - cut;
  }
  const at::Tensor mine = at::tensor(std::vector<int64_t>{split, whole}, at::kLong).to(options.device());
  const at::Tensor all =
      comm.world_size() == 1 ? mine.cpu() : comm.all_gather(mine, 0, std::vector<int64_t>(comm.world_size(), 2)).cpu();
  for (int64_t r = 0; r < comm.world_size(); ++r) {
    plan.split_bytes[static_cast<size_t>(r)] = all[2 * r].item<int64_t>();
    plan.whole_bytes[static_cast<size_t>(r)] = all[2 * r + 1].item<int64_t>();
  }
  return plan;
}

void CausalLMImpl::load_weights(const Checkpoint& checkpoint) {
  const auto& n = config.names;
  embed_tokens->load_weights(checkpoint, n.embed);
  for (auto& layer : layers) layer->load_weights(checkpoint);
  detail::load_mirrored(checkpoint, n.final_norm + ".weight", norm->weight);
  if (norm->bias.defined()) detail::load_mirrored(checkpoint, n.final_norm + ".bias", norm->bias);
  if (!config.tie_word_embeddings) lm_head->load_weights(checkpoint, n.lm_head);
}

std::shared_ptr<CausalLMImpl> CausalLMImpl::from_pretrained(const std::string& folder, CausalLMOptions options,
                                                            Communicator comm) {
  const Checkpoint checkpoint = open_checkpoint(folder);
  auto config = ModelConfig::from_pretrained(folder);
  config.use_expert_layout_of(checkpoint);
  // The sizes against the tensors' headers before a byte is allocated: a config.json that
  // is not these tensors' fails here, on every rank, instead of after gigabytes.
  run_collectively(comm, "CausalLM::from_pretrained", [&] { config.check_sizes(checkpoint, options.num_layers()); });
  // Nothing is drawn at random: the load fills every tensor, and the session checks it did.
  auto model = std::make_shared<CausalLMImpl>(std::move(config), options.init_weights(false), std::move(comm));
  // Strict: every tensor of the folder is read, but those of the layers num_layers leaves
  // out and the layers the checkpoint keeps beyond the decoder (GLM's MTP layers).
  auto allow = LoadSessionOptions::default_allow_unread();
  const auto& c = model->config;
  for (auto i = static_cast<int64_t>(model->layers.size()); i < c.num_hidden_layers + c.extra_layers; ++i)
    allow.push_back(c.layer_prefix(i) + ".*");
  if (c.model_type == ModelType::kGptNeoX) {
    // Older GPT-NeoX files store the attention's constant buffers: the causal mask and its fill value.
    allow.push_back(c.names.layers + ".*.attention.bias");
    allow.push_back(c.names.layers + ".*.attention.masked_bias");
  }
  LoadSession session(checkpoint, model->comm, LoadSessionOptions().allow_unread(allow));
  session.expect_filled(*model);
  model->load_weights(session.checkpoint());
  session.finish();
  return model;
}

}  // namespace tp
