// model/decoder.h — what every model class shares above the nn stack (nn/block.h): the checks of
// its arguments, the forward over a KV cache, generation with its sampler, and the training loss.
// Gpt2 and Model are thin: they build an nn::Stack and call these. Not public.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mhsa/model.h"
#include "nn/block.h"

namespace mhsa::detail {

struct Decoder {
  const nn::Stack& stack;
  std::string_view cls;              // "Gpt2", "Model": the class named in messages
  std::string_view context_key;      // the config key of the context length, for messages
  std::span<const int32_t> eos;      // end-of-sequence tokens (the first pads finished sequences)
  std::span<const std::string> names;  // the parameters' names, in stack.params order
  KVTypes kv_type;                     // the element types of the caches new_caches makes
};

std::vector<KVCache> new_caches(const Decoder& d, int64_t batch, int64_t max_tokens);
Tensor extend(const Decoder& d, std::vector<KVCache>& caches, std::span<const int32_t> ids, int64_t B, int64_t n,
              bool last_only);
// Model::step: every sequence checked (its own batch-1 cache, room, ids) before any runs.
Tensor step(const Decoder& d, std::span<const nn::SeqStep> seqs);
Tensor forward(const Decoder& d, std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<Tensor>* attention);
Tensor hidden_states(const Decoder& d, std::span<const int32_t> ids, int64_t B, int64_t T);
std::vector<std::vector<int32_t>> generate(const Decoder& d, std::span<const int32_t> prompts, int64_t B, int64_t T,
                                           const GenerationOptions& o, const TokenCallback& on_token,
                                           GenerationStats* stats);
// Throws mhsa::Error naming the option for a sampling setting out of range (temperature, top_k,
// top_p, repetition_penalty, presence_penalty, frequency_penalty, logit_bias against `vocab`).
void check_sampling(std::string_view fn, const GenerationOptions& o, int64_t vocab);
int32_t sample(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& o,
               uint64_t& rng_state, size_t prompt_tokens = 0);
// sample's rule for a row whose token was guessed (`draft`, speculative decoding): greedy, the
// argmax (accepted: it is the draft); sampling, the draft with the rule's probability of it, else
// a token drawn with the draft left out (accepted false) — each token with its probability.
int32_t sample_draft(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& o,
                     uint64_t& rng_state, size_t prompt_tokens, int32_t draft, bool& accepted);
// The model's logits for generated token `token` (1 = the first) of sequence `seq` (-1: one
// sequence), checked before anything is sampled from them: a NaN or an infinity means a weight or
// activation that is not finite, and the sampler would turn it into token 0 (a NaN first logit is
// argmax's pick) or a meaningless draw. Throws mhsa::Error "<fn>: logits for new token 3: expected
// finite values (...), got nan at token id 0". Every generation loop calls it: generate, the chat
// session, the server's scheduler.
void check_logits(std::span<const float> logits, std::string_view fn, int64_t token, int64_t seq = -1);
// grads null: the loss only; an undefined tensor in grads: that parameter is frozen (no gradient).
// on_final: as nn::stack_loss's.
double loss_and_gradients(const Decoder& d, std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B,
                          int64_t T, std::vector<Tensor>* grads,
                          const std::function<void(size_t first)>& on_final = {});
// splitmix64: the random stream of samplers and random weights.
uint64_t splitmix(uint64_t& s);
// Zero-mean values with standard deviation `std` (uniform, so √3·std wide): cheap and enough for
// benchmarks and tests, which only need GPT-2-like magnitudes.
Tensor random_tensor(std::vector<int64_t> dims, float std, uint64_t& state);

}  // namespace mhsa::detail
