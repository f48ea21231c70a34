// model/evaluate.cpp — see mhsa/evaluate.h.
#include "mhsa/evaluate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "mhsa/error.h"

namespace mhsa {
using detail::message;

namespace {

// log Σ exp(row), in double from the largest value.
double log_sum_exp(const float* row, int64_t n) {
  double largest = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, static_cast<double>(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i]) - largest);
  return largest + std::log(sum);
}

void check_ids(std::span<const int32_t> ids, int64_t vocab, const char* fn) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw Error(message(fn, ": ids[", i, "]: expected a token id in [0, ", vocab, "), got ", ids[i]));
}

}  // namespace

PerplexityResult perplexity(const Model& model, std::span<const int32_t> ids, const PerplexityOptions& o,
                            const PerplexityProgress& progress) {
  const ModelConfig& c = model.config();
  const int64_t ctx = o.context, n = static_cast<int64_t>(ids.size()), V = c.vocab_size;
  if (ctx < 4 || ctx > c.max_positions)
    throw Error(message("perplexity: context: expected a number of tokens in [4, ", c.max_positions,
                        "] (the model's max_position_embeddings), got ", ctx));
  if (o.max_chunks < 0) throw Error(message("perplexity: max_chunks: expected a count ≥ 0 (0: all), got ", o.max_chunks));
  if (o.bos >= V) throw Error(message("perplexity: bos: expected a token id below ", V, " or -1, got ", o.bos));
  if (n < 2 * ctx)
    throw Error(message("perplexity: ids: expected at least ", 2 * ctx, " tokens (twice the context of ", ctx,
                        "), got ", n, "; give a longer text or a smaller context"));
  check_ids(ids, V, "perplexity");
  int64_t chunks = n / ctx;
  if (o.max_chunks > 0) chunks = std::min(chunks, o.max_chunks);
  const int64_t first = ctx / 2, scored = ctx - 1 - first;

  PerplexityResult r;
  r.context = ctx;
  r.chunks = chunks;
  double nll = 0, nll2 = 0;
  std::vector<int32_t> chunk(static_cast<size_t>(ctx));
  const bool narrow_kv = model.kv_type() != KVType::f32;
  std::vector<double> row_nll(static_cast<size_t>(scored));
  for (int64_t i = 0; i < chunks; ++i) {
    std::copy_n(ids.begin() + i * ctx, ctx, chunk.begin());
    if (o.bos >= 0) chunk[0] = o.bos;
    // A narrower KV type is read as generation reads it: the chunk's keys and values stored in a
    // cache of that type, then attended over (forward keeps them float32).
    const Tensor logits = narrow_kv ? [&] {
      ModelCache cache = model.new_cache(1, ctx);
      return model.extend(cache, chunk, 1, ctx, false);
    }()
                                    : model.forward(chunk, 1, ctx);  // [1, ctx, V]
    const float* L = logits.data();
    // Each row's log-softmax over the vocabulary is independent; the sums below go in order.
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < scored; ++j) {
      const float* row = L + (first + j) * V;
      const int32_t next = ids[static_cast<size_t>(i * ctx + first + j + 1)];
      row_nll[static_cast<size_t>(j)] = log_sum_exp(row, V) - static_cast<double>(row[next]);
    }
    for (double v : row_nll) nll += v, nll2 += v * v;
    r.scored_tokens += scored;
    r.running.push_back(std::exp(nll / static_cast<double>(r.scored_tokens)));
    if (progress) progress(i + 1, chunks, r.running.back());
  }
  const double count = static_cast<double>(r.scored_tokens);
  r.nll_mean = nll / count;
  r.ppl = std::exp(r.nll_mean);
  const double var = nll2 / count - r.nll_mean * r.nll_mean;
  r.ppl_error = var > 0 && count > 1 ? std::sqrt(var / (count - 1)) * r.ppl : 0.0;
  return r;
}

std::vector<TokenScore> score_tokens(const Model& model, std::span<const int32_t> ids, int top, int64_t chunk) {
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(ids.size()), V = c.vocab_size;
  if (n < 1 || n > c.max_positions)
    throw Error(message("score_tokens: ids: expected 1 to ", c.max_positions, " tokens (the model's context), got ", n));
  if (top < 0 || top > V) throw Error(message("score_tokens: top: expected a count in [0, ", V, "], got ", top));
  if (chunk < 1) throw Error(message("score_tokens: chunk: expected a count ≥ 1, got ", chunk));
  check_ids(ids, V, "score_tokens");
  std::vector<TokenScore> out(static_cast<size_t>(n));
  out[0].logprob = std::numeric_limits<double>::quiet_NaN();
  ModelCache cache = model.new_cache(1, n);
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t m = std::min(chunk, n - at);
    const Tensor logits = model.extend(cache, ids.subspan(static_cast<size_t>(at), static_cast<size_t>(m)), 1, m, false);
    const float* L = logits.data();
    // Row j's logits predict token at + j + 1.
    const int64_t rows = std::min(m, n - 1 - at);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t j = 0; j < rows; ++j) {
      const float* row = L + j * V;
      const double lse = log_sum_exp(row, V);
      TokenScore& s = out[static_cast<size_t>(at + j + 1)];
      s.logprob = static_cast<double>(row[ids[static_cast<size_t>(at + j + 1)]]) - lse;
      if (top == 0) continue;
      std::vector<int32_t> order(static_cast<size_t>(V));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      for (int k = 0; k < top; ++k) s.top.emplace_back(order[static_cast<size_t>(k)], static_cast<double>(row[order[static_cast<size_t>(k)]]) - lse);
    }
  }
  return out;
}

}  // namespace mhsa
