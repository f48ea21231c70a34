// model/family.h — a model family as one registered descriptor: what config.json calls it
// (model_type, the causal-LM class), how its config.json is read (into ModelConfig's named block
// options: norm placement, q/k norm scope, biases, windows, ...) and written, how Hugging Face and
// GGUF name its tensors, and the split hook for tensors its files fuse. The block reads the
// options, never a family's name; model/, train/ and the GGUF code find families here.
//
// A family is one file under model/families/ defining its FamilyInfo; family.cpp lists them.
// Not public.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mhsa/model_config.h"
#include "model/gguf_names.h"

namespace mhsa::detail {

class Keys;

// Hugging Face's tensor names: GPT-2's ("h.N.attn.c_attn", Conv1D weights [in, out]) or Llama's
// ("model.layers.N.self_attn.q_proj", nn.Linear weights [out, in]), which every other family shares.
enum class HfNames { gpt2, llama };

// One module's GGUF name (llama.cpp's convert_hf_to_gguf.py), by its Hugging Face name without
// ".weight" / ".bias"; a layer's modules are "blk.N." + gguf.
struct GgufRename {
  const char* hf;
  const char* gguf;
  GgufLayout weight_layout;
};

// Where a parameter of mhsa's is stored inside a tensor that fuses several (Phi-3's qkv_proj and
// gate_up_proj): the fused tensor's name (Hugging Face's) and the parameter's rows of it.
struct FusedSlice {
  std::string tensor;
  int64_t row_begin = 0, rows = 0, total_rows = 0;
};

// The block options a family's blocks always have (ModelConfig's fields of the same names);
// what varies with config.json (biases, windows, ...) its reader sets.
struct BlockOptions {
  bool qk_norm = false, qk_norm_full_width = false, pre_norms = true, post_norms = false;
  void apply(ModelConfig& c) const {
    c.qk_norm = qk_norm;
    c.qk_norm_full_width = qk_norm_full_width;
    c.pre_norms = pre_norms;
    c.post_norms = post_norms;
  }
};

struct FamilyInfo {
  Family family;
  const char* model_type;    // config.json's model_type
  const char* architecture;  // the causal-LM class transformers builds for it
  BlockOptions block = {};
  // Reads the family's config.json keys into c (family and architecture already set), refusing
  // what mhsa cannot run naming the key; ModelConfig::parse validates the result.
  void (*read_config)(const Keys& k, ModelConfig& c);
  // config.json text as transformers reads it back into c; null where mhsa writes none.
  std::string (*write_config)(const ModelConfig& c) = nullptr;
  HfNames hf_names = HfNames::llama;
  // The split hook: where a parameter (by the name HfNames gives it) is read from and written to
  // inside a fused tensor of this family's files; nullopt: a tensor of its own. Null: none fused.
  std::optional<FusedSlice> (*fused)(const ModelConfig& c, std::string_view name) = nullptr;
  // GGUF: llama.cpp's general.architecture (null: not mapped to GGUF), its names of the model-wide
  // and per-layer modules (fused tensors by their Hugging Face name), and whether q/k rows are
  // permuted to ggml's interleaved rotary order (llama.cpp's LLAMA_ROPE_TYPE_NORM architectures).
  const char* gguf_arch = nullptr;
  std::span<const GgufRename> gguf_global = {}, gguf_layer = {};
};

// Every registered family, in registration order.
std::span<const FamilyInfo* const> families();
const FamilyInfo& family_info(Family f);
// By config.json's model_type, by the causal-LM class, by GGUF's general.architecture; null if none.
const FamilyInfo* family_by_type(std::string_view model_type);
const FamilyInfo* family_by_architecture(std::string_view architecture);
const FamilyInfo* family_by_gguf_arch(std::string_view arch);
// "\"gpt2\", \"llama\", ... or \"phi3\"": the model types, for messages.
std::string family_list();

// The Llama names every rotary family's GGUF tables start from.
extern const GgufRename kLlamaGgufGlobal[3];

}  // namespace mhsa::detail
