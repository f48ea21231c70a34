// mhsa/lora.h — LoRA adapters (Hu et al., 2021) on a frozen mhsa::Model, as Hugging Face's peft
// makes them: for each targeted linear layer W [out, in], two trained matrices A [r, in] and
// B [out, r], and
//   y = x·Wᵀ (+ b) + (alpha / r)·(x·Aᵀ)·Bᵀ.
// A new adapter starts as peft's does (A uniform in ±1/√in, kaiming_uniform with a = √5; B zero:
// the model unchanged). It is saved and loaded in peft's format (adapter_config.json and
// adapter_model.safetensors under peft's tensor names, which PeftModel.from_pretrained loads onto
// the transformers model), and merged into the base's weights. The base stays frozen: its float32
// or bfloat16 weights are read, never written (except by merge_into); its gradients are never
// computed, only those of A and B and the input gradients through W.
// Not a general PEFT library: LoRA only, on families with separate q/k/v projections and a gated
// MLP (Llama, Mistral, Qwen2/3, Gemma 2), without dropout, DoRA or rsLoRA; quantised bases refused.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mhsa/model.h"
#include "mhsa/tensor.h"

namespace mhsa {

struct LoraOptions {
  int64_t rank = 8;
  double alpha = 0;  // the scale is alpha / rank; 0: 2·rank (a scale of 2)
  // Which linear layers of every block get an adapter: any of q, k, v, o (attention), gate, up,
  // down (the MLP), each once.
  std::vector<std::string> targets = {"q", "k", "v", "o", "gate", "up", "down"};

  double alpha_or_default() const { return alpha > 0 ? alpha : 2.0 * static_cast<double>(rank); }
  double scale() const { return alpha_or_default() / static_cast<double>(rank); }
  // Throws mhsa::Error "<fn>: <option>: expected ..., got ..." for a rank < 1, an alpha not finite
  // and >= 0, no target, or a target unknown or given twice.
  void validate(std::string_view fn) const;
};

// "q,k,v" → {"q", "k", "v"} (spaces around names ignored); the names are checked by validate.
std::vector<std::string> split_lora_targets(std::string_view list);

class Lora;

// The model of the Hugging Face directory base_dir with the adapter of adapter_dir merged into its
// weights (Lora::merge_into), written as a Hugging Face directory `out`: model.safetensors
// (float32) beside copies of base_dir's config and tokenizer files. Throws mhsa::Error for a base
// that is not a directory (a GGUF file: not written yet), or what Model::load and Lora::load throw.
void save_merged(const std::filesystem::path& base_dir, const std::filesystem::path& adapter_dir,
                 const std::filesystem::path& out);

class Lora {
 public:
  // A new adapter for `base`, initialised as peft does from `seed`. Throws mhsa::Error naming the
  // option for options out of range, a base of another family shape (GPT-2's fused projections)
  // or quantised weights (q8_0, q4_k: load the base as f32 or bf16), a rank above a layer's width.
  static Lora create(const Model& base, const LoraOptions& options, uint64_t seed);
  // peft's directory (adapter_config.json with peft_type LORA; adapter_model.safetensors), checked
  // against `base`: every tensor present with its shape, no unknown tensor, no option mhsa does not
  // implement (dropout is accepted: it does not change inference). Errors name the file.
  static Lora load(const std::filesystem::path& dir, const Model& base);
  // Writes adapter_config.json and adapter_model.safetensors into dir (created if needed), each
  // file written aside and renamed into place. base_model names the base in the config.
  void save(const std::filesystem::path& dir, const std::string& base_model = "") const;
  // adapter_config.json's text (ends with a newline).
  std::string config_json(const std::string& base_model = "") const;

  const LoraOptions& options() const { return options_; }
  // A and B of every adapter under peft's names ("base_model.model.<module>.lora_A.weight" and
  // ".lora_B.weight"), layer by layer in the base's parameter order: what is trained and saved.
  std::vector<std::pair<std::string, Tensor*>> parameters();
  std::vector<std::pair<std::string, const Tensor*>> parameters() const;
  std::vector<Tensor> zero_gradients() const;

  // The base with the adapter: logits [B, T, V] of ids [B, T], as Model::forward.
  Tensor forward(const Model& base, std::span<const int32_t> ids, int64_t B, int64_t T) const;
  // Mean cross-entropy of targets [B, T] (−1 ignored), as Model::loss.
  double loss(const Model& base, std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B,
              int64_t T) const;
  // The same, adding the gradients of parameters() into grads (from zero_gradients()); the base's
  // weights get none. on_final(first): during the backward, grads[first..] are final (first
  // decreases to 0; the trainer's hook, as nn::stack_loss's).
  double loss_and_gradients(const Model& base, std::span<const int32_t> ids, std::span<const int32_t> targets,
                            int64_t B, int64_t T, std::vector<Tensor>& grads,
                            const std::function<void(size_t first)>& on_final = {}) const;
  // W += scale·B·A for every adapter: base then computes what base + adapter did. Needs float32
  // weights (a bf16 base is refused: load it as f32 to merge).
  void merge_into(Model& base) const;

 private:
  friend struct LoraAccess;
  struct Target {
    std::string module;  // the base's module, "model.layers.0.self_attn.q_proj"
    int64_t in = 0, out = 0;
  };
  LoraOptions options_;
  std::vector<Target> targets_;
  std::vector<Tensor> a_, b_;  // [r, in], [out, r] per target
};

}  // namespace mhsa
