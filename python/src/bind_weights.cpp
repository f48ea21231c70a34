// python/src/bind_weights.cpp — reading a Hugging Face model directory's description and weights
// without building the model: mhsa.read_model_config (config.json of any family, as ModelConfig
// reads it, every field) and mhsa.load_checkpoint (model.safetensors or a sharded index). For
// tests and tools that compare with transformers; the models themselves are in bind_model.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>

#include "arrays.h"
#include "mhsa/model_config.h"
#include "mhsa/safetensors.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mhsa::python {
namespace {

const char* kind_name(NormKind k) { return k == NormKind::layer_norm ? "layer_norm" : "rms_norm"; }
const char* kind_name(PositionKind k) { return k == PositionKind::learned ? "learned" : "rotary"; }
const char* kind_name(MlpKind k) { return k == MlpKind::gelu ? "gelu" : k == MlpKind::swiglu ? "swiglu" : "geglu"; }
const char* kind_name(RopeScalingKind k) {
  return k == RopeScalingKind::none     ? "none"
         : k == RopeScalingKind::linear ? "linear"
         : k == RopeScalingKind::llama3 ? "llama3"
                                        : "factors";
}

}  // namespace

// Every field of a ModelConfig, by its C++ name (also mhsa.Model.config, bind_model.cpp).
py::dict full_config_dict(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  py::dict rope("kind"_a = kind_name(s.kind), "factor"_a = s.factor, "low_freq_factor"_a = s.low_freq_factor,
                "high_freq_factor"_a = s.high_freq_factor,
                "original_max_position_embeddings"_a = s.original_max_position_embeddings);
  if (s.kind == RopeScalingKind::factors) rope["factors"] = s.factors;  // a GGUF file's rope_freqs
  py::dict d("family"_a = family_name(c.family), "architecture"_a = c.architecture, "vocab_size"_a = c.vocab_size,
             "hidden_size"_a = c.hidden_size, "num_layers"_a = c.num_layers, "num_heads"_a = c.num_heads,
             "num_kv_heads"_a = c.num_kv_heads, "head_dim"_a = c.head_dim, "intermediate_size"_a = c.intermediate_size,
             "max_positions"_a = c.max_positions, "norm"_a = kind_name(c.norm), "norm_eps"_a = c.norm_eps,
             "norm_weight_offset"_a = c.norm_weight_offset, "positions"_a = kind_name(c.positions),
             "rope_theta"_a = c.rope_theta, "rotary_dim"_a = c.rotary_dim, "rope_scaling"_a = rope);
  d["mlp"] = kind_name(c.mlp);
  d["qkv_bias"] = c.qkv_bias;
  d["o_bias"] = c.o_bias;
  d["mlp_bias"] = c.mlp_bias;
  d["qk_norm"] = c.qk_norm;
  d["qk_norm_full_width"] = c.qk_norm_full_width;
  d["pre_norms"] = c.pre_norms;
  d["post_norms"] = c.post_norms;
  d["embedding_scale"] = c.embedding_scale;
  d["attention_scale"] = c.attention_scale;
  d["attn_logit_softcap"] = c.attn_logit_softcap;
  d["final_logit_softcap"] = c.final_logit_softcap;
  d["window_left"] = c.window_left;
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  d["bos_token_id"] = c.bos_token_id;
  d["pad_token_id"] = c.pad_token_id;
  d["eos_token_ids"] = c.eos_token_ids;
  return d;
}


void bind_weights(py::module_& m) {
  m.def(
      "read_model_config",
      [](const std::filesystem::path& path) {
        const auto file = std::filesystem::is_directory(path) ? path / "config.json" : path;
        return full_config_dict(ModelConfig::load(file));
      },
      "path"_a,
      R"(A Hugging Face config.json (or the directory holding it) read as mhsa reads it for any family
(GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2): a dict of every field of mhsa's ModelConfig.
Unsupported values raise mhsa.Error naming the key.)");
  m.def(
      "load_checkpoint",
      [](const std::filesystem::path& path) {
        const bool file = std::filesystem::exists(path) && !std::filesystem::is_directory(path);
        const ShardedSafeTensors set = file ? ShardedSafeTensors::open_index(path) : ShardedSafeTensors::open_dir(path);
        py::dict out;
        for (const std::string& name : set.names()) {
          py::array a = to_numpy(set.load(name));
          out[py::str(name)] = set.find(name)->shape.empty() ? a.attr("reshape")(py::tuple()) : a;
        }
        return out;
      },
      "path"_a,
      R"(Every tensor of a model directory (model.safetensors, or the shards of model.safetensors.index.json)
or of an index file, as float32 arrays by name; every file is validated first.)");
}

}  // namespace mhsa::python
