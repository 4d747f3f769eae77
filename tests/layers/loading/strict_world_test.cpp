// Strict loading at every TP size from 1 to 4, for each of the four layers: a missing,
// mis-shaped, mis-typed (integer or FP8 codes in a float layer) or unconsumed checkpoint
// tensor is an error naming the layer, the tensor and the numbers, the same on every
// rank, within seconds (a long collective timeout shows that nobody waited for it).

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <chrono>

#include "support/test_util.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"

using namespace tp;
using Catch::Contains;

namespace {

constexpr double kPromptSeconds = 10.0;

// One layer kind: how to build it and load it, its checkpoint, and which tensor the
// defects are applied to (with its correct [n, k] shape).
struct LayerCase {
  std::string name;  // in every message
  std::function<void(Communicator&, const Checkpoint&)> build_and_load;
  std::map<std::string, at::Tensor> tensors;
  std::string target;  // the tensor a defect is applied to
  std::string prefix;  // its layer prefix (target = prefix + ".weight")
};

at::Tensor w(int64_t n, int64_t k, uint64_t seed) { return test::randn({n, k}, seed).to(at::kFloat); }

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> out;
  // Sizes chosen so that every TP size from 1 to 4 splits them (unevenly at 3).
  out.push_back({"ColumnParallelLinear",
                 [](Communicator& comm, const Checkpoint& c) {
                   ColumnParallelLinear fc(ColumnParallelLinearOptions(24, 20).bias(false), comm);
                   fc->load_weights(c, "fc");
                 },
                 {{"fc.weight", w(20, 24, 1)}},
                 "fc.weight",
                 "fc"});
  out.push_back({"RowParallelLinear",
                 [](Communicator& comm, const Checkpoint& c) {
                   RowParallelLinear o(RowParallelLinearOptions(20, 24).bias(false), comm);
                   o->load_weights(c, "o");
                 },
                 {{"o.weight", w(24, 20, 2)}},
                 "o.weight",
                 "o"});
  out.push_back({"QKVParallelLinear",
                 [](Communicator& comm, const Checkpoint& c) {
                   QKVParallelLinear qkv(QKVParallelLinearOptions(16, 4, 12, 12).bias(false), comm);
                   qkv->load_weights(c, "attn");
                 },
                 {{"attn.q_proj.weight", w(48, 16, 3)},
                  {"attn.k_proj.weight", w(48, 16, 4)},
                  {"attn.v_proj.weight", w(48, 16, 5)}},
                 "attn.k_proj.weight",
                 "attn.k_proj"});
  out.push_back({"GateUpParallelLinear",
                 [](Communicator& comm, const Checkpoint& c) {
                   GateUpParallelLinear mlp(GateUpParallelLinearOptions(16, 20).bias(false), comm);
                   mlp->load_weights(c, "mlp");
                 },
                 {{"mlp.gate_proj.weight", w(20, 16, 6)}, {"mlp.up_proj.weight", w(20, 16, 7)}},
                 "mlp.up_proj.weight",
                 "mlp.up_proj"});
  return out;
}

struct Defect {
  std::string what;
  // Changes the tensors; returns the substrings the error must contain.
  std::function<std::vector<std::string>(std::map<std::string, at::Tensor>&, const LayerCase&)> apply;
  std::string type;  // "ValueError" or "TypeError"
};

std::string shape_text(at::IntArrayRef s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

std::vector<Defect> defects() {
  return {
      {"a missing tensor",
       [](auto& t, const LayerCase& c) -> std::vector<std::string> {
         t.erase(c.target);
         return {"no tensor '" + c.target + "'"};
       },
       "ValueError"},
      {"a tensor with one row too many",
       [](auto& t, const LayerCase& c) -> std::vector<std::string> {
         const auto good = t.at(c.target);
         t[c.target] = at::cat({good, good.narrow(0, 0, 1)});
         return {"'" + c.target + "' has shape " + shape_text(t[c.target].sizes()),
                 "expected " + shape_text(good.sizes())};
       },
       "ValueError"},
      {"a tensor with one column too few",
       [](auto& t, const LayerCase& c) -> std::vector<std::string> {
         const auto good = t.at(c.target);
         t[c.target] = good.narrow(1, 0, good.size(1) - 1).contiguous();
         return {"'" + c.target + "' has shape " + shape_text(t[c.target].sizes()),
                 "expected " + shape_text(good.sizes())};
       },
       "ValueError"},
      {"integer codes in a float layer",
       [](auto& t, const LayerCase& c) -> std::vector<std::string> {
         t[c.target] = t.at(c.target).mul(16).to(at::kChar);
         return {"'" + c.target + "' has dtype Char", "quant format is none", "int8_w8a8"};
       },
       "ValueError"},
      {"FP8 codes in a float layer",
       [](auto& t, const LayerCase& c) -> std::vector<std::string> {
         t[c.target] = t.at(c.target).to(at::kFloat8_e4m3fn);
         return {"'" + c.target + "' has dtype Float8_e4m3fn", "quant format is none", "quant=fp8_"};
       },
       "ValueError"},
      {"a scale the layer would leave unread",
       [](auto& t, const LayerCase& c) -> std::vector<std::string> {
         const std::string name = c.prefix + ".weight_scale";
         t[name] = at::ones({t.at(c.target).size(0), 1});
         return {"'" + name + "' would be ignored", "quant format is none"};
       },
       "ValueError"},
      {"a bias for a layer built without one",
       [](auto& t, const LayerCase& c) -> std::vector<std::string> {
         const std::string name = c.prefix + ".bias";
         t[name] = at::ones({t.at(c.target).size(0)});
         return {"'" + name + "' would be ignored", "bias=false", "bias=true"};
       },
       "ValueError"},
  };
}

}  // namespace

TEST_CASE("every layer refuses a missing, mis-shaped, mis-typed or unconsumed tensor at TP 1 to 4, on every rank",
          "[layers][loader][comm]") {
  for (const auto& layer : layer_cases()) {
    for (const auto& defect : defects()) {
      auto tensors = layer.tensors;
      auto expect = defect.apply(tensors, layer);
      expect.push_back(layer.name);
      Checkpoint ckpt;
      for (const auto& [name, t] : tensors) ckpt.add(name, t);
      for (int64_t world = 1; world <= 4; ++world) {
        INFO(layer.name << ", " << defect.what << ", world " << world);
        std::vector<std::string> errors(world), types(world);
        std::vector<double> seconds(world);
        CommunicatorOptions options;
        options.timeout = std::chrono::seconds(300);
        run_ranks_in_threads(
            world,
            [&](Communicator& comm) {
              const auto r = comm.rank();
              const auto start = std::chrono::steady_clock::now();
              try {
                layer.build_and_load(comm, ckpt);
              } catch (const c10::ValueError& e) {
                errors[r] = e.what_without_backtrace();
                types[r] = "ValueError";
              } catch (const c10::TypeError& e) {
                errors[r] = e.what_without_backtrace();
                types[r] = "TypeError";
              } catch (const c10::Error& e) {
                errors[r] = e.what_without_backtrace();
                types[r] = "Error";
              }
              seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            },
            options);
        for (int64_t r = 0; r < world; ++r) {
          INFO("rank " << r << " (" << types[r] << ", " << seconds[r] << " s): " << errors[r]);
          CHECK(types[r] == defect.type);
          for (const auto& e : expect) CHECK_THAT(errors[r], Contains(e));
          if (world > 1) {
            CHECK_THAT(errors[r], Contains("load_weights failed on every rank (" + std::to_string(world) + " of " +
                                           std::to_string(world) + ")"));
          }
          CHECK(errors[r] == errors[0]);
          CHECK(seconds[r] < kPromptSeconds);
        }
      }
    }
    // The good checkpoint loads at every TP size, each rank its slice.
    Checkpoint good;
    for (const auto& [name, t] : layer.tensors) good.add(name, t);
    for (int64_t world = 1; world <= 4; ++world) {
      INFO(layer.name << ", the good checkpoint, world " << world);
      run_ranks_in_threads(
          world, [&](Communicator& comm) { layer.build_and_load(comm, good); }, test::test_comm_options());
    }
  }
}
