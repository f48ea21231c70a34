// model/gguf_names.h — how a Hugging Face parameter is named and laid out in a GGUF file
// (llama.cpp's convert_hf_to_gguf.py conventions, from the family's descriptor in model/family.h),
// and the two layout changes: Llama's q/k rows permuted per head, GPT-2's Conv1D weights
// transposed. Not public.
#pragma once

#include <string>
#include <string_view>

#include "mhsa/model_config.h"
#include "mhsa/tensor.h"

namespace mhsa::detail {

enum class GgufLayout {
  as_is,
  transposed,  // GPT-2 Conv1D [in, out] ↔ GGUF [out, in]
  permuted,    // Llama q/k rows: rotate_half order ↔ interleaved pairs, per head of `heads`
};

struct GgufName {
  std::string name;  // "blk.3.attn_q.weight"
  GgufLayout layout = GgufLayout::as_is;
  int64_t heads = 0;  // permuted only
  // A part of a tensor the family's files fuse (Phi-3's attn_qkv, ffn_up): its rows of the
  // stored tensor's total_rows; rows 0: the whole tensor.
  int64_t row_begin = 0, rows = 0, total_rows = 0;
};

// The GGUF name of parameter `hf_name` of a model of config c (a family mapped to GGUF); throws
// mhsa::Error for a name llama.cpp has no name for.
GgufName gguf_name(const ModelConfig& c, std::string_view hf_name);
// The GGUF architectures of the families mapped to GGUF, for messages ("gpt2, llama").
std::string gguf_families();

// Rows [R, ...] in `heads` groups of D = R / heads rows (D even): Hugging Face row s·D/2 + i of a
// head is GGUF row 2i + s. to_gguf applies that, otherwise it is undone.
Tensor permute_rows(const Tensor& x, int64_t heads, bool to_gguf);
// [a, b] → [b, a].
Tensor transpose_2d(const Tensor& x);

}  // namespace mhsa::detail
