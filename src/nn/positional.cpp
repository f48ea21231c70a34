// nn/positional.cpp — sinusoidal positional encoding (see positional.h).
#include <cmath>

#include "core/check.h"
#include "mhsa/positional.h"

namespace mhsa {

Tensor sinusoidal_positional_encoding(int64_t tokens, int64_t channels) {
  if (tokens < 0) detail::fail("sinusoidal_positional_encoding", "tokens", "a count >= 0", std::to_string(tokens));
  if (channels <= 0)
    detail::fail("sinusoidal_positional_encoding", "channels", "a count > 0", std::to_string(channels));
  Tensor pe({tokens, channels}, "sinusoidal_positional_encoding: pe [tokens, channels]");  // [T, C]
  float* out = pe.data();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t pair = c / 2;  // i: channels 2i and 2i+1 share one frequency
      const double angle =
          static_cast<double>(t) / std::pow(10000.0, 2.0 * static_cast<double>(pair) / static_cast<double>(channels));
      out[t * channels + c] = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  return pe;
}

}  // namespace mhsa
