// tests/cpp/test_kv_16bit.cpp — the 16-bit KV cache (KVType bf16 and f16). Attention over a
// bfloat16 / float16 cache, read as it is (strided views of a KVCache, and a paged pool's blocks),
// equals bit for bit the float32 kernel on the exactly widened keys and values, for every ISA's
// fast kernel (split-K decode and the flash forward) and for the reference; KVCache rounds each
// key and value once (nearest even) as it appends; a model decoding over a 16-bit cache stays
// within the rounding's bound of the float32 cache's logits (forward(), which keeps no cache,
// unchanged); a 16-bit pool gives back every block; the option's name is in its error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/attention_backends.h"
#include "kernels/bf16.h"
#include "kernels/half.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "test_util.h"

namespace mhsa {
namespace {

using json = nlohmann::json;

float widen(bfloat16 x) { return kernels::bf16_to_float(x.bits); }
float widen(float16 x) { return kernels::f16_to_float(x.bits); }
uint16_t rounded_bits(float x, bfloat16) { return kernels::float_to_bf16(x); }
uint16_t rounded_bits(float x, float16) { return kernels::float_to_f16(x); }

std::vector<std::optional<cpu::Isa>> kernels_here() {
  std::vector<std::optional<cpu::Isa>> all = {std::nullopt};
  for (cpu::Isa isa : cpu::usable_isas()) all.emplace_back(isa);
  return all;
}
std::string kernel_name(const std::optional<cpu::Isa>& isa) {
  return isa ? std::string(cpu::isa_name(*isa)) : std::string("reference");
}

// A float32 copy of a 16-bit view, widened exactly.
template <class T>
Tensor widened(View<const T> v) {
  Tensor t({v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t c = 0; c < v.shape[2]; ++c)
        for (int64_t d = 0; d < v.shape[3]; ++d) t.view().at(a, b, c, d) = widen(v.at(a, b, c, d));
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

struct Shape {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  AttentionOptions opt;
};

std::vector<Shape> shapes(std::mt19937_64& gen) {
  const auto odd = [&](int64_t lo, int64_t span) { return lo + static_cast<int64_t>(gen() % span) * 2 + 1; };
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window = causal;
  window.window.left = 19;
  window.softcap = 20.0f;
  AttentionOptions lengths;  // padding: each batch its own key count
  return {
      {1, 12, 12, 1, odd(600, 300), 64, causal},   // GPT-2 decode, two split-K slices and more
      {2, 6, 2, 1, odd(40, 100), 13, causal},      // grouped heads, an odd head size
      {1, 8, 2, 5, odd(50, 200), 40, window},      // a few queries: still the decode path
      {1, 4, 1, 37, 37 + odd(0, 40), 72, causal},  // a prompt chunk over a cache: the flash forward
      {1, 3, 3, 20, odd(80, 60), 24, window},
      {2, 4, 2, 11, 23, 8, lengths},
  };
}

// Attention of float32 q over a 16-bit KVCache (strided views: capacity > length) equals the
// float32 call on the widened keys and values, bit for bit, on every kernel.
template <class T>
void check_cache_attention(std::mt19937_64& gen) {
  for (Shape s : shapes(gen)) {
    SCOPED_TRACE(testing::Message() << "B" << s.B << " Hq" << s.Hq << " Hkv" << s.Hkv << " Tq" << s.Tq << " Tk" << s.Tk
                                    << " D" << s.D);
    KVCache cache(s.B, s.Hkv, s.Tk + 5, s.D, s.D, kv_type_of<T>());
    // Appended in two parts, as a prompt and a step would be.
    const int64_t first = s.Tk / 2 + 1;
    for (const auto& [t0, n] : {std::pair<int64_t, int64_t>{0, first}, {first, s.Tk - first}}) {
      const Tensor k = test::random_tensor(gen, {s.B, s.Hkv, n, s.D}, 2.0f);
      const Tensor v = test::random_tensor(gen, {s.B, s.Hkv, n, s.D});
      cache.append(k.view(), v.view());
      // Each element rounded once, nearest even.
      const View<const T> kc = cache.keys_as<T>(), vc = cache.values_as<T>();
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.Hkv; ++h)
          for (int64_t t = 0; t < n; ++t)
            for (int64_t d = 0; d < s.D; ++d) {
              ASSERT_EQ(kc.at(b, h, t0 + t, d).bits, rounded_bits(k.view().at(b, h, t, d), T{}));
              ASSERT_EQ(vc.at(b, h, t0 + t, d).bits, rounded_bits(v.view().at(b, h, t, d), T{}));
            }
    }
    const Tensor q = test::random_tensor(gen, {s.B, s.Hq, s.Tq, s.D});
    const Tensor kw = widened(cache.keys_as<T>()), vw = widened(cache.values_as<T>());
    std::vector<int64_t> lens;
    if (!s.opt.causal) {
      for (int64_t b = 0; b < s.B; ++b) lens.push_back(static_cast<int64_t>(gen() % (s.Tk + 1)));
      s.opt.kv_lengths = lens;
    }
    for (const auto& isa : kernels_here()) {
      SCOPED_TRACE(kernel_name(isa));
      Tensor want({s.B, s.Hq, s.Tq, s.D}), got({s.B, s.Hq, s.Tq, s.D});
      Tensor want_lse({s.B, s.Hq, s.Tq}), got_lse({s.B, s.Hq, s.Tq});
      detail::scaled_dot_product_attention_on(isa, q.view(), kw.view(), vw.view(), want.view(), s.opt, want_lse.view());
      detail::scaled_dot_product_attention_on(isa, q.view(), cache.keys_as<T>(), cache.values_as<T>(), got.view(),
                                              s.opt, got_lse.view());
      expect_same_bits(got, want, "out");
      expect_same_bits(got_lse, want_lse, "lse");
    }
  }
}

TEST(KV16Bit, CacheAttentionEqualsFloat32OnWidenedCache) {
  auto gen = test::test_rng();
  check_cache_attention<bfloat16>(gen);
  check_cache_attention<float16>(gen);
}

// The same over paged blocks (shuffled in memory, garbage past the length), any block size.
template <class T>
void check_paged_attention(std::mt19937_64& gen, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D,
                           int64_t bs, const AttentionOptions& opt) {
  SCOPED_TRACE(testing::Message() << "Hq" << Hq << " Hkv" << Hkv << " Tq" << Tq << " Tk" << Tk << " D" << D << " block "
                                  << bs);
  const Tensor q = test::random_tensor(gen, {1, Hq, Tq, D});
  const int64_t n = (Tk + bs - 1) / bs;
  std::vector<int64_t> where(static_cast<size_t>(n));
  std::iota(where.begin(), where.end(), 0);
  std::shuffle(where.begin(), where.end(), gen);
  std::vector<T> store(static_cast<size_t>(2 * n * Hkv * bs * D), T{0x7fc1});  // NaN past Tk: never read
  Tensor kw({1, Hkv, Tk, D}), vw({1, Hkv, Tk, D});
  std::normal_distribution<float> normal;
  std::vector<const T*> kb, vb;
  for (int64_t i = 0; i < n; ++i) {
    T* kp = store.data() + where[static_cast<size_t>(i)] * 2 * Hkv * bs * D;
    T* vp = kp + Hkv * bs * D;
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t t = 0; t < bs && i * bs + t < Tk; ++t)
        for (int64_t d = 0; d < D; ++d) {
          kp[(h * bs + t) * D + d].bits = rounded_bits(normal(gen), T{});
          vp[(h * bs + t) * D + d].bits = rounded_bits(normal(gen), T{});
          kw.view().at(0, h, i * bs + t, d) = widen(kp[(h * bs + t) * D + d]);
          vw.view().at(0, h, i * bs + t, d) = widen(vp[(h * bs + t) * D + d]);
        }
    kb.push_back(kp);
    vb.push_back(vp);
  }
  for (const auto& isa : kernels_here()) {
    SCOPED_TRACE(kernel_name(isa));
    Tensor want({1, Hq, Tq, D}), got({1, Hq, Tq, D}), want_lse({1, Hq, Tq}), got_lse({1, Hq, Tq});
    detail::scaled_dot_product_attention_on(isa, q.view(), kw.view(), vw.view(), want.view(), opt, want_lse.view());
    detail::scaled_dot_product_attention_on(isa, q.view(), PagedKVOf<T>{kb, vb, bs, Tk, Hkv, D, D}, got.view(), opt,
                                            got_lse.view());
    expect_same_bits(got, want, "out");
    expect_same_bits(got_lse, want_lse, "lse");
  }
}

TEST(KV16Bit, PagedAttentionEqualsFloat32OnWidenedBlocks) {
  auto gen = test::test_rng();
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window = causal;
  window.window.left = 21;
  window.softcap = 30.0f;
  for (int64_t bs : {1, 16, 4}) {
    check_paged_attention<bfloat16>(gen, 6, 2, 1, 1 + static_cast<int64_t>(gen() % 700), 16, bs, causal);
    check_paged_attention<float16>(gen, 4, 4, 2, 37 + static_cast<int64_t>(gen() % 60), 24, bs, window);
    check_paged_attention<bfloat16>(gen, 4, 2, 29, 29 + static_cast<int64_t>(gen() % 90), 12, bs, causal);
    check_paged_attention<float16>(gen, 3, 1, 1, 1 + static_cast<int64_t>(gen() % 300), 9, bs, causal);
  }
}

TEST(KV16Bit, CacheTypesAndErrors) {
  EXPECT_EQ(parse_kv_type("f32", "--kv-dtype"), KVType::f32);
  EXPECT_EQ(parse_kv_type("bf16", "--kv-dtype"), KVType::bf16);
  EXPECT_EQ(parse_kv_type("f16", "--kv-dtype"), KVType::f16);
  for (const char* bad : {"fp16", "F32", "", "q4_k"}) {
    try {
      (void)parse_kv_type(bad, "--kv-dtype");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-dtype: expected \"f32\", \"bf16\", \"f16\" or \"q8_0\""), std::string::npos)
          << e.what();
    }
  }
  for (KVType t : {KVType::f32, KVType::bf16, KVType::f16}) EXPECT_EQ(parse_kv_type(kv_type_name(t), "x"), t);
  // A 16-bit cache is not a float32 one: keys() names the type; keys_as of another type throws.
  KVCache c(1, 2, 9, 5, 5, KVType::bf16);
  EXPECT_EQ(c.type(), KVType::bf16);
  EXPECT_THROW((void)c.keys(), Error);
  EXPECT_THROW((void)c.values_as<float16>(), Error);
  EXPECT_NO_THROW((void)c.keys_as<bfloat16>());
  // append(from) converts: f32 → bf16 rounds as append does; bf16 → f32 widens exactly and back.
  auto gen = test::test_rng();
  const Tensor k = test::random_tensor(gen, {1, 2, 4, 5}), v = test::random_tensor(gen, {1, 2, 4, 5});
  KVCache f(1, 2, 4, 5, 5);
  f.append(k.view(), v.view());
  c.append(f);
  KVCache back(1, 2, 7, 5, 5);
  back.append(c);
  EXPECT_THROW(back.append(c), Error);  // 4 + 4 tokens do not fit in 7
  EXPECT_EQ(back.length(), 4);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t d = 0; d < 5; ++d) {
        EXPECT_EQ(c.keys_as<bfloat16>().at(0, h, t, d).bits, kernels::float_to_bf16(k.view().at(0, h, t, d)));
        EXPECT_EQ(back.values().at(0, h, t, d), kernels::bf16_to_float(kernels::float_to_bf16(v.view().at(0, h, t, d))));
      }
  KVCache other(1, 1, 9, 5, 5, KVType::f16);
  EXPECT_THROW(other.append(f), Error);  // another head count
  // The pool: half the bytes per block with 16 bits.
  const KVBlockPool p32(3, 2, 8, 8, 16, 5), p16(3, 2, 8, 8, 16, 5, KVType::f16);
  EXPECT_EQ(p32.block_bytes(), 3 * 2 * 16 * 16 * 4);
  EXPECT_EQ(p16.block_bytes(), p32.block_bytes() / 2);
  EXPECT_EQ(p16.type(), KVType::f16);
}

json llama_config() {
  return {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 263},
          {"hidden_size", 48}, {"intermediate_size", 83}, {"num_hidden_layers", 3},
          {"num_attention_heads", 6}, {"num_key_value_heads", 2}, {"max_position_embeddings", 200}};
}
json gpt2_config() {
  return {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 301}, {"n_embd", 48},
          {"n_layer", 3}, {"n_head", 4}, {"n_positions", 200}};
}

std::vector<int32_t> random_ids(std::mt19937_64& gen, const Model& m, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& t : v) t = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(m.config().vocab_size) - 1)(gen);
  return v;
}

// Decoding over a 16-bit cache: the same prompt and the same fed tokens through an f32 and a
// 16-bit cache. Each cached key and value carries a relative rounding error of at most u (2⁻⁹ for
// bfloat16, 2⁻¹² for float16); the attention output, a convex combination of values with weights
// e^{q·k}, moves by about u·(1 + |q·k|) relative, and the layers add such errors, so the logits
// move by a few u relative to their spread. Bound: max |Δlogit| ≤ 16·u·max |logit| (well above
// the ~1-4·u seen, far below the gap that would make the test meaningless: 16·2⁻⁹ = 3%).
TEST(KV16Bit, ModelDecodeNearFloat32Cache) {
  for (const json& config : {llama_config(), gpt2_config()}) {
    auto gen = test::test_rng();
    Model model = Model::random(ModelConfig::parse(config.dump()), gen());
    for (auto& [name, t] : model.parameters())  // lively logits (random weights give nearly flat ones)
      if (name.find("embed") != std::string::npos || name.find("wte") != std::string::npos ||
          name.find("lm_head") != std::string::npos)
        for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 20.0f;
    for (KVType kv : {KVType::bf16, KVType::f16}) {
      SCOPED_TRACE(std::string(config["model_type"]) + " " + std::string(kv_type_name(kv)));
      const double u = kv == KVType::bf16 ? 0x1p-9 : 0x1p-12;
      model.set_kv_type(KVType::f32);
      ModelCache c32 = model.new_cache(1, 120);
      model.set_kv_type(kv);
      ModelCache c16 = model.new_cache(1, 120);
      const std::vector<int32_t> prompt = random_ids(gen, model, 41 + static_cast<int64_t>(gen() % 30));
      Tensor a = model.extend(c32, prompt, 1, static_cast<int64_t>(prompt.size()), true);
      Tensor b = model.extend(c16, prompt, 1, static_cast<int64_t>(prompt.size()), true);
      // forward() keeps no cache: float32 keys and values whatever kv_type() says.
      const Tensor f16kv = model.forward(prompt, 1, static_cast<int64_t>(prompt.size()));
      model.set_kv_type(KVType::f32);
      expect_same_bits(f16kv, model.forward(prompt, 1, static_cast<int64_t>(prompt.size())), "forward");
      const int64_t V = model.config().vocab_size;
      int same = 0, steps = 24;
      for (int step = 0; step < steps; ++step) {
        double diff = 0, top = 0;
        for (int64_t i = 0; i < V; ++i) {
          diff = std::max(diff, std::fabs(static_cast<double>(a.data()[i]) - b.data()[i]));
          top = std::max(top, std::fabs(static_cast<double>(a.data()[i])));
        }
        EXPECT_LE(diff, 16 * u * top) << "step " << step;
        EXPECT_GT(diff, 0.0) << "step " << step << ": the 16-bit cache changed nothing";
        const auto argmax = [&](const Tensor& t) {
          return static_cast<int32_t>(std::max_element(t.data(), t.data() + V) - t.data());
        };
        same += argmax(a) == argmax(b);
        const std::vector<int32_t> next = {argmax(a)};  // both fed the f32 run's token
        a = model.extend(c32, next, 1, 1, true);
        b = model.extend(c16, next, 1, 1, true);
      }
      EXPECT_GE(same, steps - 3);  // greedy choices differ only at near-ties
    }
  }
}

// A bf16 pool: Model::step over its pages equals Model::step over bf16 caches bit for bit (the
// same rounding, the same kernels reading in place), and every block comes back.
TEST(KV16Bit, PagedStepEqualsCacheStepAndBlocksComeBack) {
  auto gen = test::test_rng();
  Model model = Model::random(ModelConfig::parse(llama_config().dump()), gen());
  model.set_kv_type(KVType::bf16);
  const int64_t bs = int64_t{1} << (gen() % 5);  // 1 to 16 tokens: block sizes are powers of two
  KVBlockPool pool = model.new_kv_pool(3 * ((100 + bs - 1) / bs), bs);
  ASSERT_EQ(pool.type(), KVType::bf16);
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
  EXPECT_GT(pool.stats().used, 0);
  for (PagedSequence& p : paged) pool.release(p);
  const KVPoolStats s = pool.stats();
  EXPECT_EQ(s.used, 0);
  EXPECT_EQ(s.reserved, 0);
  EXPECT_EQ(pool.available(), pool.blocks());
}

}  // namespace
}  // namespace mhsa
