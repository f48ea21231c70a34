// model/access.h — the nn view of a model (its nn::Stack) and of a cache, for the model classes
// and for train/ and explain/, which run the same stack. Not public.
#pragma once

#include <vector>

#include "mhsa/gpt2.h"
#include "mhsa/model.h"
#include "nn/block.h"

namespace mhsa {

struct ModelAccess {
  static nn::Stack stack(const Model& m);
  // For the CLI's inference models (mhsa generate, chat, serve, explain, bench): GPT-2's float
  // [in, out] projection weights blocked in place (nn::Layout::in_out_blocked: the same results,
  // faster decode steps of several sequences). Its parameters() then hold blocked tensors, and
  // training it is refused. False when nothing was blocked (another family, 16/8/4-bit weights,
  // sizes that do not block).
  static bool block_weights(Model& m);
  static bool blocked(const Model& m);
  static nn::Stack stack(const Gpt2& m);
  static std::vector<KVCache>& layers(ModelCache& c) { return c.layers_; }
};

// GPT-2's Gpt2Config as the ModelConfig of the block (model/gpt2.cpp).
ModelConfig gpt2_model_config(const Gpt2Config& g);

}  // namespace mhsa
