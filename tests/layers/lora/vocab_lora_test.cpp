// LoRA adapters on the vocabulary layers at TP 1-4 (ranks as threads over Gloo), in float64,
// against a single-device reference from the same global tensors, as PEFT computes them:
//   embedding  y = W[ids] + scaling A^T[ids] B^T     A [r, vocab] (lora_embedding_A), B [dim, r]
//   LM head    y = x W^T + scaling (x A^T) B^T       A [r, hidden], B [vocab, r]
// Forward, and the gradients of every A and B (and the head's input) within 1e-10, with the
// vocabulary padded and split unevenly or by weights (a rank with no rows at all), a batch
// whose rows take different adapters, sequence parallelism on the embedding; gather gives
// the global tensors back, and a merged adapter equals the adapter path.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <sstream>
#include <vector>

#include "support/test_util.h"
#include "tp/tp.h"

using namespace tp;
using tp::test::randn;

namespace {

constexpr double kTol = 1e-10;

struct VocabCase {
  int64_t world = 1, vocab = 0, dim = 0, pad = 1, tokens = 0;
  std::vector<double> weights;
  bool sequence_parallel = false;
  at::Tensor w;  // [vocab, dim]: the table, or the head's weight
  struct Adapter {
    std::string name;
    LoRAConfig config;
    at::Tensor A, B;  // embedding: [r, vocab], [dim, r]; head: [r, dim], [vocab, r]
  };
  std::vector<Adapter> adapters;
};

VocabCase make_case(bool head, int64_t world, uint64_t seed) {
  VocabCase c;
  c.world = world;
  c.vocab = test::randint(world + 1, 23, seed);
  c.dim = test::randint(2, 9, seed + 1);
  c.tokens = test::randint(2, 6, seed + 2);
  c.pad = seed % 3 == 0 ? 4 : 1;
  if (world > 2 && seed % 2 == 1) c.weights = {2.0, 1.0, 0.0, 1.0, 1.0};  // rank 2 holds no row
  c.weights.resize(c.weights.empty() ? 0 : static_cast<size_t>(world));
  c.w = randn({c.vocab, c.dim}, seed + 3);
  for (int i = 0; i < 2; ++i) {
    VocabCase::Adapter a;
    a.name = i == 0 ? "a" : "b";
    a.config = i == 0 ? LoRAConfig().rank(3).alpha(6.0) : LoRAConfig().rank(2).alpha(3.0).use_rslora(true);
    const int64_t r = a.config.rank();
    a.A = randn(head ? std::vector<int64_t>{r, c.dim} : std::vector<int64_t>{r, c.vocab}, seed + 10 + 5 * i);
    a.B = randn(head ? std::vector<int64_t>{c.vocab, r} : std::vector<int64_t>{c.dim, r}, seed + 11 + 5 * i);
    c.adapters.push_back(a);
  }
  return c;
}

const char* a_suffix(bool head) { return head ? ".lora_A.weight" : ".lora_embedding_A"; }
const char* b_suffix(bool head) { return head ? ".lora_B.weight" : ".lora_embedding_B"; }

Checkpoint checkpoint_of(const VocabCase& c, bool head) {
  Checkpoint ckpt;
  ckpt.add("t.weight", c.w);
  for (const auto& a : c.adapters) {
    ckpt.add(a.name + ".t" + a_suffix(head), a.A);
    ckpt.add(a.name + ".t" + b_suffix(head), a.B);
  }
  return ckpt;
}

// Per row of the batch: the base plus that row's adapter (PEFT's arithmetic).
at::Tensor reference(const VocabCase& c, bool head, const at::Tensor& in, const std::vector<std::string>& rows) {
  const at::Tensor y = head ? at::linear(in, c.w) : at::embedding(c.w, in);
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < in.size(0); ++i) {
    at::Tensor yi = y.select(0, i);
    for (const auto& a : c.adapters) {
      if (a.name != rows[i]) continue;
      const at::Tensor h = head ? at::matmul(in.select(0, i), a.A.t()) : at::embedding(a.A.t(), in.select(0, i));
      yi = yi + at::matmul(h, a.B.t()) * a.config.scaling();
    }
    out.push_back(yi);
  }
  return at::stack(out, 0);
}

struct RankOut {
  at::Tensor y, gx;
  std::vector<at::Tensor> gA, gB;
  Range rows, real;  // the padded rows and the real tokens this rank holds
  std::map<std::string, at::Tensor> gathered;
  at::Tensor merged_y;  // the forward after merge_adapter("a"), selection "a" everywhere
};

template <class Layer>
void run_layer(Layer& layer, const VocabCase& c, bool head, const Checkpoint& ckpt, const at::Tensor& in,
               const at::Tensor& g, const std::vector<std::string>& rows, RankOut& out) {
  layer->load_weights(ckpt, "t");
  for (const auto& a : c.adapters) layer->lora().load(ckpt, a.name, a.config, {a.name + ".t"});
  layer->lora().selection().select_rows(rows);
  const at::Tensor x = head ? in.clone().requires_grad_(true) : in;
  at::Tensor y = layer->forward(x);
  (head ? y.narrow(-1, 0, out.real.size()) : y).mul(g).sum().backward();
  out.y = y.detach();
  if (head) out.gx = x.grad();
  const std::string segment = head ? "linear" : "embedding";
  for (const auto& a : c.adapters) {
    out.gA.push_back(layer->lora().lora_A(a.name, segment).grad());
    out.gB.push_back(layer->lora().lora_B(a.name, segment).grad());
  }
  out.gathered = layer->lora().gather("a", {"a.t"});
  at::NoGradGuard no_grad;
  layer->lora().merge_into("a", layer->weight);
  layer->lora().selection().select("a");
  out.merged_y = layer->forward(in);
}

void run_vocab_case(const VocabCase& c, bool head, const std::vector<std::string>& rows, uint64_t seed) {
  std::ostringstream what;
  what << (head ? "head" : "embedding") << " world=" << c.world << " vocab=" << c.vocab << " dim=" << c.dim
       << " pad=" << c.pad << " weights=" << c.weights.size() << " sp=" << c.sequence_parallel
       << " rows=" << c10::Join(",", rows);
  INFO(what.str());
  const int64_t batch = static_cast<int64_t>(rows.size());
  const at::Tensor in = head ? randn({batch, c.tokens, c.dim}, seed + 100)
                             : at::arange(batch * c.tokens)
                                   .mul(7)
                                   .add(static_cast<int64_t>(seed))
                                   .remainder(c.vocab)
                                   .view({batch, c.tokens});
  const at::Tensor G = randn({batch, c.tokens, head ? c.vocab : c.dim}, seed + 101);
  const Checkpoint ckpt = checkpoint_of(c, head);
  std::vector<RankOut> outs(c.world);
  run_ranks_in_threads(
      c.world,
      [&](Communicator& comm) {
        RankOut out;
        if (head) {
          ParallelLMHead l(ParallelLMHeadOptions(c.dim, c.vocab)
                               .pad_to_multiple_of(c.pad)
                               .split_weights(c.weights)
                               .dtype(at::kDouble),
                           comm);
          out.rows = l->local_range();
          out.real = l->vocab_range();
          run_layer(l, c, head, ckpt, in, G.narrow(-1, out.real.begin, out.real.size()), rows, out);
        } else {
          VocabParallelEmbedding l(VocabParallelEmbeddingOptions(c.vocab, c.dim)
                                       .pad_to_multiple_of(c.pad)
                                       .split_weights(c.weights)
                                       .sequence_parallel(c.sequence_parallel)
                                       .dtype(at::kDouble),
                                   comm);
          out.rows = l->local_range();
          out.real = l->vocab_range();
          const Range mine = c.sequence_parallel ? sequence_ranges(batch, c.world)[comm.rank()] : Range{0, batch};
          run_layer(l, c, head, ckpt, in, G.narrow(0, mine.begin, mine.size()), rows, out);
        }
        outs[comm.rank()] = std::move(out);
      },
      test::test_comm_options());

  VocabCase ref = c;
  for (auto& a : ref.adapters) {
    a.A = a.A.clone().requires_grad_(true);
    a.B = a.B.clone().requires_grad_(true);
  }
  const at::Tensor x = head ? in.clone().requires_grad_(true) : in;
  const at::Tensor y = reference(ref, head, x, rows);
  (y * G).sum().backward();
  VocabCase merged = c;
  merged.adapters.resize(1);
  const at::Tensor merged_ref = reference(merged, head, in, std::vector<std::string>(rows.size(), "a"));
  const auto err = [](const at::Tensor& a, const at::Tensor& b) { return test::relative_error(a, b); };
  for (int64_t r = 0; r < c.world; ++r) {
    INFO("rank " << r);
    const auto& o = outs[r];
    const Range mine = c.sequence_parallel ? sequence_ranges(batch, c.world)[r] : Range{0, batch};
    const auto local = [&](const at::Tensor& t) {
      // The head's local logits: the real columns, then -inf on the padding columns. The
      // embedding's output: whole, or this rank's rows under sequence parallelism already.
      return head ? t.narrow(-1, 0, o.real.size()) : t;
    };
    const at::Tensor want = head ? y.detach().narrow(-1, o.real.begin, o.real.size()) : y.detach();
    CHECK(err(local(o.y), head ? want : want.narrow(0, mine.begin, mine.size())) <= kTol);
    if (head && o.rows.size() > o.real.size())
      CHECK(o.y.narrow(-1, o.real.size(), o.rows.size() - o.real.size()).isneginf().all().item<bool>());
    if (head) CHECK(err(o.gx, x.grad()) <= kTol);
    for (size_t i = 0; i < ref.adapters.size(); ++i) {
      const auto& a = ref.adapters[i];
      INFO("adapter " << a.name);
      const bool used = std::find(rows.begin(), rows.end(), a.name) != rows.end();
      REQUIRE(o.gA[i].defined() == used);
      if (!used) continue;
      if (head) {
        CHECK(err(o.gA[i], a.A.grad()) <= kTol);
        CHECK(err(o.gB[i], a.B.grad().narrow(0, o.real.begin, o.real.size())) <= kTol);
      } else {
        const int64_t offset = o.real.empty() ? 0 : o.real.begin - o.rows.begin;
        CHECK(err(o.gA[i].narrow(1, offset, o.real.size()), a.A.grad().narrow(1, o.real.begin, o.real.size())) <= kTol);
        // The padding columns: no gradient.
        at::Tensor padding = o.gA[i].clone();
        padding.narrow(1, offset, o.real.size()).zero_();
        CHECK(padding.count_nonzero().item<int64_t>() == 0);
        CHECK(err(o.gB[i], a.B.grad()) <= kTol);
      }
    }
    CHECK(at::equal(o.gathered.at(std::string("a.t") + a_suffix(head)), c.adapters[0].A));
    CHECK(at::equal(o.gathered.at(std::string("a.t") + b_suffix(head)), c.adapters[0].B));
    const at::Tensor merged_want = head ? merged_ref.narrow(-1, o.real.begin, o.real.size()) : merged_ref;
    CHECK(err(local(o.merged_y), head ? merged_want : merged_want.narrow(0, mine.begin, mine.size())) <= kTol);
  }
}

}  // namespace

TEST_CASE(
    "LoRA on the vocabulary layers: embedding and LM head adapters, cut with the padded, uneven or weighted "
    "vocabulary, equal PEFT's arithmetic forward and backward at TP 1-4",
    "[layers][lora]") {
  uint64_t seed = 9100;
  for (int64_t world = 1; world <= 4; ++world) {
    for (bool head : {false, true}) {
      for (int round = 0; round < 2; ++round, seed += 37) {
        const VocabCase c = make_case(head, world, seed);
        run_vocab_case(c, head, {"a", "a"}, seed);
        run_vocab_case(c, head, {"b", "", "a"}, seed + 1);
      }
    }
    VocabCase sp = make_case(/*head=*/false, world, seed);
    sp.sequence_parallel = true;
    run_vocab_case(sp, /*head=*/false, {"a", "a", "a", "a", "a"}, seed);
  }
}

TEST_CASE("LoRA on the vocabulary layers: add draws PEFT's initialisation, the same on every rank", "[layers][lora]") {
  // PEFT: an embedding's A zeros and B N(0, 1); a linear layer's (the head's) A uniform, B zeros.
  std::vector<std::map<std::string, at::Tensor>> emb(3), head(3);
  std::vector<at::Tensor> emb_out(3), base_out(3);
  run_ranks_in_threads(
      3,
      [&](Communicator& comm) {
        VocabParallelEmbedding e(VocabParallelEmbeddingOptions(11, 4).pad_to_multiple_of(2).dtype(at::kDouble), comm);
        ParallelLMHead h(ParallelLMHeadOptions(4, 11).pad_to_multiple_of(2).dtype(at::kDouble), comm);
        const at::Tensor ids = at::arange(11).view({1, 11});
        base_out[comm.rank()] = e->forward(ids);
        e->lora().add("x", LoRAConfig().rank(2));
        h->lora().add("x", LoRAConfig().rank(2));
        e->lora().selection().select("x");
        emb_out[comm.rank()] = e->forward(ids);
        emb[comm.rank()] = e->lora().gather("x", {"e"});
        head[comm.rank()] = h->lora().gather("x", {"h"});
      },
      test::test_comm_options());
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(emb[r].at("e.lora_embedding_A").abs().sum().item<double>() == 0.0);
    CHECK(emb[r].at("e.lora_embedding_B").std().item<double>() > 0.05);
    CHECK(at::equal(emb[r].at("e.lora_embedding_B"), emb[0].at("e.lora_embedding_B")));
    CHECK(head[r].at("h.lora_B.weight").abs().sum().item<double>() == 0.0);
    CHECK(head[r].at("h.lora_A.weight").abs().max().item<double>() <= 0.5);  // U(-1/sqrt(4), 1/sqrt(4))
    CHECK(at::equal(head[r].at("h.lora_A.weight"), head[0].at("h.lora_A.weight")));
    CHECK(at::equal(emb_out[r], base_out[r]));  // A zeros: the output unchanged
  }
}
