// mhsa/positional.h — the sinusoidal positional encoding of "Attention Is All You Need".
// GPT-2 learns its positions instead (model/); this is for models and lessons that use the formula.
#pragma once

#include <cstdint>

#include "mhsa/tensor.h"

namespace mhsa {

// [T, C] with PE[t, 2i] = sin(t / 10000^(2i/C)) and PE[t, 2i+1] = cos(t / 10000^(2i/C)).
Tensor sinusoidal_positional_encoding(int64_t tokens, int64_t channels);

}  // namespace mhsa
