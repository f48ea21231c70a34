// model/decoder.cpp — see decoder.h. The checks and the generation loop were Gpt2's; their
// messages name the calling class.
#include "model/decoder.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "core/check.h"
#include "mhsa/grammar.h"
#include "model/speculative.h"

namespace mhsa::detail {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace mhsa::detail

namespace mhsa {
void ModelCache::reset() {
  for (KVCache& k : layers_) k.reset();
}
void ModelCache::truncate(int64_t length) {
  if (length < 0 || length > this->length())
    detail::fail("ModelCache::truncate", "length", detail::message("a length in [0, ", this->length(), "] (the tokens held)"),
                 std::to_string(length));
  for (KVCache& k : layers_) k.truncate(length);
}
}  // namespace mhsa

namespace mhsa::detail {

void check_sampling(std::string_view fn, const GenerationOptions& o, int64_t vocab) {
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    fail(fn, "temperature", "a finite value >= 0 (0 is greedy)", std::to_string(o.temperature));
  if (o.top_k < 0) fail(fn, "top_k", "a count >= 0 (0 keeps every token)", std::to_string(o.top_k));
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) fail(fn, "top_p", "a value in (0, 1]", std::to_string(o.top_p));
  if (!(o.repetition_penalty > 0.0f) || !std::isfinite(o.repetition_penalty))
    fail(fn, "repetition_penalty", "a finite value > 0 (1 is none)", std::to_string(o.repetition_penalty));
  if (!std::isfinite(o.presence_penalty))
    fail(fn, "presence_penalty", "a finite value (0 is none)", std::to_string(o.presence_penalty));
  if (!std::isfinite(o.frequency_penalty))
    fail(fn, "frequency_penalty", "a finite value (0 is none)", std::to_string(o.frequency_penalty));
  for (size_t i = 0; i < o.logit_bias.size(); ++i) {
    const auto [id, bias] = o.logit_bias[i];
    if (id < 0 || id >= vocab)
      fail(fn, message("logit_bias[", i, "]"), message("a token id in [0, ", vocab, ")"), std::to_string(id));
    if (!std::isfinite(bias)) fail(fn, message("logit_bias[", i, "]"), "a finite bias", std::to_string(bias));
  }
  if (o.constraint && o.constraint->vocabulary().size() > vocab)
    fail(fn, "constraint", message("a vocabulary of at most the model's ", vocab, " tokens"),
         message(o.constraint->vocabulary().size(), " tokens"));
}

Tensor random_tensor(std::vector<int64_t> dims, float std, uint64_t& state) {
  Tensor t(std::move(dims));
  const float a = std * std::sqrt(3.0f);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data()[i] = a * (static_cast<float>(splitmix(state) >> 40) * 0x1.0p-23f - 1.0f);
  return t;
}

std::vector<KVCache> new_caches(const Decoder& d, int64_t batch, int64_t max_tokens) {
  const std::string fn = message(d.cls, "::new_cache");
  const ModelConfig& c = *d.stack.config;
  if (batch <= 0) fail(fn, "batch", "a count > 0", std::to_string(batch));
  if (max_tokens <= 0 || max_tokens > c.max_positions)
    fail(fn, "max_tokens", message("a count in [1, ", c.max_positions, "] (", d.context_key, ", the context length)"),
         std::to_string(max_tokens));
  std::vector<KVCache> caches;
  caches.reserve(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l)
    caches.emplace_back(batch, c.num_kv_heads, max_tokens, c.head_dim, c.head_dim, d.kv_type);
  return caches;
}

namespace {

// Throws unless ids [B, n] can run over caches; `arg` prefixes the argument names in messages
// ("" for extend's own arguments, "seqs[i]." for a sequence of step).
void check_extend(const std::string& fn, const Decoder& d, const std::vector<KVCache>& caches,
                  std::span<const int32_t> ids, int64_t B, int64_t n, const std::string& arg) {
  const ModelConfig& c = *d.stack.config;
  const int64_t V = c.vocab_size;
  if (caches.size() != d.stack.layers.size())
    fail(fn, arg + "cache", message("a cache of this model (", d.stack.layers.size(), " layers)"),
         message(caches.size(), " layers"));
  const KVCache& first = caches[0];
  if (first.kv_heads() != c.num_kv_heads || first.head_dim() != c.head_dim)
    fail(fn, arg + "cache", message("a cache of this model (", c.num_kv_heads, " kv heads of ", c.head_dim, ")"),
         message(first.kv_heads(), " kv heads of ", first.head_dim()));
  if (B != first.batch()) fail(fn, arg + "B", message(first.batch(), " (the cache's batch)"), std::to_string(B));
  if (n <= 0) fail(fn, arg + "n", "at least one token", std::to_string(n));
  const int64_t pos0 = first.length();
  if (n > first.capacity() - pos0)
    fail(fn, arg + "n", message("at most ", first.capacity() - pos0, " more tokens (cache holds ", pos0, " of ",
                                first.capacity(), "; the model's context is ", c.max_positions, ")"),
         std::to_string(n));
  if (static_cast<int64_t>(ids.size()) != B * n)  // B and n are at most the cache's batch and capacity: no overflow
    fail(fn, arg + "ids", message(B * n, " ids (B·n = ", B, "·", n, ")"), std::to_string(ids.size()));
  for (int64_t i = 0; i < B * n; ++i)
    if (ids[static_cast<size_t>(i)] < 0 || ids[static_cast<size_t>(i)] >= V)
      fail(fn, message(arg, "ids[", i / n, ", ", i % n, "]"), message("a token id in [0, ", V, ")"),
           std::to_string(ids[static_cast<size_t>(i)]));
}

}  // namespace

Tensor extend(const Decoder& d, std::vector<KVCache>& caches, std::span<const int32_t> ids, int64_t B, int64_t n,
              bool last_only) {
  check_extend(message(d.cls, "::extend"), d, caches, ids, B, n, "");
  return nn::stack_forward(d.stack, ids, B, n, &caches, last_only, nullptr);
}

namespace {

// Throws unless ids can run over a paged sequence: a pool of this model's shape, blocks held for
// every token up to the new ones, the blocks written held by this sequence alone.
void check_paged(const std::string& fn, const Decoder& d, const PagedSequence& q, std::span<const int32_t> ids,
                 const std::string& arg) {
  const ModelConfig& c = *d.stack.config;
  if (!q.pool) fail(fn, arg + "paged", "a sequence of a pool", "no pool");
  const KVBlockPool& pool = *q.pool;
  if (pool.layers() != c.num_layers || pool.kv_heads() != c.num_kv_heads || pool.head_dim() != c.head_dim ||
      pool.v_head_dim() != c.head_dim)
    fail(fn, arg + "paged", message("a pool of this model (", c.num_layers, " layers, ", c.num_kv_heads, " kv heads of ",
                                    c.head_dim, ")"),
         message(pool.layers(), " layers, ", pool.kv_heads(), " kv heads of ", pool.head_dim()));
  const auto n = static_cast<int64_t>(ids.size());
  if (n <= 0) fail(fn, arg + "ids", "at least one token", "none");
  if (q.length < 0 || n > c.max_positions - q.length)
    fail(fn, arg + "ids", message("at most ", c.max_positions - q.length, " more tokens (the sequence holds ", q.length,
                                  "; the model's context is ", c.max_positions, ")"),
         std::to_string(n));
  const int64_t blocks = pool.blocks_for(q.length + n);
  if (static_cast<int64_t>(q.blocks.size()) < blocks)
    fail(fn, arg + "paged.blocks", message(blocks, " blocks at least (", q.length + n, " tokens)"),
         message(q.blocks.size()));
  for (int64_t i = 0; i < blocks; ++i) {
    const int32_t b = q.blocks[static_cast<size_t>(i)];
    pool.check_held(b, "paged.blocks");
    if (i >= q.length / pool.block_tokens() && pool.holders(b) != 1)  // written by this step
      fail(fn, message(arg, "paged.blocks[", i, "]"), "a block of this sequence alone (it is written)",
           message("a block shared by ", pool.holders(b)));
  }
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab_size)
      fail(fn, message(arg, "ids[", i, "]"), message("a token id in [0, ", c.vocab_size, ")"), std::to_string(ids[i]));
}

}  // namespace

Tensor step(const Decoder& d, std::span<const nn::SeqStep> seqs) {
  const std::string fn = message(d.cls, "::step");
  if (seqs.empty()) fail(fn, "seqs", "at least one sequence", "none");
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::string arg = message("seqs[", i, "].");
    if (!seqs[i].ids.empty() && (seqs[i].logit_rows < 1 || seqs[i].logit_rows > static_cast<int64_t>(seqs[i].ids.size())))
      fail(fn, arg + "logit_rows", message("a count in [1, ", seqs[i].ids.size(), "] (its new tokens)"),
           std::to_string(seqs[i].logit_rows));
    if (seqs[i].paged) {
      if (seqs[i].caches) fail(fn, arg + "cache", "no cache with a paged sequence", "both");
      for (size_t j = 0; j < i; ++j)
        if (seqs[j].paged == seqs[i].paged) fail(fn, arg + "paged", "a sequence of its own", message("seqs[", j, "]'s"));
      check_paged(fn, d, *seqs[i].paged, seqs[i].ids, arg);
      continue;
    }
    if (!seqs[i].caches) fail(fn, arg + "cache", "a cache", "null");
    for (size_t j = 0; j < i; ++j)
      if (seqs[j].caches == seqs[i].caches) fail(fn, arg + "cache", "a cache of its own", message("seqs[", j, "]'s"));
    const std::vector<KVCache>& caches = *seqs[i].caches;
    if (!caches.empty() && caches[0].batch() != 1)
      fail(fn, arg + "cache", "a cache of one sequence (batch 1)", message("batch ", caches[0].batch()));
    check_extend(fn, d, caches, seqs[i].ids, 1, static_cast<int64_t>(seqs[i].ids.size()), arg);
  }
  return nn::stack_step(d.stack, seqs);
}

Tensor forward(const Decoder& d, std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<Tensor>* attention) {
  const std::string fn = message(d.cls, "::forward");
  const ModelConfig& c = *d.stack.config;
  if (T > c.max_positions)
    fail(fn, "T", message("at most ", d.context_key, " = ", c.max_positions, " tokens"), std::to_string(T));
  if (B <= 0 || T <= 0) fail(fn, "ids", "a non-empty batch [B, T]", message("[", B, ", ", T, "]"));
  Decoder exact = d;  // no cache outlives the forward: its keys and values stay float32 whatever kv_type says
  exact.kv_type = KVType::f32;
  std::vector<KVCache> caches = new_caches(exact, B, T);
  if (!attention) return extend(exact, caches, ids, B, T, false);
  if (static_cast<int64_t>(ids.size()) != B * T)
    fail(fn, "ids", message(B * T, " ids (B·T = ", B, "·", T, ")"), std::to_string(ids.size()));
  for (int64_t i = 0; i < B * T; ++i)
    if (ids[static_cast<size_t>(i)] < 0 || ids[static_cast<size_t>(i)] >= c.vocab_size)
      fail(fn, message("ids[", i / T, ", ", i % T, "]"), message("a token id in [0, ", c.vocab_size, ")"),
           std::to_string(ids[static_cast<size_t>(i)]));
  return nn::stack_forward(d.stack, ids, B, T, nullptr, false, attention);
}

Tensor hidden_states(const Decoder& d, std::span<const int32_t> ids, int64_t B, int64_t T) {
  const std::string fn = message(d.cls, "::hidden_states");
  const ModelConfig& c = *d.stack.config;
  if (T > c.max_positions)
    fail(fn, "T", message("at most ", d.context_key, " = ", c.max_positions, " tokens"), std::to_string(T));
  if (B <= 0 || T <= 0) fail(fn, "ids", "a non-empty batch [B, T]", message("[", B, ", ", T, "]"));
  Decoder exact = d;  // as forward: float32 keys and values
  exact.kv_type = KVType::f32;
  std::vector<KVCache> caches = new_caches(exact, B, T);
  check_extend(fn, exact, caches, ids, B, T, "");
  return nn::stack_hidden(exact.stack, ids, B, T, &caches);
}

double loss_and_gradients(const Decoder& d, std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B,
                          int64_t T, std::vector<Tensor>* grads, const std::function<void(size_t)>& on_final) {
  const std::string fn = message(d.cls, "::loss_and_gradients");
  const ModelConfig& c = *d.stack.config;
  const int64_t V = c.vocab_size;
  if (B <= 0 || T <= 0 || T > c.max_positions)
    fail(fn, "ids", message("a batch [B, T] with 1 <= T <= ", d.context_key, " = ", c.max_positions),
         message("[", B, ", ", T, "]"));
  const int64_t rows = checked_count(message(fn, ": ids [B, T]"), {B, T}, sizeof(int32_t));
  if (static_cast<int64_t>(ids.size()) != rows || static_cast<int64_t>(targets.size()) != rows)
    fail(fn, "ids, targets", message(rows, " ids each (B·T)"), message(ids.size(), " and ", targets.size()));
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)], t = targets[static_cast<size_t>(i)];
    if (id < 0 || id >= V)
      fail(fn, message("ids[", i / T, ", ", i % T, "]"), message("a token id in [0, ", V, ")"), std::to_string(id));
    if (t < -1 || t >= V)
      fail(fn, message("targets[", i / T, ", ", i % T, "]"), message("a token id in [0, ", V, ") or -1 (ignored)"),
           std::to_string(t));
    counted += t >= 0;
  }
  const std::vector<const Tensor*>& params = d.stack.params;
  if (grads) {
    if (grads->size() != params.size())
      fail(fn, "grads", message(params.size(), " tensors (zero_gradients())"), std::to_string(grads->size()));
    for (size_t i = 0; i < params.size(); ++i)
      if ((*grads)[i].defined() && (*grads)[i].shape() != params[i]->shape())  // undefined: frozen
        fail(fn, message("grads[", i, "]"), "the shape of " + d.names[i], "another shape");
  }
  if (counted == 0) {
    if (grads && on_final) on_final(0);
    return 0.0;
  }
  return nn::stack_loss(d.stack, ids, targets, B, T, counted, grads, on_final);
}

// ---- generation ------------------------------------------------------------------------------

namespace {

// std::max_element's index (the first of equal maxima, as torch.argmax; a NaN is never taken
// unless it is the first logit, where torch.argmax would take any) at ~3× its speed: 16
// independent running maxima (side-by-side maxss chains: `m < x ? x : m` keeps m when x is NaN, as
// max_element's `<` does), then the first logit equal to the largest. A server samples 8 × 50,257
// logits a step while the model waits; max_element's single compare chain took 0.2 ms of it.
int32_t argmax(std::span<const float> logits) {
  const size_t V = logits.size();
  const float* x = logits.data();
  if (V == 0 || std::isnan(x[0])) return 0;
  constexpr size_t kLanes = 16;
  float m[kLanes];
  std::fill(m, m + kLanes, x[0]);
  size_t i = 0;
  for (; i + kLanes <= V; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) m[j] = m[j] < x[i + j] ? x[i + j] : m[j];
  for (; i < V; ++i) m[0] = m[0] < x[i] ? x[i] : m[0];
  float best = m[0];
  for (size_t j = 1; j < kLanes; ++j) best = best < m[j] ? m[j] : best;
  return static_cast<int32_t>(std::find(x, x + V, best) - x);
}

// The weight e^−x of a token x = (largest logit − its logit) / temperature above the largest
// (x >= 0, or +inf), and its bucket: x in [0, 88) spread over kBuckets, kNoBucket once the weight
// is 0 (x > 87, past float's normal range). e^−x = 2^k · e^r with |r| <= ln2/2 and e^r's degree-6
// Taylor polynomial (error below 2e-7 relative). Plain arithmetic, and the test for x > 87 made
// on x's bits (a float compare keeps GCC from vectorising under its default -ftrapping-math), so
// that a loop of it vectorises, where std::exp is a call per element.
constexpr uint16_t kBuckets = 2048, kNoBucket = kBuckets;
inline void weigh(float x, float& weight, uint16_t& bucket) {
  const uint32_t bits = std::bit_cast<uint32_t>(x), high = std::bit_cast<uint32_t>(87.0f);
  const uint32_t in = bits > high ? 0u : ~0u;  // x <= 87 (for x >= 0, a larger x has larger bits)
  const float c = -std::bit_cast<float>((bits & in) | (high & ~in));  // −x clamped to [−87, 0]
  const float t = c * 1.44269504f + 12582912.0f;  // 1.5·2^23: t's low bits are round(c·log2 e)
  const float k = t - 12582912.0f;
  const float r = (c - k * 0.693145751953125f) - k * 1.428606765330187e-6f;  // c − k·ln 2, ln 2 in two parts
  const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  const uint32_t two_k = static_cast<uint32_t>(std::bit_cast<int32_t>(t) - 0x4B400000 + 127) << 23;  // k >= −126
  weight = p * std::bit_cast<float>(two_k & in);
  const int32_t b = static_cast<int32_t>(-c * (kBuckets / 88.0f));  // in [0, kBuckets): −c <= 87
  bucket = static_cast<uint16_t>((static_cast<uint32_t>(b) & in) | (kNoBucket & ~in));
}

// weigh over keys [0, V) (below the largest, `top`), compiled for AVX-512 and AVX2 as well where
// GCC can pick at run time (16 or 8 lanes with FMA rather than SSE2's 4 without).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2,fma", "default")))
#endif
void weigh_all(const float* key, size_t V, float top, float inv_t, float* weight, uint16_t* bucket) {
  for (size_t i = 0; i < V; ++i) weigh((top - key[i]) * inv_t, weight[i], bucket[i]);
}

// Of ids (ascending), the smallest set of the largest keys (between equal keys, the lower id
// first) whose weight reaches `need`, added to `out`: the ids of the buckets wholly inside it
// (ascending), then those of the bucket where the running weight reaches `need`, cut the same
// way (its keys spread again over kBuckets), or, once few or all equal, sorted; all of ids when
// they fall short (rounding). With `bucket`, the ids are every token of a bucket other than
// kNoBucket, and it gives their buckets. O(ids) a level; a level narrows the keys' range
// kBuckets-fold.
void select_largest(std::span<const int32_t> ids, const uint16_t* bucket, size_t V, const float* key,
                    const float* weight, double need, std::vector<int32_t>& out) {
  float lo = 0, hi = 0;
  double scale = 0;
  if (!bucket) {
    lo = std::numeric_limits<float>::infinity();
    hi = -lo;
    for (const int32_t id : ids) {
      lo = std::min(lo, key[id]);
      hi = std::max(hi, key[id]);
    }
    if (ids.size() <= 64 || lo == hi) {
      std::vector<int32_t> sorted;
      std::span<const int32_t> order = ids;  // equal keys: in order already (by id)
      if (lo != hi) {
        sorted.assign(ids.begin(), ids.end());
        std::sort(sorted.begin(), sorted.end(),
                  [&](int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); });
        order = sorted;
      }
      double have = 0;
      for (const int32_t id : order) {
        if (have >= need && have > 0) break;  // (need <= 0: the largest alone)
        out.push_back(id);
        have += weight[id];
      }
      return;
    }
    scale = (kBuckets - 1) / (static_cast<double>(hi) - lo);
  }
  const auto bucket_of = [&](int32_t id) {  // 0: the largest keys; non-decreasing as the key falls
    return bucket ? bucket[id]
                  : static_cast<uint16_t>(std::min<double>(kBuckets - 1, (static_cast<double>(hi) - key[id]) * scale));
  };
  std::vector<double> mass(kBuckets + 1, 0.0);
  if (bucket) {  // four histograms, summed after: runs of one bucket are not one chain of adds
    std::vector<double> part(4 * (kBuckets + 1), 0.0);
    size_t i = 0;
    for (; i + 4 <= V; i += 4)
      for (size_t j = 0; j < 4; ++j) part[j * (kBuckets + 1) + bucket[i + j]] += weight[i + j];
    for (; i < V; ++i) part[bucket[i]] += weight[i];
    for (size_t b = 0; b < kBuckets; ++b)  // ([kNoBucket]: unused)
      mass[b] = (part[b] + part[kBuckets + 1 + b]) + (part[2 * (kBuckets + 1) + b] + part[3 * (kBuckets + 1) + b]);
  } else {
    for (const int32_t id : ids) mass[bucket_of(id)] += weight[id];
  }
  size_t cut = 0;
  double have = 0;
  for (; cut < kBuckets && have + mass[cut] < need; ++cut) have += mass[cut];
  std::vector<int32_t> edge;  // the cut bucket's ids, ascending
  const auto place = [&](int32_t id) {
    const size_t b = bucket_of(id);
    if (b < cut) out.push_back(id);
    else if (b == cut) edge.push_back(id);
  };
  if (bucket) {
    for (size_t i = 0; i < V; ++i)
      if (bucket[i] != kNoBucket) place(static_cast<int32_t>(i));
  } else {
    for (const int32_t id : ids) place(id);
  }
  if (cut < kBuckets) select_largest(edge, nullptr, 0, key, weight, need - have, out);
}

// The k largest keys above −inf (between equal keys, the lower id first), in
// `out`, ascending: one pass that keeps those past a running bar in a buffer, cut back to the k
// largest (nth_element) whenever it holds 4k, the bar then the k-th's key. Ids come in ascending
// order, so once k are kept, a key equal to the bar comes after them all.
void select_top_k(const float* key, size_t V, size_t k, std::vector<int32_t>& out) {
  const auto before = [&](int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); };
  const auto cut = [&] {
    std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k - 1), out.end(), before);
    out.resize(k);
  };
  out.clear();
  bool full = false;
  float bar = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < V; ++i) {
    if (key[i] < bar || (full && key[i] == bar) || key[i] == -std::numeric_limits<float>::infinity()) continue;
    out.push_back(static_cast<int32_t>(i));
    if (out.size() < 4 * k) continue;
    cut();
    bar = key[*std::max_element(out.begin(), out.end(), before)];  // the last in `before` order
    full = true;
  }
  if (out.size() > k) cut();
  std::sort(out.begin(), out.end());
}

// An index i in [0, n) drawn with probability weight(i) / Σ weight (weight >= 0, not all 0) with
// the generator: the sums of blocks of kDrawBlock (each summed in double as 8 side-by-side chains,
// so that it does not wait on one chain of adds), the block where their running sum passes u, then
// the index within it. The same weights and state give the same index.
constexpr size_t kDrawBlock = 256;
template <class Weight>
size_t draw_index(size_t n, Weight weight, uint64_t& rng_state, std::vector<double>& sums) {
  constexpr size_t kLanes = 8;
  sums.assign((n + kDrawBlock - 1) / kDrawBlock, 0.0);
  double total = 0;
  for (size_t b = 0; b < sums.size(); ++b) {
    double lane[kLanes] = {};
    const size_t i0 = b * kDrawBlock, i1 = std::min(n, i0 + kDrawBlock);
    size_t i = i0;
    for (; i + kLanes <= i1; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) lane[j] += weight(i + j);
    for (; i < i1; ++i) lane[0] += weight(i);
    for (size_t j = 0; j < kLanes; ++j) sums[b] += lane[j];
    total += sums[b];
  }
  const double u = static_cast<double>(splitmix(rng_state) >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  size_t b = 0;
  for (; b < sums.size() && !(u < acc + sums[b]); ++b) acc += sums[b];
  size_t last = n;  // the last index with a weight where the sums round short of u
  if (b < sums.size()) {
    for (size_t i = b * kDrawBlock, i1 = std::min(n, i + kDrawBlock); i < i1; ++i) {
      if (weight(i) == 0.0f) continue;
      acc += weight(i);
      last = i;
      if (u < acc) return i;
    }
    return last;
  }
  while (last > 0 && weight(last - 1) == 0.0f) --last;
  return last - 1;
}

// The candidates' total weight: every token's (all), else those of ids; the former as side-by-side
// chains, as draw_index sums.
double weight_sum(bool all, std::span<const int32_t> ids, const float* weight, size_t V) {
  double total = 0;
  if (all) {
    constexpr size_t kLanes = 8;
    double lane[kLanes] = {};
    size_t i = 0;
    for (; i + kLanes <= V; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) lane[j] += weight[i + j];
    for (; i < V; ++i) lane[0] += weight[i];
    for (const double l : lane) total += l;
  }
  for (const int32_t id : ids) total += weight[id];
  return total;
}

// A token drawn from softmax(logits / temperature) cut to the top_k largest logits, then to the
// smallest set of the most likely of those whose probability reaches top_p (between equal
// logits, the lower id first; a NaN logit is never drawn, nor one more than 87 temperatures below
// the largest, whose weight is below float's range). Neither cut sorts the vocabulary
// (select_largest), the weights are one vectorised pass (weigh), and the draw without a cut finds
// its block of 256 tokens by their sums: GPT-2's 50,257 logits took 4.2-4.5 ms a draw when they
// were all sorted, paid by a server per sequence per step on the thread the model waits for
// (docs/performance.md, 2026-12-01). The same logits and generator state give the same token.
//
// With a draft token (speculative decoding; `accepted` then says what became of it): the draft is
// returned with its probability under this rule, weight[draft] / Σ weight, and otherwise a token
// drawn from the same weights with the draft's set to 0 — in all, each token with its probability.
int32_t draw(std::span<const float> logits, const GenerationOptions& o, uint64_t& rng_state, int32_t draft = -1,
             bool* accepted = nullptr) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const size_t V = logits.size();
  // Kept per thread: allocated afresh, GPT-2's 0.8 MB of them went back to the system after every
  // draw and was faulted in again at the next.
  struct Scratch {
    std::vector<float> key, weight;
    std::vector<uint16_t> bucket;
    std::vector<int32_t> ids, kept;
    std::vector<double> sums;
  };
  thread_local Scratch w;
  w.key.resize(V);
  w.weight.resize(V);
  w.bucket.resize(V);
  float *key = w.key.data(), *weight = w.weight.data();
  uint16_t* bucket = w.bucket.data();
  constexpr size_t kMaxima = 16;  // the largest key as argmax finds it
  float m[kMaxima];
  std::fill(m, m + kMaxima, -kInf);
  for (size_t i = 0; i < V; ++i) {  // NaN: −inf
    const uint32_t bits = std::bit_cast<uint32_t>(logits[i]);
    const uint32_t nan = (bits & 0x7FFFFFFFu) > 0x7F800000u ? ~0u : 0u;
    key[i] = std::bit_cast<float>((bits & ~nan) | (std::bit_cast<uint32_t>(-kInf) & nan));
  }
  const size_t full = V / kMaxima * kMaxima;
  for (size_t i = 0; i < full; i += kMaxima)
    for (size_t j = 0; j < kMaxima; ++j) m[j] = m[j] < key[i + j] ? key[i + j] : m[j];
  for (size_t i = full; i < V; ++i) m[0] = m[0] < key[i] ? key[i] : m[0];
  float top = *std::max_element(m, m + kMaxima);
  if (top == -kInf) return argmax(logits);  // no token has a probability
  if (top == kInf) {  // the +inf logits share all of it
    for (size_t i = 0; i < V; ++i) key[i] = key[i] == kInf ? 0.0f : -kInf;
    top = 0.0f;
  }
  // (A temperature so small that 1/t overflows: the largest alone, as 0 · FLT_MAX is 0.)
  const float inv_t = 1.0f / o.temperature <= std::numeric_limits<float>::max() ? 1.0f / o.temperature
                                                                                 : std::numeric_limits<float>::max();
  std::vector<int32_t>& ids = w.ids;  // the candidates; while `all`, every token with a weight (ids unused)
  std::vector<int32_t>& kept = w.kept;
  bool all = true;
  ids.clear();
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < V) {  // only those weighed
    select_top_k(key, V, static_cast<size_t>(o.top_k), ids);
    for (const int32_t id : ids) weigh((top - key[id]) * inv_t, weight[id], bucket[id]);
    all = false;
  } else {
    weigh_all(key, V, top, inv_t, weight, bucket);
  }
  if (o.top_p < 1.0f) {
    const double total = weight_sum(all, ids, weight, V);
    kept.clear();
    select_largest(ids, all ? bucket : nullptr, V, key, weight, static_cast<double>(o.top_p) * total, kept);
    ids.swap(kept);
    all = false;
  }
  if (draft >= 0 && static_cast<size_t>(draft) < V) {
    const double total = weight_sum(all, ids, weight, V);
    const double mine = all || std::find(ids.begin(), ids.end(), draft) != ids.end() ? weight[draft] : 0.0;
    const double u = static_cast<double>(splitmix(rng_state) >> 11) * 0x1.0p-53 * total;
    *accepted = u < mine || mine >= total;  // (the second: nothing else has a weight)
    if (*accepted) return draft;
    if (all) weight[draft] = 0.0f;
    else ids.erase(std::remove(ids.begin(), ids.end(), draft), ids.end());
  }
  if (all) return static_cast<int32_t>(draw_index(V, [&](size_t i) { return weight[i]; }, rng_state, w.sums));
  return ids[draw_index(ids.size(), [&](size_t i) { return weight[ids[i]]; }, rng_state, w.sums)];
}

}  // namespace

void check_logits(std::span<const float> logits, std::string_view fn, int64_t token, int64_t seq) {
  // One pass that vectorises (exponent bits all ones: NaN or ±inf), ~3 µs for 50,257 logits; the
  // culprit is looked for only once one is known to be there.
  uint32_t bad = 0;
  for (const float x : logits) bad |= (std::bit_cast<uint32_t>(x) & 0x7F800000u) == 0x7F800000u;
  if (!bad) return;
  const auto at = std::find_if(logits.begin(), logits.end(), [](float x) { return !std::isfinite(x); });
  fail(fn, message("logits for new token ", token, seq >= 0 ? message(" of sequence ", seq) : std::string()),
       "finite values (a weight or activation of the model is not finite)",
       message(*at, " at token id ", at - logits.begin()));
}

namespace {

// logit_bias, then the presence/frequency and repetition penalties, as sample applies them.
void apply_penalties(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& o,
                     size_t prompt_tokens) {
  const int64_t V = static_cast<int64_t>(logits.size());
  for (const auto& [id, bias] : o.logit_bias)
    if (id >= 0 && id < V) logits[static_cast<size_t>(id)] += bias;
  if (o.presence_penalty != 0.0f || o.frequency_penalty != 0.0f) {  // each generated token, with its count
    std::vector<int32_t> made(history.begin() + static_cast<std::ptrdiff_t>(std::min(prompt_tokens, history.size())),
                              history.end());
    std::sort(made.begin(), made.end());
    for (size_t i = 0; i < made.size();) {
      size_t j = i;
      while (j < made.size() && made[j] == made[i]) ++j;
      if (made[i] >= 0 && made[i] < V)
        logits[static_cast<size_t>(made[i])] -= o.frequency_penalty * static_cast<float>(j - i) + o.presence_penalty;
      i = j;
    }
  }
  if (o.repetition_penalty != 1.0f) {  // each distinct earlier token once, as Hugging Face does
    std::vector<int32_t> seen(history.begin(), history.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= V) continue;
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0 ? l / o.repetition_penalty : l * o.repetition_penalty;
    }
  }
}

}  // namespace

int32_t sample(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& o,
               uint64_t& rng_state, size_t prompt_tokens) {
  apply_penalties(logits, history, o, prompt_tokens);
  if (o.temperature <= 0.0f) return argmax(logits);  // greedy
  return draw(logits, o, rng_state);
}

int32_t sample_draft(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& o,
                     uint64_t& rng_state, size_t prompt_tokens, int32_t draft, bool& accepted) {
  apply_penalties(logits, history, o, prompt_tokens);
  if (o.temperature <= 0.0f) {
    const int32_t t = argmax(logits);
    accepted = t == draft;
    return t;
  }
  accepted = false;
  return draw(logits, o, rng_state, draft, &accepted);
}

std::vector<std::vector<int32_t>> generate(const Decoder& d, std::span<const int32_t> prompts, int64_t B, int64_t T,
                                           const GenerationOptions& o, const TokenCallback& on_token,
                                           GenerationStats* stats) {
  const std::string fn = message(d.cls, "::generate");
  const int64_t context = d.stack.config->max_positions;
  if (B <= 0 || T <= 0) fail(fn, "prompts", "a non-empty batch [B, T] of token ids", message("[", B, ", ", T, "]"));
  if (o.max_new_tokens < 0) fail(fn, "max_new_tokens", "a count >= 0", std::to_string(o.max_new_tokens));
  if (o.max_new_tokens > context - T)  // not T + max_new_tokens: that could overflow
    fail(fn, "max_new_tokens",
         message("at most ", std::max<int64_t>(0, context - T), " (the context is ", context,
                 " tokens and the prompt has ", T, ")"),
         std::to_string(o.max_new_tokens));
  check_sampling(fn, o, d.stack.config->vocab_size);
  check_speculation(fn, o.speculation, d.stack.config->vocab_size);
  if (o.speculation.draft_tokens > 0 && B != 1)
    fail(fn, "speculation.draft_tokens", "0 with several prompts (speculative decoding runs one sequence)",
         message(o.speculation.draft_tokens, " with ", B, " prompts"));
  if (static_cast<int64_t>(prompts.size()) / T != B || static_cast<int64_t>(prompts.size()) % T != 0)  // B·T could overflow
    fail(fn, "prompts", message(B, "·", T, " ids (B·T)"), std::to_string(prompts.size()));

  using clock = std::chrono::steady_clock;
  GenerationStats st;
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
  if (o.max_new_tokens == 0) {
    if (stats) *stats = st;
    return out;
  }
  std::vector<KVCache> cache = new_caches(d, B, T + o.max_new_tokens);
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(B));
  std::vector<uint64_t> rng(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    history[static_cast<size_t>(b)].assign(prompts.begin() + b * T, prompts.begin() + (b + 1) * T);
    rng[static_cast<size_t>(b)] = o.seed * 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(b);
  }
  auto t0 = clock::now();
  Tensor logits = extend(d, cache, prompts, B, T, true);
  st.prefill_tokens = B * T;
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  t0 = clock::now();
  const int64_t V = d.stack.config->vocab_size;
  if (B == 1) {  // one sequence: the shared loop, with speculation when asked
    std::vector<int32_t>& hist = history[0];
    const SequenceRunner run{
        [&](std::span<const int32_t> ids) { return extend(d, cache, ids, 1, static_cast<int64_t>(ids.size()), false); },
        [&](int64_t n) {
          for (KVCache& c : cache) c.truncate(n);
        },
        [&] { return cache[0].length(); }, {}};
    const std::unique_ptr<Drafter> drafter = make_drafter(o.speculation, T + o.max_new_tokens);
    int64_t step = 0;
    int32_t token = 0;
    const DecodeResult r = decode_sequence(
        run, hist, static_cast<size_t>(T), {logits.data(), static_cast<size_t>(V)}, o, rng[0], drafter.get(),
        DecodeLimits{o.max_new_tokens, context, exact_rows(d.stack), fn}, [&](int32_t t) {
          out[0].push_back(t);
          token = t;
          const bool eos = o.stop_at_eos && std::find(d.eos.begin(), d.eos.end(), t) != d.eos.end();
          const bool go_on = !on_token || on_token(step++, std::span(&token, 1));
          return go_on && !eos ? Take::more : Take::last;
        });
    st.decode_tokens = std::max<int64_t>(0, r.tokens - 1);
    st.speculation = r.stats;
    st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    if (stats) *stats = st;
    return out;
  }
  const int32_t pad = d.eos.empty() ? -1 : d.eos[0];
  std::vector<ConstraintState> constraint;  // one per sequence
  if (o.constraint)
    for (int64_t b = 0; b < B; ++b) constraint.push_back(o.constraint->start());
  std::vector<char> done(static_cast<size_t>(B), 0);
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = static_cast<size_t>(b);
      if (done[i]) {
        tokens[i] = pad;
        continue;
      }
      check_logits({logits.data() + b * V, static_cast<size_t>(V)}, fn, step + 1, B > 1 ? b : -1);
      if (o.constraint) constraint[i].mask({logits.data() + b * V, static_cast<size_t>(V)});
      tokens[i] = sample({logits.data() + b * V, static_cast<size_t>(V)}, history[i], o, rng[i], static_cast<size_t>(T));
      if (o.constraint) constraint[i].advance(tokens[i]);
      history[i].push_back(tokens[i]);
      out[i].push_back(tokens[i]);
      if (o.stop_at_eos && std::find(d.eos.begin(), d.eos.end(), tokens[i]) != d.eos.end()) done[i] = 1;
    }
    const bool go_on = !on_token || on_token(step, tokens);
    if (!go_on || std::all_of(done.begin(), done.end(), [](char d) { return d != 0; }) ||
        step + 1 == o.max_new_tokens)
      break;
    logits = extend(d, cache, tokens, B, 1, true);
    st.decode_tokens += B;
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (stats) *stats = st;
  return out;
}

}  // namespace mhsa::detail
