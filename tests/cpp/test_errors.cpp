// tests/cpp/test_errors.cpp — every rejected input gets an mhsa::Error naming the argument, what
// was expected and what was given; nothing crashes, and a failed call changes nothing.
#include "test_util.h"

namespace mhsa::test {
namespace {

struct Inputs {
  Tensor q{{2, 4, 5, 8}}, k{{2, 2, 7, 8}}, v{{2, 2, 7, 6}}, out{{2, 4, 5, 6}}, lse{{2, 4, 5}};
  void run(const AttentionOptions& opt = {}) {
    scaled_dot_product_attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view());
  }
};

TEST(Errors, QueryNotFourDimensional) {
  Inputs in;
  const Tensor q3({2, 5, 8});
  expect_error([&] { scaled_dot_product_attention(q3.view(), in.k.view(), in.v.view(), in.out.view()); },
               {"scaled_dot_product_attention: q: expected a 4-D tensor [B, Hq, Tq, D]", "got 3-D [2, 5, 8]"});
}

TEST(Errors, BatchMismatch) {
  Inputs in;
  in.k = Tensor({3, 2, 7, 8});
  expect_error([&] { in.run(); }, {"k.shape[0]: expected 2 (B, as q.shape[0]), got 3"});
}

TEST(Errors, QueryHeadsNotMultipleOfKeyHeads) {
  Inputs in;
  in.k = Tensor({2, 3, 7, 8});
  in.v = Tensor({2, 3, 7, 6});
  expect_error([&] { in.run(); }, {"k.shape[1]: expected Hkv dividing Hq = q.shape[1] = 4", "got 3"});
}

TEST(Errors, HeadSizesDiffer) {
  Inputs in;
  in.k = Tensor({2, 2, 7, 9});
  expect_error([&] { in.run(); }, {"k.shape[3]: expected 8 (head size D, as q.shape[3]), got 9"});
}

TEST(Errors, ValueLengthDiffersFromKeys) {
  Inputs in;
  in.v = Tensor({2, 2, 6, 6});
  expect_error([&] { in.run(); }, {"v.shape[2]: expected 7 (Tk, as k.shape[2]), got 6"});
}

TEST(Errors, OutputShapeWrong) {
  Inputs in;
  in.out = Tensor({2, 4, 5, 8});
  expect_error([&] { in.run(); }, {"out: expected shape [2, 4, 5, 6], got [2, 4, 5, 8]"});
}

TEST(Errors, OutputOverlapsItself) {
  Inputs in;
  const TensorView aliased(in.out.data(), {2, 4, 5, 6}, {0, 30, 6, 1});
  expect_error([&] { scaled_dot_product_attention(in.q.view(), in.k.view(), in.v.view(), aliased); },
               {"out: expected strides that do not overlap", "strides [0, 30, 6, 1]"});
}

TEST(Errors, LseShapeWrong) {
  Inputs in;
  in.lse = Tensor({2, 4, 6});
  expect_error([&] { in.run(); }, {"lse: expected shape [2, 4, 5], got [2, 4, 6]"});
}

TEST(Errors, NullDataWithElements) {
  Inputs in;
  const ConstTensorView null_k(nullptr, {2, 2, 7, 8});
  expect_error([&] { scaled_dot_product_attention(in.q.view(), null_k, in.v.view(), in.out.view()); },
               {"k: expected data for [2, 2, 7, 8], got a null pointer"});
}

TEST(Errors, ScaleNotFinite) {
  Inputs in;
  AttentionOptions opt;
  opt.scale = NAN;
  expect_error([&] { in.run(opt); }, {"scale: expected a finite number > 0, got nan"});
  opt.scale = INFINITY;
  expect_error([&] { in.run(opt); }, {"scale: expected a finite number > 0, got inf"});
}

TEST(Errors, ScaleNotPositive) {
  Inputs in;
  AttentionOptions opt;
  opt.scale = 0.0f;
  expect_error([&] { in.run(opt); }, {"scale: expected a finite number > 0, got 0"});
  opt.scale = -0.5f;
  expect_error([&] { in.run(opt); }, {"scale: expected a finite number > 0, got -0.5"});
}

TEST(Errors, KeyLengthNegative) {
  Inputs in;
  const std::vector<int64_t> lengths = {7, -1};
  AttentionOptions opt;
  opt.kv_lengths = lengths;
  expect_error([&] { in.run(opt); }, {"kv_lengths[1]: expected a length in [0, Tk = 7], got -1"});
}

TEST(Errors, KeyLengthBeyondKeys) {
  Inputs in;
  const std::vector<int64_t> lengths = {8, 3};
  AttentionOptions opt;
  opt.kv_lengths = lengths;
  expect_error([&] { in.run(opt); }, {"kv_lengths[0]: expected a length in [0, Tk = 7], got 8"});
}

TEST(Errors, KeyLengthsCountWrong) {
  Inputs in;
  const std::vector<int64_t> lengths = {7, 7, 7};
  AttentionOptions opt;
  opt.kv_lengths = lengths;
  expect_error([&] { in.run(opt); }, {"kv_lengths: expected 2 entries (one per batch, B = q.shape[0]), got 3 entries"});
}

TEST(Errors, MaskNotBroadcastable) {
  Inputs in;
  AttentionOptions opt;
  const Tensor wrong_tk({5, 6}), wrong_batch({3, 1, 5, 7}), five_d({1});
  opt.attn_mask = wrong_tk.view();
  expect_error([&] { in.run(opt); }, {"attn_mask: expected a shape broadcastable to [B=2, Hq=4, Tq=5, Tk=7]", "got [5, 6]"});
  opt.attn_mask = wrong_batch.view();
  expect_error([&] { in.run(opt); }, {"attn_mask: expected a shape broadcastable", "got [3, 1, 5, 7]"});
  opt.attn_mask = five_d.view();
  expect_error([&] { in.run(opt); }, {"attn_mask: expected a shape broadcastable", "got [1]"});
}

TEST(Errors, MaskHoldsNaNOrPlusInfinity) {
  Inputs in;
  Tensor mask({5, 7});
  mask.data()[9] = NAN;
  AttentionOptions opt;
  opt.attn_mask = mask.view();
  expect_error([&] { in.run(opt); }, {"attn_mask: expected finite values or -inf, got nan at broadcast index [b, h, i, j] = [0, 0, 1, 2]"});
  mask.data()[9] = INFINITY;
  expect_error([&] { in.run(opt); }, {"attn_mask: expected finite values or -inf, got inf"});
}

TEST(Errors, ProbabilitiesHeadOutOfRange) {
  Inputs in;
  const std::vector<int64_t> heads = {0, 4};
  expect_error([&] { attention_probabilities(in.q.view(), in.k.view(), ConstTensorView{}, {}, heads); },
               {"attention_probabilities: heads[1]: expected a query head in [0, Hq = 4), got 4"});
}

TEST(Errors, ProbabilitiesLseShapeWrong) {
  Inputs in;
  const Tensor lse({2, 4, 4});
  expect_error([&] { attention_probabilities(in.q.view(), in.k.view(), lse.view()); },
               {"attention_probabilities: lse.shape[2]: expected 5 (Tq, as q.shape[2]), got 4"});
}

TEST(Errors, CacheOverflowChangesNothing) {
  MultiHeadAttention m(16, 4);
  KVCache cache = m.new_cache(1, 4);
  const Tensor x({1, 3, 16});
  m.step(x.view(), cache);
  expect_error([&] { m.step(x.view(), cache); },
               {"x.shape[1]: expected at most 1 new tokens (capacity 4, holding 3), got 3 new tokens"});
  EXPECT_EQ(cache.length(), 3);
}

TEST(Errors, CacheAppendShapeWrong) {
  KVCache cache(1, 2, 8, 4, 4);
  const Tensor k({1, 2, 3, 5}), v({1, 2, 3, 4});
  expect_error([&] { cache.append(k.view(), v.view()); },
               {"KVCache::append: k.shape[3]: expected 4 (the cache's head size), got 5"});
  EXPECT_EQ(cache.length(), 0);
}

TEST(Errors, CacheFromAnotherLayer) {
  MultiHeadAttention m(16, 4), other(16, 2);
  KVCache cache = other.new_cache(1, 4);
  const Tensor x({1, 1, 16});
  expect_error([&] { m.step(x.view(), cache); }, {"MultiHeadAttention::step: cache: expected 4 kv heads of size 4", "got 2 kv heads of size 8"});
}

TEST(Errors, LayerInputChannelsWrong) {
  MultiHeadAttention m(16, 4);
  const Tensor x({1, 3, 12});
  expect_error([&] { m.forward(x.view()); }, {"MultiHeadAttention::forward: x.shape[2]: expected 16 (C, the layer's embed_dim), got 12"});
}

TEST(Errors, MemoryBatchWrong) {
  MultiHeadAttention m(16, 4);
  const Tensor x({2, 3, 16}), memory({1, 5, 16});
  const KVCache kv = m.project_memory(memory.view());
  expect_error([&] { m.forward(x.view(), kv); }, {"memory: expected batch 2 (as x), got batch 1"});
}

TEST(Errors, LayerShapeInvalid) {
  expect_error([] { MultiHeadAttention(10, 3); }, {"MultiHeadAttention: num_heads: expected a count > 0 dividing embed_dim = 10, got 3"});
  expect_error([] { MultiHeadAttention(12, 4, 3); }, {"num_kv_heads: expected a count > 0 dividing num_heads = 4, got 3"});
  expect_error([] { MultiHeadAttention(0, 1); }, {"embed_dim: expected a size > 0, got 0"});
}

TEST(Errors, ParameterShapeOrNameWrong) {
  MultiHeadAttention m(16, 4, 0, false);
  const Tensor w({16, 40});
  expect_error([&] { m.set_parameter("w_qkv", w.view()); }, {"set_parameter: w_qkv: expected [16, 48], got [16, 40]"});
  expect_error([&] { m.parameter("b_qkv"); }, {"name: expected a parameter this layer has", "'b_qkv'"});
  expect_error([&] { m.parameter("weight"); }, {"name: expected one of w_qkv, b_qkv, w_o, b_o, got 'weight'"});
}

TEST(Errors, TensorDimsInvalid) {
  expect_error([] { Tensor({2, -1}); }, {"Tensor: dims: expected non-negative sizes, got -1"});
  expect_error([] { Tensor({1, 2, 3, 4, 5}); }, {"Tensor: dims: expected 1 to 4 dimensions, got 5"});
}

TEST(Errors, ViewDimsInvalid) {
  float x = 0.0f;
  expect_error([&] { ConstTensorView(&x, {1, 1, 1, 1, 1}); }, {"View: dims: expected at most 4 dimensions, got 5"});
  expect_error([&] { ConstTensorView(&x, {1, 1}, {1}); }, {"View: strides: expected as many as dims (at most 4), got 1"});
}

TEST(Errors, PositionalEncodingArguments) {
  expect_error([] { sinusoidal_positional_encoding(4, 0); }, {"channels: expected a count > 0, got 0"});
  expect_error([] { sinusoidal_positional_encoding(-1, 4); }, {"tokens: expected a count >= 0, got -1"});
}

}  // namespace
}  // namespace mhsa::test
