// model/gguf_save.cpp — a Model of a family mapped to GGUF written as the GGUF file llama.cpp's converter would
// write (see model/gguf_model.h): its tensor names and layouts, its metadata keys, and a byte-level
// BPE tokenizer (tokenizer.json's, or GPT-2's vocab.json + merges.txt) as tokenizer.ggml.* (with
// llama.cpp's name of its pre-tokenizer when it is GPT-2's, Llama 3's or Qwen2's), its
// chat template as tokenizer.chat_template; llama3 RoPE scaling as the converter's rope_freqs
// tensor. Other tokenizers are not converted: the file then says "no_vocab", which llama.cpp
// reads as a model without a vocabulary (token ids in, logits out).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file.h"
#include "io/json.h"
#include "model/family.h"
#include "model/gguf_model.h"
#include "model/gguf_names.h"
#include "mhsa/tokenizer.h"

namespace mhsa::detail {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr std::string_view kFn = "save_gguf";
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;  // llama.cpp's token types

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre = "default";  // tokenizer.ggml.pre
};

// llama.cpp's name for a tokenizer.json pre-tokenizer it knows (convert_hf_to_gguf.py picks it by
// the tokenizer's output): GPT-2's ByteLevel regex, Llama 3's or Qwen2's Split then ByteLevel,
// SmolLM's Digits then ByteLevel; "default" for any other, as before.
std::string pre_name(const json& j) {
  const json* p = j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object() ? &j["pre_tokenizer"] : nullptr;
  if (!p) return "default";
  const auto byte_level = [](const json& x, bool regex) {
    return x.is_object() && x.value("type", "") == "ByteLevel" && x.value("use_regex", true) == regex &&
           !x.value("add_prefix_space", false);
  };
  if (byte_level(*p, true)) return "gpt-2";
  const json list = p->value("type", "") == "Sequence" ? p->value("pretokenizers", json()) : json();
  if (!list.is_array() || list.size() != 2 || !list[0].is_object()) return "default";
  const json& a = list[0];
  // SmolLM/SmolLM2's: every digit apart, then GPT-2's ByteLevel regex (llama.cpp: "smollm").
  if (a.value("type", "") == "Digits" && a.value("individual_digits", false) && byte_level(list[1], true))
    return "smollm";
  if (a.value("type", "") != "Split" || a.value("behavior", "") != "Isolated" || a.value("invert", false) ||
      !byte_level(list[1], false) || !a.contains("pattern") || !a["pattern"].is_object())
    return "default";
  const std::string r = a["pattern"].value("Regex", "");
  const std::string common = R"(|[^\r\n\p{L}\p{N}]?\p{L}+|)";
  const std::string tail = R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string contractions = R"((?i:'s|'t|'re|'ve|'m|'ll|'d))";
  if (r == contractions + common + R"(\p{N}{1,3})" + tail) return "llama-bpe";
  if (r == contractions + common + R"(\p{N})" + tail) return "qwen2";
  return "default";
}

// Places token `text` at `id`, growing the table.
void place(Vocab& v, int64_t id, std::string text, int32_t type, int64_t n_vocab, const std::string& file) {
  if (id < 0 || id >= n_vocab)
    fail(kFn, file, message("token ids in [0, ", n_vocab, ") (the model's vocabulary)"), std::to_string(id));
  if (static_cast<int64_t>(v.tokens.size()) <= id) {
    v.tokens.resize(static_cast<size_t>(id) + 1);
    v.types.resize(static_cast<size_t>(id) + 1, kUnused);
  }
  v.tokens[static_cast<size_t>(id)] = std::move(text);
  v.types[static_cast<size_t>(id)] = type;
}

void read_vocab(Vocab& v, const json& vocab, int64_t n_vocab, const std::string& file) {
  if (!vocab.is_object()) fail(kFn, file + ": vocab", "an object of token → id", json_excerpt(vocab));
  for (const auto& [token, id] : vocab.items())
    place(v, json_integer<int64_t>(id, kFn, file + ": vocab"), token, kNormal, n_vocab, file);
}

void read_merges(Vocab& v, const json& merges, const std::string& file) {
  if (!merges.is_array()) fail(kFn, file + ": merges", "an array", json_excerpt(merges));
  for (const json& m : merges) {
    if (m.is_string()) v.merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else fail(kFn, file + ": merges", "\"a b\" strings or [a, b] pairs", json_excerpt(m));
  }
}

// A byte-level BPE vocabulary of the directory, or none (another kind of tokenizer, or no files).
std::optional<Vocab> byte_level_vocab(const fs::path& dir, int64_t n_vocab) {
  Vocab v;
  if (dir.empty()) return std::nullopt;
  if (fs::exists(dir / "tokenizer.json")) {
    const std::string file = (dir / "tokenizer.json").string();
    const json j = parse_json(read_file(dir / "tokenizer.json", kFn, "tokenizer.json"), kFn, file, "UTF-8 JSON");
    const bool byte_level = j.is_object() && j.contains("decoder") && j["decoder"].is_object() &&
                            j["decoder"].value("type", "") == "ByteLevel";
    if (!byte_level || !j.contains("model") || !j["model"].is_object() || j["model"].value("type", "") != "BPE")
      return std::nullopt;
    read_vocab(v, j["model"].value("vocab", json()), n_vocab, file);
    v.pre = pre_name(j);
    read_merges(v, j["model"].value("merges", json::array()), file);
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const json& t : j["added_tokens"])
        if (t.is_object() && t.contains("id") && t.contains("content") && t["content"].is_string())
          place(v, json_integer<int64_t>(t["id"], kFn, file + ": added_tokens"), t["content"].get<std::string>(),
                t.value("special", false) ? kControl : kUserDefined, n_vocab, file);
  } else if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    const std::string file = (dir / "vocab.json").string();
    read_vocab(v, parse_json(read_file(dir / "vocab.json", kFn, "vocab.json"), kFn, file, "UTF-8 JSON"), n_vocab, file);
    const std::string text = read_file(dir / "merges.txt", kFn, "merges.txt");
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(at, end - at);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty() && !line.starts_with("#version")) v.merges.push_back(std::move(line));
      at = end + 1;
    }
  } else {
    return std::nullopt;
  }
  for (size_t id = 0; id < v.tokens.size(); ++id)  // ids no file names: llama.cpp's converter's padding
    if (v.types[id] == kUnused) v.tokens[id] = message("[PAD", id, "]");
  return v;
}

// The directory's chat template as the converter finds it: chat_template.jinja, else a string
// chat_template in tokenizer_config.json; "" when neither.
std::string chat_template(const fs::path& dir) {
  if (dir.empty()) return {};
  if (fs::exists(dir / "chat_template.jinja"))
    return read_file(dir / "chat_template.jinja", kFn, "chat_template.jinja");
  if (!fs::exists(dir / "tokenizer_config.json")) return {};
  const std::string file = (dir / "tokenizer_config.json").string();
  const json j =
      parse_json(read_file(dir / "tokenizer_config.json", kFn, "tokenizer_config.json"), kFn, file, "UTF-8 JSON");
  return j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()
             ? j["chat_template"].get<std::string>()
             : std::string();
}

uint32_t u32(int64_t v, const char* what) {
  if (v < 0 || v > UINT32_MAX) fail(kFn, what, "a value that fits in uint32", std::to_string(v));
  return static_cast<uint32_t>(v);
}

// The rope_freqs tensor llama.cpp reads for llama3 RoPE scaling: a file's own factors, or those
// convert_hf_to_gguf.py computes from a llama3 rope_scaling (its float32 arithmetic: the default
// frequencies, each kept, divided by factor, or smoothed between by wavelength); empty otherwise.
std::vector<float> rope_freqs(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  if (s.kind == RopeScalingKind::factors) return s.factors;
  if (s.kind != RopeScalingKind::llama3) return {};
  const float factor = static_cast<float>(s.factor), low = static_cast<float>(s.low_freq_factor);
  const float high = static_cast<float>(s.high_freq_factor);
  const float old_len = static_cast<float>(s.original_max_position_embeddings);
  const double low_wavelen = double(s.original_max_position_embeddings) / s.low_freq_factor;
  const double high_wavelen = double(s.original_max_position_embeddings) / s.high_freq_factor;
  std::vector<float> out;
  for (int64_t i = 0; i < c.rotary_dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(c.rotary_dim);
    const float freq = 1.0f / static_cast<float>(std::pow(double(static_cast<float>(c.rope_theta)), double(e)));
    const float wavelen = static_cast<float>(2 * M_PI) / freq;
    if (wavelen < static_cast<float>(high_wavelen)) {
      out.push_back(1.0f);
    } else if (wavelen > static_cast<float>(low_wavelen)) {
      out.push_back(factor);
    } else {
      const float smooth = (old_len / wavelen - low) / (high - low);
      out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return out;
}

uint32_t file_type(GgufType t) {  // llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_K_S, MOSTLY_BF16
  return t == GgufType::f32 ? 0 : t == GgufType::f16 ? 1 : t == GgufType::q8_0 ? 7 : t == GgufType::q4_k ? 14 : 32;
}

}  // namespace

void save_gguf(const Model& model, const fs::path& path, GgufType type, bool overwrite, const fs::path& tokenizer_dir) {
  const ModelConfig& c = model.config();
  const FamilyInfo& family = family_info(c.family);
  if (!family.gguf_arch)
    fail(kFn, "model", message("a model of a family mapped to GGUF (", gguf_families(), ")"), family_name(c.family));
  if (model.weight_type() != WeightType::f32)
    fail(kFn, "model", "float32 weights (load it with dtype f32)", std::string(weight_type_name(model.weight_type())));
  const bool gpt2 = family.hf_names == HfNames::gpt2;
  const std::string a = message(family.gguf_arch, ".");
  GgufWriter w;
  w.add_string("general.architecture", family.gguf_arch);
  w.add_string("general.type", "model");
  w.add_u32(a + "block_count", u32(c.num_layers, "num_layers"));
  w.add_u32(a + "context_length", u32(c.max_positions, "max_positions"));
  w.add_u32(a + "embedding_length", u32(c.hidden_size, "hidden_size"));
  w.add_u32(a + "feed_forward_length", u32(c.intermediate_size, "intermediate_size"));
  w.add_u32(a + "attention.head_count", u32(c.num_heads, "num_heads"));
  if (gpt2) {
    w.add_f32(a + "attention.layer_norm_epsilon", static_cast<float>(c.norm_eps));
  } else {
    w.add_u32(a + "attention.head_count_kv", u32(c.num_kv_heads, "num_kv_heads"));
    w.add_f32(a + "rope.freq_base", static_cast<float>(c.rope_theta));
    w.add_f32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(c.norm_eps));
    w.add_u32(a + "attention.key_length", u32(c.head_dim, "head_dim"));
    w.add_u32(a + "attention.value_length", u32(c.head_dim, "head_dim"));
    w.add_u32(a + "vocab_size", u32(c.vocab_size, "vocab_size"));
    w.add_u32(a + "rope.dimension_count", u32(c.rotary_dim, "rotary_dim"));
    // A window on every layer is llama.cpp's n_swa; other patterns have no key here.
    const int64_t window = c.window_left.empty() ? -1 : c.window_left[0];
    if (std::any_of(c.window_left.begin(), c.window_left.end(), [&](int64_t w) { return w != window; }))
      fail(kFn, "model", "the same window on every layer (what GGUF's attention.sliding_window says)",
           "windows that differ between layers");
    if (window >= 0) w.add_u32(a + "attention.sliding_window", u32(window + 1, "sliding_window"));
    if (c.rope_scaling.kind == RopeScalingKind::linear) {
      w.add_string(a + "rope.scaling.type", "linear");
      w.add_f32(a + "rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
    }
  }
  w.add_u32("general.file_type", file_type(type));
  w.add_u32("general.quantization_version", 2);
  if (const std::optional<Vocab> v = byte_level_vocab(tokenizer_dir, c.vocab_size)) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", gpt2 ? "gpt-2" : v->pre);
    w.add_strings("tokenizer.ggml.tokens", v->tokens);
    w.add_i32s("tokenizer.ggml.token_type", v->types);
    w.add_strings("tokenizer.ggml.merges", v->merges);
    if (c.bos_token_id >= 0) w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(c.bos_token_id));
    if (!c.eos_token_ids.empty()) w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_ids[0]));
    if (fs::exists(tokenizer_dir / "tokenizer.json")) {  // BOS/EOS as its post-processor adds them
      const std::vector<int32_t> ids = Tokenizer::load_dir(tokenizer_dir).encode("", EncodeOptions{true, false});
      w.add_bool("tokenizer.ggml.add_bos_token", !ids.empty() && ids.front() == c.bos_token_id);
      w.add_bool("tokenizer.ggml.add_eos_token",
                 !ids.empty() && !c.eos_token_ids.empty() && ids.back() == c.eos_token_ids[0]);
    }
  } else {
    w.add_string("tokenizer.ggml.model", "no_vocab");
  }
  if (const std::string t = chat_template(tokenizer_dir); !t.empty()) w.add_string("tokenizer.chat_template", t);
  const bool untied = model.parameter("lm_head.weight") != nullptr;
  // Every tensor in GGUF's layout; the parts of a fused tensor (Phi-3's q|k|v, gate|up) gathered
  // into it, in the place of its first part.
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : model.parameters()) {
    const GgufName g = gguf_name(c, name);
    Tensor x = g.layout == GgufLayout::transposed ? transpose_2d(*t)
               : g.layout == GgufLayout::permuted ? permute_rows(*t, g.heads, true)
                                                  : contiguous(t->view());
    if (g.rows == 0) {
      tensors.emplace_back(g.name, std::move(x));
      continue;
    }
    auto fused = std::find_if(tensors.begin(), tensors.end(), [&](const auto& e) { return e.first == g.name; });
    if (fused == tensors.end()) {
      std::vector<int64_t> shape = x.shape();
      shape[0] = g.total_rows;
      tensors.emplace_back(g.name, Tensor(shape));
      fused = std::prev(tensors.end());
    }
    const int64_t row = x.numel() / g.rows;
    std::copy_n(x.data(), x.numel(), fused->second.data() + g.row_begin * row);
  }
  for (auto& [stored_name, x] : tensors) {
    const GgufName g{stored_name};
    GgufType stored = type;
    if (x.shape().size() < 2 || g.name == "position_embd.weight") stored = GgufType::f32;  // as llama.cpp keeps them
    // Q4_K as a q4_k model keeps it (mhsa/model.h WeightType): the output matrix, and rows that are
    // not whole 256-value blocks, Q8_0 (llama.cpp's Q4_K mixes: Q6_K and Q5_0).
    const bool output = g.name == "output.weight" || (!untied && g.name == "token_embd.weight");
    if (stored == GgufType::q4_k && (output || x.shape().back() % 256 != 0)) stored = GgufType::q8_0;
    if (stored == GgufType::q8_0 && x.shape().back() % 32 != 0) stored = GgufType::f16;  // the converter's fallback
    w.add_tensor(g.name, std::move(x), stored);
  }
  if (const std::vector<float> factors = rope_freqs(c); !factors.empty()) {
    Tensor t({static_cast<int64_t>(factors.size())});  // [rotary_dim / 2]
    std::copy(factors.begin(), factors.end(), t.data());
    w.add_tensor("rope_freqs.weight", std::move(t), GgufType::f32);
  }
  w.write(path, overwrite);
}

}  // namespace mhsa::detail
