#include "bench_block.h"

namespace tp::bench {

Inputs make_inputs(const BlockShape& s, int64_t m, c10::ScalarType dtype, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed + 977 * static_cast<uint64_t>(m));
  Inputs in;
  in.hidden = at::randn({m, s.hidden}, gen, at::kFloat).to(dtype);
  in.attn = at::randn({m, s.heads * s.head_dim}, gen, at::kFloat).to(dtype);
  in.inter = at::randn({m, s.intermediate}, gen, at::kFloat).to(dtype);
  return in;
}

RankInputs rank_inputs(const Inputs& in, const Layers& l, c10::Device device) {
  const Range o = l.o->local_range(), d = l.down->local_range();
  return {in.hidden.to(device), in.attn.narrow(-1, o.begin, o.size()).contiguous().to(device),
          in.inter.narrow(-1, d.begin, d.size()).contiguous().to(device)};
}

at::Tensor forward(const std::string& row, Layers& l, const RankInputs& in) {
  if (row == "qkv") return l.qkv->forward(in.hidden);
  if (row == "o") return l.o->forward(in.attn);
  if (row == "gate_up") return l.gate_up->forward(in.hidden);
  if (row == "down") return l.down->forward(in.inter);
  const auto q = std::get<0>(l.qkv->split(l.qkv->forward(in.hidden)));
  const auto h = l.o->forward(q);
  const auto [gate, up] = l.gate_up->split(l.gate_up->forward(h));
  return l.down->forward(at::silu(gate) * up);
}

// This rank's part of a global output (column layers: its segments; the others: all).
at::Tensor rank_part(const std::string& row, const Layers& l, const BlockShape& s, const at::Tensor& y) {
  if (row == "qkv") {
    std::vector<at::Tensor> parts;
    for (const auto& p : l.qkv->head_plan().qkv_plan().pieces)
      parts.push_back(y.narrow(-1, p.fused_source().begin, p.size()));
    return at::cat(parts, -1);
  }
  if (row == "gate_up") {
    const Range r = l.gate_up->local_range();
    return at::cat({y.narrow(-1, r.begin, r.size()), y.narrow(-1, s.intermediate + r.begin, r.size())}, -1);
  }
  return y;
}

Reference make_reference(const BenchConfig& config, const std::string& format, c10::ScalarType dtype,
                         const Checkpoint& ckpt) {
  Reference ref;
  ref.quant = parse_quant_config(format);
  ref.quantized = ref.quant.format != QuantFormat::kNone;
  if (ref.quantized) {
    ref.layers = std::make_unique<Layers>(config.shape, ref.quant, dtype, config.device, Communicator{}, ckpt);
    ref.tq = read_layer(ckpt, kQ), ref.tk = read_layer(ckpt, kK), ref.tv = read_layer(ckpt, kV);
    ref.to = read_layer(ckpt, kO), ref.tg = read_layer(ckpt, kGate), ref.tu = read_layer(ckpt, kUp);
    ref.td = read_layer(ckpt, kDown);
    return ref;
  }
  auto w = [&](const std::string& prefix) { return ckpt.get(prefix + ".weight").read_all().to(config.device); };
  ref.w_q = w(kQ);
  ref.w_qkv = at::cat({ref.w_q, w(kK), w(kV)});
  ref.w_o = w(kO);
  ref.w_gate_up = at::cat({w(kGate), w(kUp)});
  ref.w_down = w(kDown);
  return ref;
}

}  // namespace tp::bench
