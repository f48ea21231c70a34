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
  static nn::Stack stack(const Gpt2& m);
  static std::vector<KVCache>& layers(ModelCache& c) { return c.layers_; }
};

// GPT-2's Gpt2Config as the ModelConfig of the block (model/gpt2.cpp).
ModelConfig gpt2_model_config(const Gpt2Config& g);

}  // namespace mhsa
