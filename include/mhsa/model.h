// mhsa/model.h — a decoder-only language model of any family mhsa knows (GPT-2, Llama, Mistral,
// Qwen2, Qwen3, Gemma 2): load a Hugging Face directory, compute logits, generate over a KV cache,
// train (loss and gradients), and give the explorer its attention probabilities.
//
// A model is its ModelConfig (model_config.h), its parameters by Hugging Face name, and one block
// implementation configured by the config (src/nn/block.h): a family is a config mapping and a
// weight-name map, not a forward of its own. float32 throughout; F16/BF16 checkpoints are widened
// at load. mhsa::Gpt2 (gpt2.h) is GPT-2 with its historical API over the same code.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "mhsa/kv_cache.h"
#include "mhsa/kv_pool.h"
#include "mhsa/model_config.h"
#include "mhsa/tensor.h"

namespace mhsa {

struct ModelAccess;  // src/model/access.h: the nn view of a model, for train/ and explain/
namespace detail {
class GgufModelFile;  // src/model/gguf_model.h
}

// The keys and values of every layer for one batch of sequences: the state of a generation.
class ModelCache {
 public:
  int64_t batch() const { return layers_.empty() ? 0 : layers_[0].batch(); }
  int64_t length() const { return layers_.empty() ? 0 : layers_[0].length(); }
  int64_t capacity() const { return layers_.empty() ? 0 : layers_[0].capacity(); }
  void reset();
  // Every layer's KVCache::truncate(length): the cache as it was after its first `length` tokens,
  // so that a sequence can be continued differently from there (a chat whose history was
  // rendered differently). Throws mhsa::Error, changing nothing, unless 0 ≤ length ≤ length().
  void truncate(int64_t length);

 private:
  friend struct ModelAccess;
  std::vector<KVCache> layers_;
};

class Model;
class Constraint;  // mhsa/grammar.h

// Speculative decoding: up to draft_tokens tokens are guessed ahead of the model and checked in
// one forward (which costs about what one token costs while reading the weights bounds a step),
// the first wrong guess and everything after it dropped, so a step yields 1 to draft_tokens + 1
// tokens. Greedy output is bit for bit that of plain decoding: every row of the checking forward
// takes the same kernels as a one-token step (so at most 7 tokens are checked at once, fewer
// where a model's heads or layout need it). Sampled output has exactly the sampler's
// distribution: a guess d is kept with the sampler's probability p(d), and on a rejection the
// token is drawn from p with d left out (the standard rule for a guess made deterministically).
// Guesses come from the text itself (prompt lookup: the longest of the last ngram_max ..
// ngram_min tokens seen before, the tokens that followed its latest earlier occurrence) or, with
// draft_model, from a smaller model with the same vocabulary, decoding greedily on its own cache.
// Batch 1 only (generate refuses it for several prompts).
struct SpeculationOptions {
  int64_t draft_tokens = 0;            // at most this many guessed a step; 0: no speculation
  int64_t ngram_max = 4, ngram_min = 1;  // prompt lookup's n-gram lengths (1 <= min <= max <= 64)
  const Model* draft_model = nullptr;  // null: prompt lookup (the model must outlive generation)
  // Guess only as many as pay: each step's count is chosen from the sequence's guesses kept so
  // far and the measured cost of a forward's further rows and of drafting (none where none pays,
  // with a single guess now and then to notice a change). false: always draft_tokens.
  bool adaptive = true;
};

struct GenerationOptions {
  int64_t max_new_tokens = 32;
  float temperature = 0.0f;          // 0: greedy (argmax); otherwise logits / temperature are sampled
  int64_t top_k = 0;                 // keep the k most likely tokens; 0 keeps all
  float top_p = 1.0f;                // keep the smallest set of tokens whose probability reaches p
  float repetition_penalty = 1.0f;   // > 1 discourages tokens already in the sequence (CTRL/HF rule)
  // OpenAI's penalties: a token's logit minus frequency_penalty × the times it has been generated
  // so far, minus presence_penalty once it has been (positive values discourage repeats; the
  // prompt is not counted). Finite; OpenAI's API takes [-2, 2].
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to those tokens' logits before anything else (OpenAI's logit_bias: −100 bans a token,
  // +100 all but forces it). Ids in [0, vocab), finite biases.
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;                 // the sampler's generator (one per sequence, seed + row)
  bool stop_at_eos = true;           // a sequence ends after it emits an end-of-sequence token
  SpeculationOptions speculation;
  // Constrained decoding (mhsa/grammar.h): each sequence keeps its own state of this grammar, and
  // before anything else the sampler sets the logits of the tokens it does not allow to −∞; once
  // the text is complete only end tokens are allowed. Speculation stays exact: each checked row is
  // masked by the state advanced along the guesses before it. Null: no constraint.
  std::shared_ptr<const Constraint> constraint;
};

// What speculative decoding did: forwards run after the prompt's, tokens guessed, and of those
// the tokens kept (acceptance = accepted / drafted; tokens per forward = decode tokens / forwards).
struct SpeculationStats {
  int64_t forwards = 0, drafted = 0, accepted = 0;
};

// Timings of the two phases of generate() (decode_tokens: the tokens made after the first).
struct GenerationStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  SpeculationStats speculation;
};

// One sequence of Model::step: its own cache (batch 1) and its new tokens (a prompt chunk, or the
// one token sampled last); or, instead of the cache, its place in a paged pool (kv_pool.h), whose
// blocks must already cover its length + the new tokens (KVBlockPool::grow); its length advances.
struct SequenceStep {
  ModelCache* cache = nullptr;
  std::span<const int32_t> ids;
  PagedSequence* paged = nullptr;
};

using TokenCallback = std::function<bool(int64_t, std::span<const int32_t>)>;

// How a model keeps its weights: float32, bfloat16 ("16-bit weights": the matrices of the
// linear layers, the token embedding and the output matrix are rounded to nearest-even at load;
// norms, biases and learned positions stay float32; every product is still summed in float32),
// float16 (the same matrices as IEEE float16: an F16 checkpoint kept exactly as stored, 3 more
// significant bits than bfloat16 but a range of ±65504 — a weight beyond it is refused at load,
// naming it), or q8_0 ("8-bit weights": the same matrices quantised at load into GGUF's Q8_0
// blocks, 32 int8 weights and one f16 scale each, by ggml's reference rule; a matrix whose row
// length is not a multiple of 32 stays float32), or q4_k ("4-bit weights": GGUF's Q4_K blocks, 256
// weights in 144 bytes — 4-bit quants with a 6-bit scale and min per 32 — by mhsa's own
// least-squares quantiser; as llama.cpp's Q4_K mixes keep the output matrix at 6 bits, the output
// matrix (the token embedding when tied) is kept as Q8_0, and so is a matrix whose row length is
// not a multiple of 256 (float32 if not of 32 either)). bf16 and f16 halve the bytes a decode step
// streams, q8_0 takes about a quarter, q4_k about an eighth; all are for inference only (no
// gradients).
enum class WeightType { f32, bf16, q8_0, q4_k, f16 };
// "f32", "bf16", "f16", "q8_0" or "q4_k"; anything else throws mhsa::Error "<what>: expected
// "f32", "bf16", "f16", "q8_0" or "q4_k", got '…'" (what: the option, "--dtype").
WeightType parse_weight_type(std::string_view name, std::string_view what);
std::string_view weight_type_name(WeightType dtype);

class Model {
 public:
  // A Hugging Face directory: config.json, and model.safetensors or the shards that
  // model.safetensors.index.json names. Tensor names as Hugging Face saves them (with or without
  // the "model." / "transformer." prefix); buffers such as attn.bias and rotary inv_freq ignored.
  // dtype bf16: the weight matrices are kept as bfloat16 (see WeightType; F16 and BF16 files are
  // widened to float32 exactly, then rounded to nearest-even per tensor as it is read); f16:
  // likewise as float16 (an F16 file's values exactly as stored; a weight outside float16's
  // range refused, naming the tensor); q8_0:
  // quantised to Q8_0 per tensor as it is read (a non-finite weight is refused, naming it); q4_k:
  // likewise to Q4_K (and Q8_0, see WeightType).
  // A path to a file is read as GGUF (llama.cpp's format; architectures "llama" and "gpt2"): its
  // metadata as the config, its tensors under Hugging Face names (Llama's q/k rows un-permuted,
  // GPT-2's matrices transposed back), F16/BF16/Q8_0/Q4_0/Q4_K dequantised to float32 (then kept
  // as the dtype asks; with q4_k, a matrix the file stores as Q4_K is kept as stored).
  static Model load(const std::filesystem::path& dir, WeightType dtype = WeightType::f32);
  // Random weights (normal-like, std 0.02; norms at identity) of a validated config; bf16, q8_0, q4_k:
  // the same float32 weights, rounded or quantised.
  static Model random(const ModelConfig& config, uint64_t seed, WeightType dtype = WeightType::f32);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const ModelConfig& config() const { return config_; }
  Family family() const { return config_.family; }
  WeightType weight_type() const;

  // Logits [B, T, V] of ids [B, T] (row-major), positions 0..T-1. With `attention`, also every
  // layer's attention probabilities [B, Hq, T, T], exact (from the kernel's log-sum-exp).
  Tensor forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<Tensor>* attention = nullptr) const;
  // The element types of the keys and of the values of the KV caches this model makes (new_cache,
  // new_kv_pool, generate, and so ChatSession and the server; forward() keeps float32 keys and
  // values, as it keeps no cache): f32 (the default), bf16 / f16 — half the cache's memory and of
  // the bytes a decode step reads from it, rounded once (nearest even) as they are cached — or
  // q8_0 — 17/64 of them, quantised per 32 values (the head size must be a multiple of 32, else
  // the cache's constructor throws naming head_dim). Attention computes in float32 on them widened
  // exactly. set_kv_type(KVType::q8_0) sets both; set_kv_type({KVType::q8_0, KVType::f16}) keys and
  // values apart (llama.cpp's -ctk / -ctv). Any cache works with any model whatever this says.
  KVTypes kv_type() const { return kv_type_; }
  void set_kv_type(KVTypes type) { kv_type_ = type; }
  // An empty cache (of kv_type()) for `batch` sequences of up to `max_tokens` tokens (≤ max_positions).
  ModelCache new_cache(int64_t batch, int64_t max_tokens) const;
  // A pool of `blocks` KV blocks (of kv_type()) of `block_tokens` tokens each for this model's
  // layers (the server's paged cache; memory is taken as blocks are first used).
  KVBlockPool new_kv_pool(int64_t blocks, int64_t block_tokens) const {
    return KVBlockPool(config_.num_layers, config_.num_kv_heads, config_.head_dim, config_.head_dim, block_tokens,
                       blocks, kv_type_);
  }
  // Runs ids [B, n] at positions cache.length() .. + n − 1, appends them to the cache, and returns
  // the logits [B, n, V], or only each sequence's last row [B, 1, V] with last_only.
  Tensor extend(ModelCache& cache, std::span<const int32_t> ids, int64_t B, int64_t n, bool last_only) const;
  // Continuous batching: one forward over several sequences, each appending its ids to its own
  // cache at its own positions. The norms, linear layers, MLP and LM head run over all their rows
  // at once (the weights are read once per step, not once per sequence); attention runs per
  // sequence over its own cache. Returns the logits of each sequence's last row [S, 1, V]: those
  // of extend(cache, ids, 1, n, true) for it alone, up to the GEMM's rounding, which depends on
  // the step's total rows (bitwise where the counts take the same kernel paths). Every sequence
  // is checked (a cache of batch 1 of this model used once, room for its ids, ids in range)
  // before any cache changes.
  Tensor step(std::span<const SequenceStep> seqs) const;
  // Continues each of the B prompts [B, T] by up to max_new_tokens tokens (see Gpt2::generate; a
  // sequence ends at any of the config's eos tokens, and a finished one repeats the first).
  std::vector<std::vector<int32_t>> generate(std::span<const int32_t> prompts, int64_t B, int64_t T,
                                             const GenerationOptions& options, const TokenCallback& on_token = {},
                                             GenerationStats* stats = nullptr) const;
  // The sampling rule of generate() on one row of logits (modified in place). history: the tokens
  // before this one; its first prompt_tokens are the prompt, the rest were generated (what the
  // presence and frequency penalties count; with 0, all of history counts).
  static int32_t sample(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& options,
                        uint64_t& rng_state, size_t prompt_tokens = 0);

  // Every parameter with its Hugging Face name ("model.layers.0.self_attn.q_proj.weight", ...;
  // GPT-2's without a prefix, as Gpt2 names them), in a fixed order. In a bf16, q8_0 or q4_k model
  // the 16-, 8- or 4-bit ones are empty tensors (their values live in bfloat16, Q8_0 or Q4_K storage).
  std::vector<std::pair<std::string, Tensor*>> parameters();
  std::vector<std::pair<std::string, const Tensor*>> parameters() const;
  // The parameter of that name, or null.
  const Tensor* parameter(std::string_view name) const;
  // Gradients need a float32 model: zero_gradients and loss_and_gradients of a bf16 or q8_0 one
  // throw.
  std::vector<Tensor> zero_gradients() const;
  // Mean cross-entropy (nats per token) of targets [B, T] (−1 ignored) given ids [B, T]; adds
  // every parameter's gradient into grads (from zero_gradients()). Same for any thread count.
  double loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                            std::vector<Tensor>& grads) const;
  double loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const;

  struct Layout;  // which parameter plays which part in the block (opaque; src/model/model.cpp)

 private:
  friend struct ModelAccess;
  Model();
  static Model load_gguf(const std::filesystem::path& file, WeightType dtype);
  // The parameters of config_ (with an untied head or not), each from get(name, shape); from a
  // GGUF file, a q4_k model keeps the file's Q4_K matrices as they are stored.
  void assemble(bool untied, WeightType dtype,
                const std::function<Tensor(const std::string&, const std::vector<int64_t>&)>& get,
                const detail::GgufModelFile* gguf = nullptr);

  ModelConfig config_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::unique_ptr<const Layout> layout_;
  KVTypes kv_type_;
};

}  // namespace mhsa
