// model/gguf_model.h — a GGUF file as a Model's config and weights, and a Model as a GGUF file, for
// the families whose descriptor (model/family.h) names a llama.cpp architecture: "gpt2", "llama",
// "olmo2", "phi3" (Phi-3's fused attn_qkv and ffn_up read into their parts and written fused).
//
// Names: llama.cpp's (token_embd, blk.N.attn_q, …, output_norm, output) ↔ the Hugging Face names
// mhsa keeps. Layouts: llama.cpp's converter permutes the rows of Llama's q and k projections
// (and their biases) from Hugging Face's rotate_half order to ggml's interleaved pairs; reading
// undoes it, writing applies it. GPT-2's Conv1D weights ([in, out]) are stored transposed
// ([out, in]), as the converter stores them. Metadata: the hyperparameters under "<arch>.…"
// keys ↔ ModelConfig; llama3 RoPE scaling as the converter writes it, a rope_freqs tensor of
// per-frequency divisors (RopeScalingKind::factors; llama3 configs are written that way too);
// anything mhsa cannot run the same way (partial rotary, RoPE scalings other than linear) is
// refused naming the key or tensor. Not public: Model::load and `mhsa quantize` call it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "mhsa/model.h"
#include "nn/q4_matrix.h"

namespace mhsa::detail {

struct GgufName;  // model/gguf_names.h

// A GGUF file read as a model: its config (validated) and its tensors by Hugging Face name.
class GgufModelFile {
 public:
  static GgufModelFile open(const std::filesystem::path& path);
  // The config of a parsed file (for tests and the fuzzer); throws naming the key.
  static ModelConfig config_of(const GgufFile& file);

  const ModelConfig& config() const { return config_; }
  bool untied_head() const;  // an "output" tensor distinct from token_embd
  // The Hugging Face parameter `name`, float32 in mhsa's layout, checked to have `shape`.
  Tensor load(const std::string& name, const std::vector<int64_t>& shape) const;
  // The matrix `name` (checked to have `shape`) as the Q4_K blocks the file stores, [out, in] in
  // mhsa's row order (Llama's q/k rows un-permuted), when it is stored as Q4_K; nullopt otherwise.
  // Blocks with an infinite or NaN scale are refused.
  std::optional<nn::Q4Matrix> load_q4_k(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  const GgufTensorInfo& checked(const GgufName& g, const std::string& name,
                                const std::vector<int64_t>& shape) const;
  GgufFile file_;
  ModelConfig config_;
  explicit GgufModelFile(GgufFile f) : file_(std::move(f)) {}
};

// Writes a model of such a family as a GGUF file llama.cpp reads: its names, the q/k permutation, the
// metadata llama.cpp needs (general.architecture, the hyperparameters, file type; the tokenizer
// from `tokenizer_dir`'s tokenizer.json or vocab.json + merges.txt when it has one, and its chat
// template from chat_template.jinja or tokenizer_config.json). Matrices are
// stored as `type` (Q8_0 needs rows of whole 32-value blocks: other matrices are stored F16, as
// llama.cpp's converter does; Q4_K stores the output matrix, and rows not of whole 256-value
// blocks, as Q8_0, as a q4_k Model keeps them); norms, biases and learned positions stay F32.
void save_gguf(const Model& model, const std::filesystem::path& path, GgufType type, bool overwrite,
               const std::filesystem::path& tokenizer_dir = {});

}  // namespace mhsa::detail
