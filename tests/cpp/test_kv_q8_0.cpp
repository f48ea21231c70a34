// tests/cpp/test_kv_q8_0.cpp — the 8-bit KV cache (KVType q8_0, keys and values each their own
// type). A q8_0 KVCache stores each row as ggml's Q8_0 blocks (ggml's reference rounding; a block
// with a NaN or ±inf reads back as NaN, one below float16's scale as zeros); attention over it, read
// as it is (strided views of a KVCache, and a paged pool's blocks; keys q8_0 with values f16 or
// f32 and the reverse), equals bit for bit the float32 kernel on the dequantised keys and values,
// for every ISA's fast kernel (split-K decode and the flash forward) and for the float64 reference,
// on odd sizes (T = 1, 97, 1025; D = 32, 64, 96, 128; grouped heads; causal, window, soft-cap,
// padding and additive masks); a non-finite key spoils the same rows as in an f16 cache; head sizes
// not a multiple of 32 are refused naming the argument; a model decoding over a q8_0 cache stays
// near the float32 cache's logits and greedy tokens; a q8_0 pool's Model::step equals the cache's
// bit for bit, and its blocks are 17/64 of float32's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/attention_backends.h"
#include "kernels/bf16.h"
#include "kernels/half.h"
#include "kernels/q8_0.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "test_util.h"

namespace mhsa {
namespace {

using json = nlohmann::json;

std::vector<std::optional<cpu::Isa>> kernels_here() {
  std::vector<std::optional<cpu::Isa>> all = {std::nullopt};
  for (cpu::Isa isa : cpu::usable_isas()) all.emplace_back(isa);
  return all;
}
std::string kernel_name(const std::optional<cpu::Isa>& isa) {
  return isa ? std::string(cpu::isa_name(*isa)) : std::string("reference");
}

float widen(float x) { return x; }
float widen(float16 x) { return kernels::f16_to_float(x.bits); }
float widen(bfloat16 x) { return kernels::bf16_to_float(x.bits); }

// A float32 copy of a cache view: a Q8_0 one dequantised (scale · q), the others widened exactly.
template <class T>
Tensor widened(View<const T> v) {
  const int64_t D = std::is_same_v<T, BlockQ8_0> ? v.shape[3] * 32 : v.shape[3];
  Tensor t({v.shape[0], v.shape[1], v.shape[2], D});
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t c = 0; c < v.shape[2]; ++c)
        for (int64_t d = 0; d < D; ++d) {
          if constexpr (std::is_same_v<T, BlockQ8_0>) {
            const BlockQ8_0& block = v.at(a, b, c, d / 32);
            t.view().at(a, b, c, d) = kernels::f16_to_float(block.d) * static_cast<float>(block.qs[d % 32]);
          } else {
            t.view().at(a, b, c, d) = widen(v.at(a, b, c, d));
          }
        }
  return t;
}

void expect_same_bits(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const float g = got.data()[i], w = want.data()[i];
    ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w))) << what << " element " << i << ": " << g << " vs " << w;
    ASSERT_EQ(std::signbit(g), std::signbit(w)) << what << " element " << i;
  }
}

// The blocks ggml's reference quantiser makes of x [n] (finite values).
std::vector<BlockQ8_0> ggml_blocks(const float* x, int64_t n) {
  std::vector<BlockQ8_0> b(static_cast<size_t>(n / 32));
  kernels::quantize_row_q8_0(x, n, b.data());
  return b;
}

struct Shape {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  AttentionOptions opt;
  bool mask = false;  // an additive mask [Tq, Tk] with some -inf
};

std::vector<Shape> shapes() {
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window = causal;
  window.window.left = 19;
  window.softcap = 20.0f;
  AttentionOptions plain, lengths;  // lengths: each batch its own key count
  return {
      {1, 12, 12, 1, 1025, 64, causal},  // decode: three split-K slices
      {2, 6, 2, 1, 97, 96, causal},      // grouped heads
      {1, 3, 3, 1, 1, 128, causal},      // one key
      {1, 8, 2, 5, 1025, 128, window},   // a few queries: still the decode path
      {1, 4, 1, 97, 97, 64, causal},     // a prompt: the flash forward
      {1, 4, 2, 97, 1025, 96, window},   // a chunk over a long cache, windowed
      {1, 2, 1, 1025, 1025, 32, causal},
      {2, 4, 2, 11, 97, 32, lengths},
      {1, 6, 3, 7, 97, 64, plain, true},
      {1, 4, 4, 1, 97, 64, plain, true},
  };
}

// Attention of float32 q over a KVCache of keys K and values V (strided views: capacity > length)
// equals the float32 call on the widened keys and values, bit for bit, on every kernel.
template <class K, class V>
void check_cache_attention(std::mt19937_64& gen) {
  SCOPED_TRACE(kv_type_name(KVTypes{kv_type_of<K>(), kv_type_of<V>()}));
  for (Shape s : shapes()) {
    SCOPED_TRACE(testing::Message() << "B" << s.B << " Hq" << s.Hq << " Hkv" << s.Hkv << " Tq" << s.Tq << " Tk" << s.Tk
                                    << " D" << s.D);
    KVCache cache(s.B, s.Hkv, s.Tk + 5, s.D, s.D, {kv_type_of<K>(), kv_type_of<V>()});
    const int64_t first = s.Tk / 2 + 1;  // appended in two parts, as a prompt and a step would be
    for (const auto& [t0, n] : {std::pair<int64_t, int64_t>{0, first}, {first, s.Tk - first}}) {
      if (n == 0) continue;
      const Tensor k = test::random_tensor(gen, {s.B, s.Hkv, n, s.D}, 2.0f);
      const Tensor v = test::random_tensor(gen, {s.B, s.Hkv, n, s.D});
      cache.append(k.view(), v.view());
      if constexpr (std::is_same_v<K, BlockQ8_0>) {  // each row as ggml quantises it
        const View<const BlockQ8_0> kc = cache.keys_as<BlockQ8_0>();
        for (int64_t b = 0; b < s.B; ++b)
          for (int64_t h = 0; h < s.Hkv; ++h)
            for (int64_t t = 0; t < n; ++t) {
              const std::vector<BlockQ8_0> want = ggml_blocks(&k.view().at(b, h, t, 0), s.D);
              for (int64_t i = 0; i < s.D / 32; ++i) {
                const BlockQ8_0& got = kc.at(b, h, t0 + t, i);
                ASSERT_EQ(got.d, want[static_cast<size_t>(i)].d);
                ASSERT_TRUE(std::equal(got.qs, got.qs + 32, want[static_cast<size_t>(i)].qs));
              }
            }
      }
    }
    const Tensor q = test::random_tensor(gen, {s.B, s.Hq, s.Tq, s.D});
    const Tensor kw = widened(cache.keys_as<K>()), vw = widened(cache.values_as<V>());
    std::vector<int64_t> lens;
    Tensor mask;
    if (s.mask) {
      mask = test::random_tensor(gen, {s.Tq, s.Tk});
      for (int64_t i = 0; i < mask.numel(); ++i)
        if (gen() % 5 == 0) mask.data()[i] = -std::numeric_limits<float>::infinity();
      s.opt.attn_mask = mask.view();
    } else if (!s.opt.causal) {
      for (int64_t b = 0; b < s.B; ++b) lens.push_back(static_cast<int64_t>(gen() % (s.Tk + 1)));
      s.opt.kv_lengths = lens;
    }
    for (const auto& isa : kernels_here()) {
      SCOPED_TRACE(kernel_name(isa));
      Tensor want({s.B, s.Hq, s.Tq, s.D}), got({s.B, s.Hq, s.Tq, s.D});
      Tensor want_lse({s.B, s.Hq, s.Tq}), got_lse({s.B, s.Hq, s.Tq});
      detail::scaled_dot_product_attention_on(isa, q.view(), kw.view(), vw.view(), want.view(), s.opt, want_lse.view());
      detail::scaled_dot_product_attention_on(isa, q.view(), cache.keys_as<K>(), cache.values_as<V>(), got.view(),
                                              s.opt, got_lse.view());
      expect_same_bits(got, want, "out");
      expect_same_bits(got_lse, want_lse, "lse");
    }
  }
}

TEST(KVQ8_0, CacheAttentionEqualsFloat32OnDequantisedCache) {
  auto gen = test::test_rng();
  check_cache_attention<BlockQ8_0, BlockQ8_0>(gen);
  check_cache_attention<BlockQ8_0, float16>(gen);
  check_cache_attention<float, BlockQ8_0>(gen);
  check_cache_attention<bfloat16, BlockQ8_0>(gen);
}

// The fast kernels against the float64 reference on the dequantised keys and values (the twin),
// as the float32 kernels are held to it: within float32 sums' error.
TEST(KVQ8_0, FastKernelsNearFloat64Reference) {
  auto gen = test::test_rng();
  for (const Shape& s : shapes()) {
    if (s.mask || !s.opt.causal) continue;
    SCOPED_TRACE(testing::Message() << "Hq" << s.Hq << " Tq" << s.Tq << " Tk" << s.Tk << " D" << s.D);
    KVCache cache(s.B, s.Hkv, s.Tk, s.D, s.D, KVType::q8_0);
    const Tensor k = test::random_tensor(gen, {s.B, s.Hkv, s.Tk, s.D}), v = test::random_tensor(gen, {s.B, s.Hkv, s.Tk, s.D});
    cache.append(k.view(), v.view());
    const Tensor q = test::random_tensor(gen, {s.B, s.Hq, s.Tq, s.D});
    Tensor want({s.B, s.Hq, s.Tq, s.D});
    detail::scaled_dot_product_attention_on(std::nullopt, q.view(), cache.keys_as<BlockQ8_0>(),
                                            cache.values_as<BlockQ8_0>(), want.view(), s.opt, {});
    for (cpu::Isa isa : cpu::usable_isas()) {
      Tensor got({s.B, s.Hq, s.Tq, s.D});
      detail::scaled_dot_product_attention_on(isa, q.view(), cache.keys_as<BlockQ8_0>(), cache.values_as<BlockQ8_0>(),
                                              got.view(), s.opt, {});
      for (int64_t i = 0; i < want.numel(); ++i) ASSERT_NEAR(got.data()[i], want.data()[i], 1e-5) << cpu::isa_name(isa);
    }
  }
}

// The same over paged blocks (shuffled in memory, garbage past the length), any block size.
template <class K, class V>
void check_paged_attention(std::mt19937_64& gen, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D,
                           int64_t bs, const AttentionOptions& opt) {
  SCOPED_TRACE(testing::Message() << kv_type_name(KVTypes{kv_type_of<K>(), kv_type_of<V>()}) << " Hq" << Hq << " Hkv"
                                  << Hkv << " Tq" << Tq << " Tk" << Tk << " D" << D << " block " << bs);
  // The blocks of a pool of one layer (its layout: keys [Hkv, bs, D], then values).
  KVBlockPool pool(1, Hkv, D, D, bs, (Tk + bs - 1) / bs + 2, {kv_type_of<K>(), kv_type_of<V>()});
  PagedSequence seq;
  ASSERT_TRUE(pool.reserve(seq, pool.blocks_for(Tk) + 2));
  pool.grow(seq, std::max(Tk, 2 * bs));
  std::reverse(seq.blocks.begin(), seq.blocks.end());  // the sequence's blocks out of order in memory
  const Tensor k = test::random_tensor(gen, {1, Hkv, Tk, D}, 2.0f), v = test::random_tensor(gen, {1, Hkv, Tk, D});
  KVCache ref(1, Hkv, Tk, D, D, {kv_type_of<K>(), kv_type_of<V>()});
  ref.append(k.view(), v.view());
  std::vector<const K*> kb;
  std::vector<const V*> vb;
  const int64_t k_row = kv_row_bytes(kv_type_of<K>(), D), v_row = kv_row_bytes(kv_type_of<V>(), D);
  for (size_t i = 0; i < seq.blocks.size(); ++i) {
    auto* kp = static_cast<std::byte*>(pool.keys(0, seq.blocks[i]));
    auto* vp = static_cast<std::byte*>(pool.values(0, seq.blocks[i]));
    std::fill(kp, kp + Hkv * bs * k_row, std::byte{0xff});  // NaN scales past Tk: never read
    std::fill(vp, vp + Hkv * bs * v_row, std::byte{0xff});
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t t = 0; t < bs && static_cast<int64_t>(i) * bs + t < Tk; ++t) {
        const int64_t j = static_cast<int64_t>(i) * bs + t;
        std::memcpy(kp + (h * bs + t) * k_row, &ref.keys_as<K>().at(0, h, j, 0), static_cast<size_t>(k_row));
        std::memcpy(vp + (h * bs + t) * v_row, &ref.values_as<V>().at(0, h, j, 0), static_cast<size_t>(v_row));
      }
    kb.push_back(reinterpret_cast<const K*>(kp));
    vb.push_back(reinterpret_cast<const V*>(vp));
  }
  const Tensor q = test::random_tensor(gen, {1, Hq, Tq, D});
  const Tensor kw = widened(ref.keys_as<K>()), vw = widened(ref.values_as<V>());
  for (const auto& isa : kernels_here()) {
    SCOPED_TRACE(kernel_name(isa));
    Tensor want({1, Hq, Tq, D}), got({1, Hq, Tq, D}), want_lse({1, Hq, Tq}), got_lse({1, Hq, Tq});
    detail::scaled_dot_product_attention_on(isa, q.view(), kw.view(), vw.view(), want.view(), opt, want_lse.view());
    detail::scaled_dot_product_attention_on(isa, q.view(), PagedKVOf<K, V>{kb, vb, bs, Tk, Hkv, D, D}, got.view(), opt,
                                            got_lse.view());
    expect_same_bits(got, want, "out");
    expect_same_bits(got_lse, want_lse, "lse");
  }
  pool.release(seq);
}

TEST(KVQ8_0, PagedAttentionEqualsFloat32OnDequantisedBlocks) {
  auto gen = test::test_rng();
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window = causal;
  window.window.left = 21;
  window.softcap = 30.0f;
  for (int64_t bs : {1, 16, 4}) {
    check_paged_attention<BlockQ8_0, BlockQ8_0>(gen, 6, 2, 1, 1025, 64, bs, causal);
    check_paged_attention<BlockQ8_0, float16>(gen, 4, 4, 2, 97, 96, bs, window);
    check_paged_attention<BlockQ8_0, BlockQ8_0>(gen, 4, 2, 97, 97, 128, bs, causal);
    check_paged_attention<float, BlockQ8_0>(gen, 3, 1, 1, 1, 32, bs, causal);
  }
}

// Keys (or values) with a NaN or an infinity: the q8_0 block holding it reads back as NaN, so the
// rows that see that key are NaN (an f16 cache keeps the infinity: its scores are ±inf, a row NaN
// or, where the score is −inf, finite without that key; a NaN is NaN in both); the rows before a
// bad key (causal) are untouched in both.
TEST(KVQ8_0, NonFiniteKeysSpoilTheRowsThatSeeThem) {
  auto gen = test::test_rng();
  const int64_t Hkv = 2, Hq = 4, T = 97, D = 64, bad = 40;
  AttentionOptions causal;
  causal.causal = true;
  for (const float hostile : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    for (const bool in_values : {false, true}) {
      SCOPED_TRACE(testing::Message() << hostile << (in_values ? " in a value" : " in a key"));
      Tensor k = test::random_tensor(gen, {1, Hkv, T, D}), v = test::random_tensor(gen, {1, Hkv, T, D});
      (in_values ? v : k).view().at(0, 1, bad, 5) = hostile;
      KVCache q8(1, Hkv, T, D, D, KVType::q8_0), f16(1, Hkv, T, D, D, KVType::f16);
      q8.append(k.view(), v.view());
      f16.append(k.view(), v.view());
      const BlockQ8_0& block = (in_values ? q8.values_as<BlockQ8_0>() : q8.keys_as<BlockQ8_0>()).at(0, 1, bad, 0);
      EXPECT_TRUE(std::isnan(kernels::f16_to_float(block.d)));
      EXPECT_TRUE(std::all_of(block.qs, block.qs + 32, [](int8_t x) { return x == 0; }));
      const Tensor q = test::random_tensor(gen, {1, Hq, T, D});
      for (const auto& isa : kernels_here()) {
        SCOPED_TRACE(kernel_name(isa));
        for (const int64_t Tq : {int64_t{1}, T}) {  // decode (the last row) and a prompt
          const ConstTensorView qv(&q.view().at(0, 0, T - Tq, 0), {1, Hq, Tq, D}, {Hq * T * D, T * D, D, 1});
          Tensor a({1, Hq, Tq, D}), b({1, Hq, Tq, D});
          detail::scaled_dot_product_attention_on(isa, qv, q8.keys_as<BlockQ8_0>(), q8.values_as<BlockQ8_0>(), a.view(),
                                                  causal, {});
          detail::scaled_dot_product_attention_on(isa, qv, f16.keys_as<float16>(), f16.values_as<float16>(), b.view(),
                                                  causal, {});
          for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Tq; ++i) {
              const int64_t pos = T - Tq + i;
              const bool sees = h / (Hq / Hkv) == 1 && pos >= bad;
              for (int64_t d = 0; d < D; ++d) {
                const float x = a.view().at(0, h, i, d), y = b.view().at(0, h, i, d);
                // (a bad value spoils its block's 32 outputs; a bad key every output of the row)
                if (sees && (!in_values || d < 32)) {  // (an f16 row sees ±inf scores: NaN, or finite where -inf)
                  ASSERT_TRUE(std::isnan(x)) << "h" << h << " row " << pos;
                  if (in_values && d == 5) ASSERT_FALSE(std::isfinite(y)) << "h" << h << " row " << pos;
                } else if (in_values) {
                  // (the blocked P·V multiplies a masked key's P = 0 by its value: 0·inf is NaN
                  // there in any cache type, so rows that do not see a bad value are not checked)
                  if (sees) ASSERT_TRUE(std::isfinite(x)) << "h" << h << " row " << pos;
                } else {
                  ASSERT_TRUE(std::isfinite(x) && std::isfinite(y)) << "h" << h << " row " << pos;
                }
              }
            }
        }
      }
    }
  }
}

TEST(KVQ8_0, QuantisationEdgesTypesAndErrors) {
  // Tiny values (a scale below float16's least) read back as zeros; zeros as zeros.
  KVCache c(1, 1, 4, 32, 32, KVType::q8_0);
  Tensor k({1, 1, 2, 32}), v({1, 1, 2, 32});
  for (int64_t d = 0; d < 32; ++d) k.view().at(0, 0, 0, d) = 1e-7f * static_cast<float>(d % 3);
  c.append(k.view(), v.view());
  const Tensor kw = widened(c.keys_as<BlockQ8_0>()), vw = widened(c.values_as<BlockQ8_0>());
  for (int64_t i = 0; i < kw.numel(); ++i) EXPECT_EQ(kw.data()[i], 0.0f);
  for (int64_t i = 0; i < vw.numel(); ++i) EXPECT_EQ(vw.data()[i], 0.0f);
  // Types: names, one for both or KEY/VALUE.
  EXPECT_EQ(parse_kv_type("q8_0", "--kv-dtype"), KVType::q8_0);
  EXPECT_EQ(parse_kv_types("q8_0", "--kv-dtype"), (KVTypes{KVType::q8_0, KVType::q8_0}));
  EXPECT_EQ(parse_kv_types("q8_0/f16", "--kv-dtype"), (KVTypes{KVType::q8_0, KVType::f16}));
  EXPECT_EQ(kv_type_name(KVTypes{KVType::q8_0, KVType::f16}), "q8_0/f16");
  EXPECT_EQ(kv_type_name(KVTypes{KVType::q8_0}), "q8_0");
  for (const char* bad : {"q8", "Q8_0", "q8_0/", "/f16", "q8_0/f16/f32", "q4_k"}) {
    try {
      (void)parse_kv_types(bad, "--kv-dtype");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected \"f32\", \"bf16\", \"f16\" or \"q8_0\""), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(kv_row_bytes(KVType::q8_0, 64), 68);
  EXPECT_THROW((void)c.keys_as<float>(), Error);
  EXPECT_THROW((void)c.keys(), Error);
  // Head sizes not a multiple of 32, refused naming the argument.
  const auto message_of = [](const auto& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of([] { KVCache(1, 2, 8, 40, 64, KVType::q8_0); }).find("KVCache: head_dim: expected a multiple of 32"),
            std::string::npos);
  EXPECT_NE(message_of([] { KVCache(1, 2, 8, 64, 48, {KVType::f16, KVType::q8_0}); }).find("v_head_dim"),
            std::string::npos);
  EXPECT_NO_THROW(KVCache(1, 2, 8, 40, 64, {KVType::f16, KVType::q8_0}));
  EXPECT_NE(message_of([] { KVBlockPool(2, 2, 96, 72, 16, 4, KVType::q8_0); }).find("KVBlockPool: v_head_dim: expected a multiple of 32"),
            std::string::npos);
  const Tensor q({1, 2, 1, 40});
  std::vector<BlockQ8_0> blocks(4);
  const View<const BlockQ8_0> kq(blocks.data(), {1, 1, 4, 1});
  Tensor out({1, 2, 1, 32});
  EXPECT_NE(message_of([&] { scaled_dot_product_attention(q.view(), kq, kq, out.view()); })
                .find("scaled_dot_product_attention: k (q8_0): expected head size D, as q.shape[3] a multiple of 32"),
            std::string::npos);
  // append(from) converts: f32 → q8_0 quantises as append does; q8_0 → f16 from the dequantised values.
  auto gen = test::test_rng();
  const Tensor k2 = test::random_tensor(gen, {1, 2, 3, 64}), v2 = test::random_tensor(gen, {1, 2, 3, 64});
  KVCache f(1, 2, 3, 64, 64), direct(1, 2, 3, 64, 64, KVType::q8_0), via(1, 2, 3, 64, 64, KVType::q8_0),
      half(1, 2, 3, 64, 64, KVType::f16);
  f.append(k2.view(), v2.view());
  direct.append(k2.view(), v2.view());
  via.append(f);
  half.append(via);
  expect_same_bits(widened(via.keys_as<BlockQ8_0>()), widened(direct.keys_as<BlockQ8_0>()), "append(from)");
  Tensor rounded = widened(direct.values_as<BlockQ8_0>());
  for (int64_t i = 0; i < rounded.numel(); ++i)
    rounded.data()[i] = kernels::f16_to_float(kernels::float_to_f16(rounded.data()[i]));
  expect_same_bits(widened(half.values_as<float16>()), rounded, "q8_0 → f16");
  // The pool: 34 bytes per 32 values; keys and values apart.
  const KVBlockPool p32(3, 2, 32, 32, 16, 5), p8(3, 2, 32, 32, 16, 5, KVType::q8_0),
      mixed(3, 2, 32, 32, 16, 5, {KVType::q8_0, KVType::f32});
  EXPECT_EQ(p8.block_bytes(), 3 * 2 * 16 * (34 + 34));
  EXPECT_EQ(p8.block_bytes() * 64, p32.block_bytes() * 17);
  EXPECT_EQ(mixed.block_bytes(), 3 * 2 * 16 * (34 + 128));
  EXPECT_EQ(mixed.type(), (KVTypes{KVType::q8_0, KVType::f32}));
  // Values after an odd number of key bytes start aligned for their floats.
  KVBlockPool odd(1, 1, 32, 32, 1, 2, {KVType::q8_0, KVType::f32});
  odd.allocate_all();
  PagedSequence s;
  ASSERT_TRUE(odd.reserve(s, 1));
  odd.grow(s, 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(odd.values(0, s.blocks[0])) % 4, 0u);
  EXPECT_EQ(static_cast<std::byte*>(odd.values(0, s.blocks[0])) - static_cast<std::byte*>(odd.keys(0, s.blocks[0])), 36);
  odd.release(s);
}

// A config whose head size is 32 (q8_0 blocks need multiples of 32).
json llama_config() {
  return {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 263},
          {"hidden_size", 128}, {"intermediate_size", 83}, {"num_hidden_layers", 3},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 200}};
}
json gpt2_config() {
  return {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 301}, {"n_embd", 64},
          {"n_layer", 3}, {"n_head", 2}, {"n_positions", 200}};
}

std::vector<int32_t> random_ids(std::mt19937_64& gen, const Model& m, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& t : v) t = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(m.config().vocab_size) - 1)(gen);
  return v;
}

// Decoding over a q8_0 cache (and keys q8_0 with values f16) against the float32 cache, the same
// prompt and fed tokens. Each cached value is within half a quantisation step of its block's
// absolute maximum/127, so relative to the block's largest value u = 2⁻⁸; as for the 16-bit cache
// (test_kv_16bit.cpp) the logits move by a few u relative to their spread: max |Δlogit| ≤
// 16·u·max |logit| (6%). Greedy tokens: close, not equal — the f32 run's argmax is the q8_0 run's
// at all but a few near-ties, and greedy generation from the same prompt agrees for its first
// tokens.
TEST(KVQ8_0, ModelDecodeNearFloat32Cache) {
  for (const json& config : {llama_config(), gpt2_config()}) {
    auto gen = test::test_rng();
    Model model = Model::random(ModelConfig::parse(config.dump()), gen());
    for (auto& [name, t] : model.parameters())  // lively logits (random weights give nearly flat ones)
      if (name.find("embed") != std::string::npos || name.find("wte") != std::string::npos ||
          name.find("lm_head") != std::string::npos)
        for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 20.0f;
    for (const KVTypes kv : {KVTypes{KVType::q8_0}, KVTypes{KVType::q8_0, KVType::f16}}) {
      SCOPED_TRACE(std::string(config["model_type"]) + " " + kv_type_name(kv));
      const double u = 0x1p-8;
      model.set_kv_type(KVType::f32);
      ModelCache c32 = model.new_cache(1, 120);
      model.set_kv_type(kv);
      ModelCache c8 = model.new_cache(1, 120);
      const std::vector<int32_t> prompt = random_ids(gen, model, 41 + static_cast<int64_t>(gen() % 30));
      Tensor a = model.extend(c32, prompt, 1, static_cast<int64_t>(prompt.size()), true);
      Tensor b = model.extend(c8, prompt, 1, static_cast<int64_t>(prompt.size()), true);
      const int64_t V = model.config().vocab_size;
      const auto argmax = [&](const Tensor& t) {
        return static_cast<int32_t>(std::max_element(t.data(), t.data() + V) - t.data());
      };
      int same = 0, steps = 24;
      for (int step = 0; step < steps; ++step) {
        double diff = 0, top = 0;
        for (int64_t i = 0; i < V; ++i) {
          diff = std::max(diff, std::fabs(static_cast<double>(a.data()[i]) - b.data()[i]));
          top = std::max(top, std::fabs(static_cast<double>(a.data()[i])));
        }
        EXPECT_LE(diff, 16 * u * top) << "step " << step;
        EXPECT_GT(diff, 0.0) << "step " << step << ": the q8_0 cache changed nothing";
        same += argmax(a) == argmax(b);
        const std::vector<int32_t> next = {argmax(a)};  // both fed the f32 run's token
        a = model.extend(c32, next, 1, 1, true);
        b = model.extend(c8, next, 1, 1, true);
      }
      EXPECT_GE(same, steps - 3);  // greedy choices differ only at near-ties
      // Free-running greedy generation: each run feeds its own tokens.
      model.set_kv_type(KVType::f32);
      ModelCache g32 = model.new_cache(1, 120);
      model.set_kv_type(kv);
      ModelCache g8 = model.new_cache(1, 120);
      std::vector<int32_t> t32 = {argmax(model.extend(g32, prompt, 1, static_cast<int64_t>(prompt.size()), true))};
      std::vector<int32_t> t8 = {argmax(model.extend(g8, prompt, 1, static_cast<int64_t>(prompt.size()), true))};
      for (int i = 0; i < 15; ++i) {
        t32.push_back(argmax(model.extend(g32, std::vector<int32_t>{t32.back()}, 1, 1, true)));
        t8.push_back(argmax(model.extend(g8, std::vector<int32_t>{t8.back()}, 1, 1, true)));
      }
      const auto agree = std::mismatch(t32.begin(), t32.end(), t8.begin()).first - t32.begin();
      EXPECT_GE(agree, 4) << "greedy tokens agree for the first " << agree << " of 16";
    }
  }
}

// A q8_0 pool (and one of q8_0 keys with f32 values): Model::step over its pages equals Model::step
// over caches of the same types bit for bit, and every block comes back.
TEST(KVQ8_0, PagedStepEqualsCacheStepAndBlocksComeBack) {
  for (const KVTypes kv : {KVTypes{KVType::q8_0}, KVTypes{KVType::q8_0, KVType::f32}}) {
    SCOPED_TRACE(kv_type_name(kv));
    auto gen = test::test_rng();
    Model model = Model::random(ModelConfig::parse(llama_config().dump()), gen());
    model.set_kv_type(kv);
    const int64_t bs = int64_t{1} << (gen() % 5);
    KVBlockPool pool = model.new_kv_pool(3 * ((100 + bs - 1) / bs), bs);
    ASSERT_EQ(pool.type(), kv);
    std::vector<ModelCache> caches;
    std::vector<PagedSequence> paged(3);
    for (PagedSequence& p : paged) {
      caches.push_back(model.new_cache(1, 100));
      ASSERT_TRUE(pool.reserve(p, pool.blocks_for(100)));
    }
    const std::vector<std::vector<int64_t>> schedule = {{20, 3, 31}, {1, 1, 1}, {1, 17, 0}, {0, 1, 1}, {9, 1, 1}};
    for (const std::vector<int64_t>& n : schedule) {
      std::vector<std::vector<int32_t>> ids;
      std::vector<SequenceStep> over_caches, over_pages;
      for (size_t i = 0; i < n.size(); ++i) ids.push_back(random_ids(gen, model, n[i]));
      for (size_t i = 0; i < n.size(); ++i) {
        if (n[i] == 0) continue;
        over_caches.push_back({&caches[i], ids[i]});
        pool.grow(paged[i], paged[i].length + n[i]);
        over_pages.push_back({nullptr, ids[i], &paged[i]});
      }
      const Tensor want = model.step(over_caches), got = model.step(over_pages);
      expect_same_bits(got, want, "logits");
    }
    for (PagedSequence& p : paged) pool.release(p);
    EXPECT_EQ(pool.stats().used, 0);
    EXPECT_EQ(pool.available(), pool.blocks());
  }
}

}  // namespace
}  // namespace mhsa
