// load_shard's rules, each with a test that fails if the rule is broken.

#include "support/tp_catch.h"

#include <ATen/ATen.h>

#include "support/test_util.h"
#include "tp/loader/checkpoint.h"
#include "tp/loader/load_shard.h"

using namespace tp;
using Catch::Contains;

namespace {
// [rows, cols] with element (i, j) = 1000 i + j, so a slice says where it came from.
at::Tensor labelled(int64_t rows, int64_t cols) {
  return (at::arange(rows, at::kDouble).unsqueeze(1) * 1000 + at::arange(cols, at::kDouble)).to(at::kFloat);
}
}  // namespace

TEST_CASE("COLUMN splits dim 0 and ROW splits dim 1", "[loader]") {
  InMemorySource w("w", labelled(8, 6));
  const auto col = load_shard(w, ShardMode::kColumn, {2, 5});
  CHECK(at::equal(col, labelled(8, 6).narrow(0, 2, 3)));
  const auto row = load_shard(w, ShardMode::kRow, {4, 6});
  CHECK(at::equal(row, labelled(8, 6).narrow(1, 4, 2)));
  CHECK(row.is_contiguous());
}

TEST_CASE("flip_tp swaps the split dimension", "[loader]") {
  // Input-activation scales follow the input dimension, which for them is stored
  // in dim 0: with flip_tp a ROW layer splits dim 0 and a COLUMN layer dim 1.
  InMemorySource s("input_scale", labelled(8, 3));
  LoadOptions flip;
  flip.flip_tp = true;
  CHECK(at::equal(load_shard(s, ShardMode::kRow, {2, 4}, flip), labelled(8, 3).narrow(0, 2, 2)));
  CHECK(at::equal(load_shard(s, ShardMode::kColumn, {1, 3}, flip), labelled(8, 3).narrow(1, 1, 2)));
}

TEST_CASE("a split dimension of width 1, and 0-d tensors, are not split", "[loader]") {
  InMemorySource per_channel_col("s", labelled(8, 1));  // [out, 1]: split in COLUMN, kept in ROW
  CHECK(at::equal(load_shard(per_channel_col, ShardMode::kRow, {2, 4}), labelled(8, 1)));
  CHECK(at::equal(load_shard(per_channel_col, ShardMode::kColumn, {2, 4}), labelled(8, 1).narrow(0, 2, 2)));
  InMemorySource per_tensor("t", at::full({1, 1}, 3.5f));
  CHECK(at::equal(load_shard(per_tensor, ShardMode::kColumn, {5, 9}), at::full({1, 1}, 3.5f)));
  InMemorySource scalar("u", at::scalar_tensor(2.0f));
  const auto got = load_shard(scalar, ShardMode::kRow, {5, 9});
  CHECK(got.dim() == 0);
  CHECK(got.item<float>() == 2.0f);
}

TEST_CASE("a 1-D tensor is sliced along dim 0 and returned whole along dim 1", "[loader]") {
  const auto b = at::arange(10, at::kFloat);
  InMemorySource bias("bias", b);
  CHECK(at::equal(load_shard(bias, ShardMode::kColumn, {3, 7}), b.narrow(0, 3, 4)));
  CHECK(at::equal(load_shard(bias, ShardMode::kRow, {3, 7}), b));  // row-parallel bias is replicated
}

TEST_CASE("scale_span divides the range, and must divide it exactly", "[loader]") {
  // 128x128 block scales of a [512, 384] weight: [4, 3].
  InMemorySource scales("weight_scale_inv", labelled(4, 3));
  LoadOptions block;
  block.scale_span = 128;
  CHECK(at::equal(load_shard(scales, ShardMode::kColumn, {128, 384}, block), labelled(4, 3).narrow(0, 1, 2)));
  CHECK(at::equal(load_shard(scales, ShardMode::kRow, {256, 384}, block), labelled(4, 3).narrow(1, 2, 1)));
  REQUIRE_THROWS_WITH(load_shard(scales, ShardMode::kColumn, {64, 256}, block),
                      Contains("'weight_scale_inv'") && Contains("[64,256)") && Contains("scale_span=128"));
  // A partial last block is allowed only where the range ends at the logical end.
  InMemorySource tail("tail_scale", labelled(3, 1));  // logical 300 rows: blocks 128,128,44
  LoadOptions partial = block;
  partial.logical_size = 300;
  CHECK(at::equal(load_shard(tail, ShardMode::kColumn, {256, 300}, partial), labelled(3, 1).narrow(0, 2, 1)));
  REQUIRE_THROWS_WITH(load_shard(tail, ShardMode::kColumn, {128, 260}, partial), Contains("[128,260)"));
}

TEST_CASE("elm_packing divides the range, and must divide it exactly", "[loader]") {
  // int4 packed 8 per int32 along dim 1 (GPTQ packs along K): logical [16, 64] -> stored [16, 8].
  InMemorySource packed("qweight", labelled(16, 8));
  LoadOptions pack;
  pack.elm_packing = 8;
  CHECK(at::equal(load_shard(packed, ShardMode::kRow, {16, 48}, pack), labelled(16, 8).narrow(1, 2, 4)));
  REQUIRE_THROWS_WITH(load_shard(packed, ShardMode::kRow, {4, 48}, pack),
                      Contains("'qweight'") && Contains("elm_packing=8"));
}

TEST_CASE("load_shard over a fused tensor reads each segment's piece", "[loader]") {
  // A fused [Q|K|V] weight with Q 8 rows, K and V 4 rows each: rank 1 of 2.
  const auto fused = labelled(16, 5);
  InMemorySource qkv("qkv_proj.weight", fused);
  const auto plan = make_segment_plan({{"q", 8}, {"k", 4}, {"v", 4}}, {{4, 8}, {2, 4}, {2, 4}});
  const auto got = load_shard(qkv, ShardMode::kColumn, plan);
  const auto expected = at::cat({fused.narrow(0, 4, 4), fused.narrow(0, 10, 2), fused.narrow(0, 14, 2)}, 0);
  CHECK(at::equal(got, expected));
  InMemorySource wrong("qkv_proj.weight", labelled(15, 5));
  REQUIRE_THROWS_WITH(load_shard(wrong, ShardMode::kColumn, plan),
                      Contains("'qkv_proj.weight'") && Contains("15") && Contains("16"));
}

TEST_CASE("reads outside the tensor are errors naming it", "[loader]") {
  InMemorySource w("model.w", labelled(8, 6));
  REQUIRE_THROWS_WITH(load_shard(w, ShardMode::kColumn, {6, 10}), Contains("'model.w'") && Contains("[6,10)"));
  REQUIRE_THROWS_WITH(w.read(2, {0, 1}), Contains("invalid dim 2"));
  Checkpoint ckpt;
  ckpt.add("a.weight", labelled(2, 2));
  REQUIRE_THROWS_WITH(ckpt.add("a.weight", labelled(2, 2)), Contains("already present"));
  REQUIRE_THROWS_WITH(ckpt.get("a.bias", "Layer"), Contains("Layer: checkpoint has no tensor 'a.bias'"));
}

TEST_CASE("a slice owns its memory and copies only the slice", "[loader]") {
  auto big = labelled(64, 16);
  InMemorySource src("w", big);
  const auto slice = src.read(0, {8, 16});
  CHECK(slice.numel() == 8 * 16);
  CHECK(slice.storage().nbytes() == 8 * 16 * sizeof(float));
  big.zero_();
  CHECK(slice.sum().item<double>() != 0.0);  // not a view of `big`
}
