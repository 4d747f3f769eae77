// ReadLog and recording Checkpoint views: what a load consumed, per view, shared by
// nothing else; glob patterns of tensors that may stay unread.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include <thread>

#include "tp/loader/checkpoint.h"
#include "tp/loader/read_log.h"

using namespace tp;

TEST_CASE("glob patterns match whole names, '*' across dots, '?' one character", "[loader]") {
  CHECK(glob_match("*rotary_emb.inv_freq", "model.layers.0.self_attn.rotary_emb.inv_freq"));
  CHECK(glob_match("*rotary_emb.inv_freq", "rotary_emb.inv_freq"));
  CHECK(!glob_match("*rotary_emb.inv_freq", "model.layers.0.self_attn.rotary_emb.inv_freq.x"));
  CHECK(glob_match("model.layers.?.mlp.*", "model.layers.3.mlp.up_proj.weight"));
  CHECK(!glob_match("model.layers.?.mlp.*", "model.layers.13.mlp.up_proj.weight"));
  CHECK(glob_match("lm_head.weight", "lm_head.weight"));
  CHECK(!glob_match("lm_head.weight", "lm_head.weight2"));
  CHECK(!glob_match("lm_head.weight", "lm_head.weigh"));
  CHECK(glob_match("*", ""));
  CHECK(glob_match("**a**", "bab"));
  CHECK(!glob_match("", "a"));
  CHECK(glob_match("a*b*c", "a.x.b.y.c"));
  CHECK(!glob_match("a*b*c", "a.x.c.y.b"));
  CHECK(glob_match("*x", std::string(10000, 'a') + "x"));  // no exponential backtracking
  CHECK(!glob_match("*a*a*a*a*a*b", std::string(3000, 'a')));
}

TEST_CASE("a recording view shares the tensors and logs what get() hands out", "[loader]") {
  Checkpoint ckpt;
  ckpt.add("l.0.q.weight", at::ones({2, 2}));
  ckpt.add("l.0.q.bias", at::ones({2}));
  ckpt.add("l.0.q_norm.weight", at::ones({2}));
  ckpt.add("l.1.q.weight", at::ones({2, 2}));
  auto log = std::make_shared<ReadLog>(std::vector<std::string>{"*.bias"});
  const Checkpoint view = ckpt.recording(log);
  CHECK(view.size() == 4);
  CHECK(&view.get("l.0.q.weight") == &ckpt.get("l.0.q.weight"));  // the same source, not a copy
  CHECK(view.contains("l.0.q.bias"));                             // contains() reads nothing
  CHECK(log->read() == std::vector<std::string>{"l.0.q.weight"});
  CHECK(log->was_read("l.0.q.weight"));
  CHECK(!log->was_read("l.0.q.bias"));
  CHECK_THROWS(view.get("missing"));
  CHECK(log->read().size() == 1);  // a failed get records nothing
  // The original records nothing; a view of a view records into both logs.
  ckpt.get("l.1.q.weight");
  CHECK(log->read().size() == 1);
  auto inner = std::make_shared<ReadLog>();
  view.recording(inner).get("l.1.q.weight");
  CHECK(inner->read() == std::vector<std::string>{"l.1.q.weight"});
  CHECK(log->was_read("l.1.q.weight"));
  // Allow patterns travel with the view.
  CHECK(view.may_stay_unread("l.0.q.bias"));
  CHECK(!view.may_stay_unread("l.0.q_norm.weight"));
  CHECK(!ckpt.may_stay_unread("l.0.q.bias"));
  // Prefix queries see "l.0.q." but not "l.0.q_norm.".
  CHECK(ckpt.names_with_prefix("l.0.q.") == std::vector<std::string>{"l.0.q.bias", "l.0.q.weight"});
  CHECK(ckpt.names_with_prefix("l.2.").empty());
}

TEST_CASE("adding to a copy or a view of a checkpoint leaves the original as it was", "[loader]") {
  Checkpoint a;
  a.add("x", at::ones({1}));
  Checkpoint b = a;
  b.add("y", at::ones({1}));
  CHECK(a.size() == 1);
  CHECK(b.size() == 2);
  Checkpoint v = a.recording(std::make_shared<ReadLog>());
  v.add("z", at::ones({1}));
  CHECK(a.size() == 1);
  CHECK(v.size() == 2);
  CHECK_THROWS_WITH(v.add("x", at::ones({1})), Catch::Contains("already present"));
}

TEST_CASE("ranks as threads sharing one checkpoint each log only their own reads", "[loader]") {
  Checkpoint ckpt;
  for (int i = 0; i < 64; ++i) ckpt.add("t." + std::to_string(i), at::full({1}, i));
  constexpr int kRanks = 4;
  std::vector<std::shared_ptr<ReadLog>> logs;
  for (int r = 0; r < kRanks; ++r) logs.push_back(std::make_shared<ReadLog>());
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const Checkpoint view = ckpt.recording(logs[r]);
      for (int rep = 0; rep < 50; ++rep) {
        for (int i = r; i < 64; i += kRanks) view.get("t." + std::to_string(i)).read_all();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    const auto names = logs[r]->read();
    CHECK(names.size() == 64 / kRanks);
    for (const auto& n : names) CHECK(std::stoi(n.substr(2)) % kRanks == r);
  }
}
