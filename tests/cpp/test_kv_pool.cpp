// tests/cpp/test_kv_pool.cpp — the paged KV cache: KVBlockPool's promises, sharing and eviction;
// attention over paged keys and values equal bit for bit to the contiguous call (fast and
// reference kernels, decode and prefill paths, blocks in shuffled order, windows, grouped heads);
// Model::step over paged sequences equal bit for bit to Model::step over ModelCaches with the same
// schedule; a prompt sharing an earlier prompt's blocks prefills fewer tokens and continues as an
// unshared one does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mhsa/error.h"
#include "mhsa/model.h"
#include "test_util.h"

namespace mhsa {
namespace {

using json = nlohmann::json;

std::vector<int32_t> iota_tokens(int64_t n, int32_t from) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(KVPool, PromisesSharingAndEviction) {
  KVBlockPool pool(2, 1, 4, 4, 4, 6);  // 6 blocks of 4 tokens
  EXPECT_EQ(pool.available(), 6);
  PagedSequence a;
  ASSERT_TRUE(pool.reserve(a, 3));
  EXPECT_FALSE(pool.reserve(a, 4));  // 3 left to promise
  pool.grow(a, 10);                  // 3 blocks
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(a.reserved, 0);
  EXPECT_THROW(pool.grow(a, 13), Error);  // past its promise
  a.length = 10;
  const std::vector<int32_t> tokens = iota_tokens(10, 100);
  pool.index_full_blocks(a, tokens);  // blocks 0 and 1 are full
  EXPECT_EQ(pool.stats().used, 3);

  // b begins with the same 8 tokens: it shares a's two full blocks, not the partial third.
  std::vector<int32_t> b_tokens = tokens;
  b_tokens[9] = 7;
  PagedSequence b;
  EXPECT_EQ(pool.share_prefix(b, b_tokens, 5), 2);
  EXPECT_EQ(b.length, 8);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  EXPECT_EQ(pool.holders(a.blocks[1]), 2);
  EXPECT_EQ(pool.available(), 3);  // shared blocks cost nothing more
  // A different first block shares nothing; max_blocks limits the run.
  PagedSequence c;
  EXPECT_EQ(pool.share_prefix(c, iota_tokens(10, 0), 5), 0);
  EXPECT_EQ(pool.share_prefix(c, tokens, 1), 1);
  pool.release(c);

  pool.release(a);  // its third block is free; the shared two stay with b
  EXPECT_EQ(pool.stats().used, 2);
  EXPECT_EQ(pool.stats().cached, 0);
  pool.release(b);  // the indexed blocks stay cached
  EXPECT_EQ(pool.stats().used, 0);
  EXPECT_EQ(pool.stats().cached, 2);
  EXPECT_EQ(pool.available(), 6);

  PagedSequence d;  // a cached block comes back by its tokens
  EXPECT_EQ(pool.share_prefix(d, tokens, 3), 2);
  EXPECT_EQ(pool.stats().cached, 0);
  pool.release(d);

  PagedSequence e;  // taking the whole pool evicts the cached blocks and their index entries
  ASSERT_TRUE(pool.reserve(e, 6));
  pool.grow(e, 24);
  EXPECT_EQ(pool.stats().cached, 0);
  EXPECT_EQ(pool.available(), 0);
  PagedSequence f;
  EXPECT_FALSE(pool.reserve(f, 1));
  EXPECT_EQ(pool.share_prefix(f, tokens, 3), 0);
  pool.release(e);
  pool.release(f);
  const KVPoolStats st = pool.stats();
  EXPECT_EQ(st.used + st.reserved + st.cached, 0);
  EXPECT_THROW(KVBlockPool(2, 1, 4, 4, 0, 6), Error);
  EXPECT_THROW(KVBlockPool(2, 1, 4, 4, 12, 6), Error);  // not a power of two
}

// q [1, Hq, Tq, D] over k, v [1, Hkv, Tk, D] scattered into blocks of bs tokens in shuffled order.
void check_paged_attention(std::mt19937_64& gen, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D,
                           int64_t bs, const AttentionOptions& opt) {
  SCOPED_TRACE(testing::Message() << "Hq " << Hq << " Hkv " << Hkv << " Tq " << Tq << " Tk " << Tk << " D " << D
                                  << " block " << bs);
  const Tensor q = test::random_tensor(gen, {1, Hq, Tq, D});
  const Tensor k = test::random_tensor(gen, {1, Hkv, Tk, D}), v = test::random_tensor(gen, {1, Hkv, Tk, D});
  const test::PagedCopy blocks = test::paged_copy(k, v, bs, &gen);
  const std::vector<const float*>& kb = blocks.k_blocks;
  const std::vector<const float*>& vb = blocks.v_blocks;
  for (Backend backend : {Backend::automatic, Backend::reference}) {
    AttentionOptions o = opt;
    o.backend = backend;
    Tensor want({1, Hq, Tq, D}), got({1, Hq, Tq, D}), want_lse({1, Hq, Tq}), got_lse({1, Hq, Tq});
    scaled_dot_product_attention(q.view(), k.view(), v.view(), want.view(), o, want_lse.view());
    scaled_dot_product_attention(q.view(), PagedKV{kb, vb, bs, Tk, Hkv, D, D}, got.view(), o, got_lse.view());
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(got.data()[i], want.data()[i]) << i;
    for (int64_t i = 0; i < want_lse.numel(); ++i) ASSERT_EQ(got_lse.data()[i], want_lse.data()[i]) << i;
  }
}

// Blocks are allocated in slabs of consecutive ids (huge pages for the larger ones): every block
// must still be its own 64-byte-aligned, non-overlapping memory, keys before values, for block
// sizes that fill a slab exactly, that leave a last partial slab, and that are not multiples of 64
// bytes (a block of 16-bit elements with odd head sizes).
// Speculation's roll-back: cutting a sequence back gives the blocks past its new length to its
// promise (nothing leaves it, nothing is lost to the pool), and a cut into an indexed block, whose
// tokens are final and may be shared, is refused by name.
TEST(KVPool, TruncateGivesBlocksBackToThePromise) {
  KVBlockPool pool(2, 1, 4, 4, 4, 6);  // 6 blocks of 4 tokens
  PagedSequence a;
  ASSERT_TRUE(pool.reserve(a, 4));
  pool.grow(a, 14);  // 4 blocks
  a.length = 14;
  const std::vector<int32_t> tokens = iota_tokens(14, 100);
  pool.truncate(a, 9);  // 3 blocks
  EXPECT_EQ(a.length, 9);
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(a.keys.size(), 3u);
  EXPECT_EQ(a.reserved, 1);
  EXPECT_EQ(pool.available(), 2);  // the block went back to a's promise, not to the pool
  EXPECT_EQ(pool.stats().used, 3);
  pool.grow(a, 16);  // and can be taken again
  EXPECT_EQ(a.reserved, 0);
  a.length = 13;
  pool.index_full_blocks(a, tokens);  // blocks 0..2 are full
  EXPECT_THROW(pool.truncate(a, 11), Error);   // into block 2
  EXPECT_THROW(pool.truncate(a, 14), Error);   // past the length
  EXPECT_THROW(pool.truncate(a, -1), Error);
  try {
    pool.truncate(a, 8);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens: expected at least 12 (block 2 is indexed"), std::string::npos) << e.what();
  }
  pool.truncate(a, 12);  // the partial last block goes
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(a.reserved, 1);
  pool.release(a);
  EXPECT_EQ(pool.stats().used, 0);
  EXPECT_EQ(pool.stats().reserved, 0);
  EXPECT_EQ(pool.available(), 6);
}

TEST(KVPool, SlabbedBlocksAreDisjointAndAligned) {
  struct Shape {
    int64_t layers, heads, d, dv, bs, blocks;
    KVType type;
  };
  for (const Shape& sh : {Shape{12, 12, 64, 64, 16, 13, KVType::f32},  // GPT-2 124M's: 1.18 MB blocks
                          Shape{30, 3, 64, 64, 16, 7, KVType::bf16},     // SmolLM2-135M's, 16-bit
                          Shape{3, 1, 5, 3, 2, 9, KVType::f16},          // 96-byte blocks: stride 128
                          Shape{1, 2, 8, 8, 256, 3, KVType::f32}}) {     // 32 KiB blocks, a pool under a slab
    KVBlockPool pool(sh.layers, sh.heads, sh.d, sh.dv, sh.bs, sh.blocks, sh.type);
    PagedSequence s;
    ASSERT_TRUE(pool.reserve(s, sh.blocks));
    pool.grow(s, sh.blocks * sh.bs);
    ASSERT_EQ(static_cast<int64_t>(s.blocks.size()), sh.blocks);
    const int64_t k_bytes = sh.heads * sh.bs * kv_row_bytes(sh.type, sh.d);
    const int64_t layer_bytes = k_bytes + sh.heads * sh.bs * kv_row_bytes(sh.type, sh.dv);
    ASSERT_EQ(pool.block_bytes(), sh.layers * layer_bytes);
    // Fill every layer's keys and values of every block with a byte of its own, then read all back.
    const auto mark = [&](int32_t b, int64_t l, bool v) { return static_cast<unsigned char>(b * 31 + l * 7 + v * 3 + 1); };
    for (int32_t b : s.blocks)
      for (int64_t l = 0; l < sh.layers; ++l) {
        auto* k = static_cast<unsigned char*>(pool.keys(l, b));
        auto* v = static_cast<unsigned char*>(pool.values(l, b));
        EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.keys(0, b)) % 64, 0u) << "block " << b;
        EXPECT_EQ(v - k, k_bytes);
        std::fill_n(k, k_bytes, mark(b, l, false));
        std::fill_n(v, layer_bytes - k_bytes, mark(b, l, true));
      }
    for (int32_t b : s.blocks)
      for (int64_t l = 0; l < sh.layers; ++l) {
        const auto* k = static_cast<const unsigned char*>(pool.keys(l, b));
        const auto* v = static_cast<const unsigned char*>(pool.values(l, b));
        ASSERT_TRUE(std::all_of(k, k + k_bytes, [&](unsigned char c) { return c == mark(b, l, false); }))
            << "block " << b << " layer " << l;
        ASSERT_TRUE(std::all_of(v, v + layer_bytes - k_bytes, [&](unsigned char c) { return c == mark(b, l, true); }))
            << "block " << b << " layer " << l;
      }
    pool.release(s);
  }
}

// allocate_all claims every slab at once (mhsa serve's pool at startup): the pool's bytes, once;
// slabs already in use are kept where they are, with what they hold; the blocks taken afterwards
// are the memory allocate_all made, not new slabs.
TEST(KVPool, AllocateAllClaimsEverySlabOnceAndKeepsTheUsedOnes) {
  struct Shape {
    int64_t layers, heads, d, dv, bs, blocks;
    KVType type;
  };
  for (const Shape& sh : {Shape{12, 12, 64, 64, 16, 13, KVType::f32}, Shape{3, 1, 5, 3, 2, 9, KVType::f16},
                          Shape{1, 2, 8, 8, 256, 3, KVType::f32}}) {
    KVBlockPool pool(sh.layers, sh.heads, sh.d, sh.dv, sh.bs, sh.blocks, sh.type);
    const int64_t stride = (pool.block_bytes() + 63) / 64 * 64;
    EXPECT_EQ(pool.memory_bytes(), sh.blocks * stride);
    EXPECT_EQ(pool.allocated_bytes(), 0);
    EXPECT_EQ(pool.stats().allocated_bytes, 0);
    PagedSequence first;
    ASSERT_TRUE(pool.reserve(first, 1));
    pool.grow(first, 1);
    const int64_t one_slab = pool.allocated_bytes();
    EXPECT_GE(one_slab, stride);
    EXPECT_LE(one_slab, pool.memory_bytes());
    auto* kept = static_cast<unsigned char*>(pool.keys(0, first.blocks[0]));
    std::fill_n(kept, 64, static_cast<unsigned char>(0xa5));
    pool.allocate_all();
    EXPECT_EQ(pool.allocated_bytes(), pool.memory_bytes());
    EXPECT_EQ(pool.stats().allocated_bytes, pool.memory_bytes());
    EXPECT_EQ(pool.keys(0, first.blocks[0]), kept);
    EXPECT_TRUE(std::all_of(kept, kept + 64, [](unsigned char c) { return c == 0xa5; }));
    pool.allocate_all();  // nothing left to allocate
    EXPECT_EQ(pool.allocated_bytes(), pool.memory_bytes());
    PagedSequence rest;
    ASSERT_TRUE(pool.reserve(rest, sh.blocks - 1));
    pool.grow(rest, (sh.blocks - 1) * sh.bs);
    EXPECT_EQ(pool.allocated_bytes(), pool.memory_bytes());
    std::vector<const unsigned char*> starts;  // every block's memory distinct, 64-byte aligned
    for (const PagedSequence* s : {&first, &rest})
      for (int32_t b : s->blocks) {
        starts.push_back(static_cast<const unsigned char*>(pool.keys(0, b)));
        EXPECT_EQ(reinterpret_cast<uintptr_t>(starts.back()) % 64, 0u);
      }
    std::sort(starts.begin(), starts.end());
    for (size_t i = 1; i < starts.size(); ++i) EXPECT_GE(starts[i] - starts[i - 1], pool.block_bytes());
    pool.release(first);
    pool.release(rest);
  }
  // A pool whose bytes would not fit in 64 bits is refused by name, before anything is allocated.
  try {
    KVBlockPool huge(int64_t{1} << 20, 1024, 1024, 1024, 16, int64_t{1} << 30);
    FAIL() << "a pool of 2^77 bytes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KVBlockPool: blocks: expected a pool whose bytes fit in 64 bits"),
              std::string::npos)
        << e.what();
  }
}

TEST(KVPool, PagedAttentionEqualsContiguous) {
  auto gen = test::test_rng();
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window = causal;
  window.window.left = 21;
  window.softcap = 30.0f;
  for (int64_t bs : {1, 2, 16, 64}) {
    check_paged_attention(gen, 6, 2, 1, 1 + static_cast<int64_t>(gen() % 700), 16, bs, causal);  // decode
    check_paged_attention(gen, 4, 4, 2, 37 + static_cast<int64_t>(gen() % 60), 8, bs, window);
    check_paged_attention(gen, 4, 2, 29, 29 + static_cast<int64_t>(gen() % 90), 12, bs, causal);  // prefill chunk
    check_paged_attention(gen, 3, 1, 70, 70, 8, bs, window);
  }
  AttentionOptions plain;  // no keys at all: rows fully masked
  check_paged_attention(gen, 2, 1, 1, 0, 4, 4, plain);
  const float* none[] = {nullptr};
  Tensor q({1, 2, 1, 4}), out({1, 2, 1, 4});
  EXPECT_THROW(scaled_dot_product_attention(q.view(), PagedKV{none, none, 4, 3, 1, 4, 4}, out.view()), Error);
  EXPECT_THROW(scaled_dot_product_attention(q.view(), PagedKV{none, none, 4, 5, 1, 4, 4}, out.view()), Error);
  for (int64_t bs : {0, 3, 24})  // block sizes must be powers of two
    EXPECT_THROW(scaled_dot_product_attention(q.view(), PagedKV{none, none, bs, 0, 1, 4, 4}, out.view()), Error);
}

std::vector<std::pair<std::string, json>> configs() {
  const json llama = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 263},
                      {"hidden_size", 48}, {"intermediate_size", 83}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 6}, {"num_key_value_heads", 2}, {"max_position_embeddings", 160}};
  json mistral = llama;
  mistral["model_type"] = "mistral";
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["sliding_window"] = 7;
  const json gpt2 = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 301},
                     {"n_embd", 48},         {"n_layer", 2},                         {"n_head", 4},
                     {"n_positions", 160}};
  return {{"gpt2", gpt2}, {"llama", llama}, {"mistral", mistral}};
}

std::vector<int32_t> random_ids(std::mt19937_64& gen, const Model& m, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& t : v) t = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(m.config().vocab_size) - 1)(gen);
  return v;
}

TEST(KVPool, StepOverPagesEqualsStepOverCaches) {
  for (const auto& [name, config] : configs()) {
    SCOPED_TRACE(name);
    auto gen = test::test_rng();
    const Model model = Model::random(ModelConfig::parse(config.dump()), gen());
    const int64_t bs = int64_t{1} << (gen() % 4);
    KVBlockPool pool = model.new_kv_pool(4 * ((150 + bs - 1) / bs), bs);
    std::vector<ModelCache> caches;
    std::vector<PagedSequence> paged(4);
    for (PagedSequence& p : paged) {
      caches.push_back(model.new_cache(1, 150));
      ASSERT_TRUE(pool.reserve(p, pool.blocks_for(150)));
    }
    // A schedule of steps: prompt chunks, decode tokens, mixed, sequences waiting.
    const std::vector<std::vector<int64_t>> schedule = {
        {20, 3, 0, 31}, {1, 1, 0, 1}, {1, 17, 5, 1}, {1, 1, 1, 1}, {0, 1, 1, 0}, {2, 1, 40, 1}, {1, 1, 1, 1}};
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
      ASSERT_EQ(got.shape(), want.shape());
      for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(got.data()[i], want.data()[i]) << i;
      for (size_t i = 0; i < n.size(); ++i) EXPECT_EQ(paged[i].length, caches[i].length());
    }
    // Checked before anything runs: a table too short, a shared block written, a foreign pool.
    const std::vector<int32_t> one = {1};
    PagedSequence short_table;
    short_table.pool = &pool;
    EXPECT_THROW(model.step(std::vector<SequenceStep>{{nullptr, one, &short_table}}), Error);
    const std::vector<int32_t> tokens(static_cast<size_t>(paged[0].length), 3);
    pool.index_full_blocks(paged[0], tokens);
    PagedSequence sharer;
    ASSERT_EQ(pool.share_prefix(sharer, tokens, 1), 1);
    sharer.length = 0;  // as if it would write its first token into the shared block
    EXPECT_THROW(model.step(std::vector<SequenceStep>{{nullptr, one, &sharer}}), Error);
    pool.release(sharer);
    EXPECT_EQ(paged[0].length, caches[0].length());
    for (PagedSequence& p : paged) pool.release(p);
  }
}

TEST(KVPool, SharedPrefixPrefillsLessAndContinuesAlike) {
  auto gen = test::test_rng();
  Model model = Model::random(ModelConfig::parse(configs()[1].second.dump()), gen());
  for (auto& [name, t] : model.parameters())  // lively logits: no near-ties for greedy choices
    if (name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos)
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 30.0f;
  const int64_t bs = 4;
  KVBlockPool pool = model.new_kv_pool(100, bs);
  const std::vector<int32_t> system = random_ids(gen, model, 22 + static_cast<int64_t>(gen() % 9));
  const auto prefill = [&](PagedSequence& s, std::span<const int32_t> prompt) {
    pool.grow(s, static_cast<int64_t>(prompt.size()));
    const std::span<const int32_t> rest = prompt.subspan(static_cast<size_t>(s.length));
    const Tensor logits = model.step(std::vector<SequenceStep>{{nullptr, rest, &s}});
    pool.index_full_blocks(s, prompt);
    return logits;
  };
  std::vector<int32_t> p2 = system;
  for (int32_t t : random_ids(gen, model, 3 + static_cast<int64_t>(gen() % 20))) p2.push_back(t);
  PagedSequence first;
  ASSERT_TRUE(pool.reserve(first, pool.blocks_for(60)));
  std::vector<int32_t> p1 = system;
  p1.push_back((p2[system.size()] + 1) % static_cast<int32_t>(model.config().vocab_size));  // differs from p2 here
  prefill(first, p1);
  pool.release(first);  // its full blocks stay cached

  PagedSequence shared, alone;
  const int64_t n = pool.share_prefix(shared, p2, (static_cast<int64_t>(p2.size()) - 1) / bs);
  EXPECT_EQ(n, static_cast<int64_t>(system.size()) / bs);  // every full block of the common prefix
  ASSERT_TRUE(pool.reserve(shared, 30) && pool.reserve(alone, 30));
  Tensor a = prefill(shared, p2), b = prefill(alone, p2);
  // The shared sequence ran n·bs fewer prompt tokens; its logits agree to float32 rounding (its
  // chunk had fewer rows), and its greedy continuation is the unshared one's.
  const int64_t V = model.config().vocab_size;
  double diff = 0, top = 0;
  for (int64_t v = 0; v < V; ++v) {
    diff = std::max(diff, std::fabs(static_cast<double>(a.data()[v]) - b.data()[v]));
    top = std::max(top, std::fabs(static_cast<double>(b.data()[v])));
  }
  EXPECT_LT(diff, 1e-4 * top);
  for (int step = 0; step < 6; ++step) {
    const auto argmax = [&](const Tensor& t) {
      return static_cast<int32_t>(std::max_element(t.data(), t.data() + V) - t.data());
    };
    const int32_t ta = argmax(a), tb = argmax(b);
    ASSERT_EQ(ta, tb) << step;
    const std::vector<int32_t> next = {ta};
    pool.grow(shared, shared.length + 1);
    pool.grow(alone, alone.length + 1);
    a = model.step(std::vector<SequenceStep>{{nullptr, next, &shared}});
    b = model.step(std::vector<SequenceStep>{{nullptr, next, &alone}});
  }
  pool.release(shared);
  pool.release(alone);
  EXPECT_EQ(pool.stats().used, 0);
}

}  // namespace
}  // namespace mhsa
