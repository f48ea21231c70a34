// mhsa/evaluate.h — measuring a model's quality on text: perplexity as llama.cpp's
// llama-perplexity computes it, and the log-probability of every token of a text (what
// lm-evaluation-harness's loglikelihood tasks ask a server for); and the hidden states a text
// leaves after the final norm (what the server's embeddings pool).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mhsa/model.h"

namespace mhsa {

struct PerplexityOptions {
  int64_t context = 512;   // tokens per chunk (llama-perplexity's -c)
  int64_t max_chunks = 0;  // 0: every whole chunk of the text (--chunks)
  int32_t bos = -1;        // ≥ 0: each chunk's first token replaced by this id, as llama-perplexity does
                           // for a vocabulary that adds BOS; -1: the text's own tokens
};

struct PerplexityResult {
  double ppl = 0;        // exp(mean negative log-likelihood)
  double ppl_error = 0;  // its standard error: ppl · sqrt(var(nll) / (n − 1)), llama-perplexity's ±
  double nll_mean = 0;   // mean negative log-likelihood in nats
  int64_t chunks = 0, scored_tokens = 0, context = 0;
  std::vector<double> running;  // the estimate after each chunk (llama-perplexity's "[i]ppl")
};

// Called after each chunk with the chunks done, the chunks in all and the running estimate.
using PerplexityProgress = std::function<void(int64_t done, int64_t total, double running_ppl)>;

// llama-perplexity's method: ids (the whole text, tokenized once) cut into ⌊n / context⌋ chunks
// (at most max_chunks), each run alone from position 0; in each, the tokens after the first half
// are scored — token j + 1 from the logits at j, for context/2 ≤ j < context − 1 — with
// −log softmax in double; the chunks' sums give exp(mean). A model whose kv_type() is not f32
// runs each chunk over a fresh cache of that type (its keys and values stored, then attended over,
// as generation does), otherwise through forward(). Throws mhsa::Error when context is
// below 4 or above the model's max_positions, when ids hold fewer than 2 · context tokens (as
// llama-perplexity requires), or an id is out of the vocabulary.
PerplexityResult perplexity(const Model& model, std::span<const int32_t> ids, const PerplexityOptions& options = {},
                            const PerplexityProgress& progress = {});

// The log-probability of each token of ids given the ones before it (the first has none: NaN),
// with the `top` most likely tokens at each position (most likely first; none for the first),
// computed over a fresh cache `chunk` tokens at a time so that memory stays O(chunk · V).
struct TokenScore {
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;
};
std::vector<TokenScore> score_tokens(const Model& model, std::span<const int32_t> ids, int top = 0,
                                     int64_t chunk = 256);

// The final norm's output [B, T, C] of ids [B, T], positions 0..T-1: the hidden states the LM
// head reads (forward's logits are them times the output matrix), keys and values kept in float32.
// Causal: a row depends only on the ids up to it, so right-padding a shorter sequence leaves its
// rows as they are alone. Throws mhsa::Error naming the argument (T past the context, an id out of
// the vocabulary).
Tensor hidden_states(const Model& model, std::span<const int32_t> ids, int64_t B, int64_t T);

}  // namespace mhsa
