// python/src/call_options.h — the attention options every binding parses the same way (mask,
// is_causal, scale, kv_lengths), with the arrays behind them kept alive. Defined in
// bind_attention.cpp; also used by the MultiHeadAttention binding.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "arrays.h"
#include "mhsa/attention.h"

namespace mhsa::python {

struct CallOptions {
  AttentionOptions options;
  std::vector<int64_t> kv_lengths;  // storage behind options.kv_lengths
  InputArray mask;                  // storage behind options.attn_mask
  InputArray sinks;                 // storage behind options.sinks
};

CallOptions call_options(std::string_view fn, const py::object& attn_mask, bool is_causal,
                         const std::optional<float>& scale, const py::object& kv_lengths);

void bind_attention(py::module_& m);  // scaled_dot_product_attention (+ backward), attention_probabilities

}  // namespace mhsa::python
