// model/gguf_names.cpp — see model/gguf_names.h.
#include "model/gguf_names.h"

#include <cstring>
#include <optional>

#include "core/check.h"
#include "io/json.h"
#include "model/family.h"

namespace mhsa::detail {

GgufName gguf_name(const ModelConfig& c, std::string_view hf_name) {
  const FamilyInfo& family = family_info(c.family);
  if (!family.gguf_arch)
    fail("gguf", "model", message("a model of a family mapped to GGUF (", gguf_families(), ")"), family_name(c.family));
  const auto bad = [&]() -> GgufName {
    fail("gguf", "parameter", message("a ", family_name(c.family), " parameter llama.cpp has a name for"), quote(hf_name));
  };
  // A part of a fused tensor is named as the tensor it is part of.
  const std::optional<FusedSlice> slice = family.fused ? family.fused(c, hf_name) : std::nullopt;
  if (slice) hf_name = slice->tensor;
  std::string_view suffix;
  for (std::string_view s : {".weight", ".bias"})
    if (hf_name.ends_with(s)) suffix = s;
  if (suffix.empty()) return bad();
  std::string_view module = hf_name.substr(0, hf_name.size() - suffix.size());
  const std::string_view layers = family.hf_names == HfNames::gpt2 ? "h." : "model.layers.";
  std::string block;
  std::span<const GgufRename> table = family.gguf_global;
  if (module.starts_with(layers)) {
    module.remove_prefix(layers.size());
    const size_t dot = module.find('.');
    if (dot == 0 || dot == std::string_view::npos || module.substr(0, dot).find_first_not_of("0123456789") != std::string_view::npos)
      return bad();
    block = message("blk.", module.substr(0, dot), ".");
    module.remove_prefix(dot + 1);
    table = family.gguf_layer;
  }
  for (const GgufRename& r : table) {
    if (module != r.hf) continue;
    GgufName g{message(block, r.gguf, suffix), r.weight_layout, 0};
    if (g.layout == GgufLayout::transposed && suffix == ".bias") g.layout = GgufLayout::as_is;
    if (g.layout == GgufLayout::permuted) g.heads = std::strcmp(r.gguf, "attn_q") == 0 ? c.num_heads : c.num_kv_heads;
    if (slice) {
      g.row_begin = slice->row_begin;
      g.rows = slice->rows;
      g.total_rows = slice->total_rows;
    }
    return g;
  }
  return bad();
}

std::string gguf_families() {
  std::string s;
  for (const FamilyInfo* f : families())
    if (f->gguf_arch) s += (s.empty() ? "" : ", ") + std::string(f->gguf_arch);
  return s;
}

Tensor permute_rows(const Tensor& x, int64_t heads, bool to_gguf) {
  const int64_t R = x.dim(0), W = x.numel() / (R ? R : 1), D = R / heads, half = D / 2;
  if (R % heads != 0 || D % 2 != 0)
    fail("gguf", "q/k rows", message("heads of an even number of rows (", heads, " heads)"), std::to_string(R));
  Tensor y(x.shape());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t s = 0; s < 2; ++s) {
        const int64_t hf = h * D + s * half + i, gg = h * D + 2 * i + s;
        const int64_t from = to_gguf ? hf : gg, to = to_gguf ? gg : hf;
        std::memcpy(y.data() + to * W, x.data() + from * W, static_cast<size_t>(W) * 4);
      }
  return y;
}

Tensor transpose_2d(const Tensor& x) {
  const int64_t a = x.dim(0), b = x.dim(1);
  Tensor y({b, a});
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) y.data()[j * a + i] = x.data()[i * b + j];
  return y;
}

}  // namespace mhsa::detail
