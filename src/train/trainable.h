// train/trainable.h — what the training loop needs of a model, and nothing more: its parameters
// by Hugging Face name, gradients shaped like them, the loss with and without gradients, and the
// config.json that makes a checkpoint a model directory of its family. A family plugs into the
// trainer by implementing this (train/trainable.cpp: GPT-2 and Llama). Not public, and not a model API:
// inference goes through the model classes themselves.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mhsa/tensor.h"
#include "mhsa/tokenizer.h"
#include "mhsa/train.h"

namespace mhsa::detail {

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  // Every parameter with its Hugging Face name, in a fixed order: what the optimiser updates and
  // checkpoints store (model.safetensors holds them under these names).
  virtual std::vector<std::pair<std::string, Tensor*>> parameters() = 0;
  // Zero gradients shaped like parameters(), in the same order.
  virtual std::vector<Tensor> zero_gradients() const = 0;
  // Mean cross-entropy (nats per token) of targets [B, T] given ids [B, T]; adds the gradients
  // into grads. on_final(first) (may be empty) says, during the backward, that grads[first..] are
  // final (nn::stack_loss's hook: first decreases to 0).
  virtual double loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B,
                                    int64_t T, std::vector<Tensor>& grads,
                                    const std::function<void(size_t first)>& on_final) const = 0;
  // The loss alone, of the float32 weights (the checkpoint's model, whatever the training dtype).
  virtual double loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const = 0;
  // After the parameters changed (a new or restored model, an optimiser step): with dtype bf16,
  // rounds their bfloat16 copy afresh (nearest even) — the matrices loss_and_gradients' forward
  // and input gradients read; its parameter gradients are the float32 masters'. f32: nothing.
  virtual void refresh_weights() = 0;
  // The Hugging Face config.json of this model (ends with a newline): for an adapter, peft's
  // adapter_config.json.
  virtual std::string config_json() const = 0;
  // The checkpoint's names of that config and of the weights parameters() gives.
  virtual std::string config_file() const { return "config.json"; }
  virtual std::string weights_file() const { return "model.safetensors"; }
  // Throws mhsa::Error ("<fn>: <file>: expected the shape of train_state.safetensors (...), got
  // ...") when the config.json at `file` describes a model of another shape.
  virtual void check_config(const std::filesystem::path& file, std::string_view fn) const = 0;
};

// The model a run's options and vocabulary describe (a resumed run's too: its weights are then
// replaced by the checkpoint's), with initial weights drawn from `seed`, training in o.dtype
// ("bf16": bfloat16 copies of nn::half_parts' matrices, refreshed by refresh_weights; else f32).
// A LoRA run (o.model set) loads its frozen base here and draws the adapter's A from `seed`.
std::unique_ptr<TrainableModel> new_trainable_model(const TrainOptions& o, const Tokenizer& tokenizer, uint64_t seed);

// The tokenizer a run reads its text with: the pretrained model's (o.model), GPT-2's BPE files in
// `vocabulary` (a new run's o.tokenizer, a resumed run's checkpoint directory), or bytes.
Tokenizer run_tokenizer(const TrainOptions& o, const std::filesystem::path& vocabulary);

}  // namespace mhsa::detail
