// model/lora.cpp — LoRA adapters on a frozen model (see mhsa/lora.h). An adapter is a list of
// targets (a base module and its shape) with their A and B; every call builds the base's nn::Stack
// with A and B appended to its parameters and marked at their weight (nn::Stack::lora), so the
// one block runs base + adapter in inference and training alike. Files follow peft's format.
#include "mhsa/lora.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file.h"
#include "io/json.h"
#include "mhsa/safetensors.h"
#include "model/access.h"
#include "model/decoder.h"

namespace mhsa {

using detail::fail;
using detail::message;

namespace {

namespace fs = std::filesystem;

// mhsa's target names and the module names Llama-shaped families give those layers in transformers.
const std::pair<const char*, const char*> kTargets[] = {{"q", "q_proj"},       {"k", "k_proj"},   {"v", "v_proj"},
                                                        {"o", "o_proj"},       {"gate", "gate_proj"},
                                                        {"up", "up_proj"},     {"down", "down_proj"}};

const nn::LinearRef& target_ref(const nn::LayerRefs& r, std::string_view target) {
  if (target == "q") return r.q;
  if (target == "k") return r.k;
  if (target == "v") return r.v;
  if (target == "o") return r.o;
  if (target == "gate") return r.gate;
  if (target == "up") return r.up;
  return r.down;
}

std::string peft_name(const std::string& module, char ab) {
  return "base_model.model." + module + ".lora_" + ab + ".weight";
}

// Throws unless base's weights are ones an adapter can train on (read, never written).
void check_base(const Model& base, std::string_view fn) {
  const WeightType w = base.weight_type();
  if (w != WeightType::f32 && w != WeightType::bf16)
    fail(fn, "base", "a model with float32 or bfloat16 weights (load it with dtype f32 or bf16 to train an adapter)",
         message("a model of ", weight_type_name(w), " weights"));
}

}  // namespace

// The base's stack with the adapter's A and B appended to its parameters (names too, when asked).
struct LoraAccess {
  static nn::Stack stack(const Lora& l, const Model& base, std::string_view fn, std::vector<std::string>* names) {
    check_base(base, fn);
    nn::Stack s = ModelAccess::stack(base);
    std::map<std::string, int, std::less<>> index;
    int i = 0;
    for (const auto& [name, t] : base.parameters()) {
      if (names) names->push_back(name);
      index.emplace(name, i++);
    }
    const size_t n = s.params.size();
    s.lora.assign(n + 2 * l.targets_.size(), {});
    for (size_t t = 0; t < l.targets_.size(); ++t) {
      const auto it = index.find(l.targets_[t].module + ".weight");
      if (it == index.end())
        fail(fn, "base", message("a model with the layer ", l.targets_[t].module, " (the adapter's)"), "none");
      s.params.push_back(&l.a_[t]);
      s.params.push_back(&l.b_[t]);
      s.lora[static_cast<size_t>(it->second)] = {static_cast<int>(n + 2 * t), static_cast<int>(n + 2 * t + 1),
                                                  static_cast<float>(l.options_.scale())};
      if (names) {
        names->push_back(peft_name(l.targets_[t].module, 'A'));
        names->push_back(peft_name(l.targets_[t].module, 'B'));
      }
    }
    // Indexed like params: the adapter's matrices are float32.
    if (!s.half.empty()) s.half.resize(s.params.size(), nullptr);
    if (!s.q8.empty()) s.q8.resize(s.params.size(), nullptr);
    if (!s.q4.empty()) s.q4.resize(s.params.size(), nullptr);
    if (!s.blocked.empty()) s.blocked.resize(s.params.size(), nullptr);
    return s;
  }

  // The targets of `base` for options, with each layer's shape, in parameter order.
  static std::vector<Lora::Target> targets(const Model& base, const LoraOptions& o, std::string_view fn) {
    check_base(base, fn);
    const nn::Stack s = ModelAccess::stack(base);
    std::vector<std::string> names;
    for (const auto& [name, t] : base.parameters()) names.push_back(name);
    std::vector<Lora::Target> targets;
    for (const nn::LayerRefs& r : s.layers)
      for (const auto& [target, module] : kTargets) {
        if (std::find(o.targets.begin(), o.targets.end(), target) == o.targets.end()) continue;
        const nn::LinearRef& l = target_ref(r, target);
        if (l.w < 0 || l.layout != nn::Layout::out_in)
          fail(fn, "targets",
               message("layers the base has as separate [out, in] matrices (q, k, v, o, gate, up, down of a "
                       "Llama-shaped family)"),
               message("'", target, "' in a ", s.config->architecture, " model"));
        const std::string& name = names[static_cast<size_t>(l.w)];
        const std::string suffix = ".weight";
        if (!name.ends_with(suffix)) fail(fn, "base", "weights named <module>.weight", name);
        int64_t out = 0, in = 0;
        if (const nn::HalfMatrix* h = s.p16(l.w)) {
          out = h->rows, in = h->cols;
        } else {
          out = s.p(l.w).dim(0), in = s.p(l.w).dim(1);
        }
        if (o.rank > std::min(in, out))
          fail(fn, "rank", message("at most the smaller side of ", name, " [", out, ", ", in, "]"),
               std::to_string(o.rank));
        targets.push_back({name.substr(0, name.size() - suffix.size()), in, out});
      }
    return targets;
  }
};

void LoraOptions::validate(std::string_view fn) const {
  if (rank < 1) fail(fn, "rank", "a rank >= 1", std::to_string(rank));
  if (!std::isfinite(alpha) || alpha < 0) fail(fn, "alpha", "a finite number >= 0 (0: 2·rank)", message(alpha));
  if (targets.empty()) fail(fn, "targets", "at least one of q, k, v, o, gate, up, down", "none");
  for (size_t i = 0; i < targets.size(); ++i) {
    bool known = false;
    for (const auto& [name, module] : kTargets) known = known || targets[i] == name;
    if (!known)
      fail(fn, "targets", "names among q, k, v, o, gate, up, down", detail::json_excerpt(nlohmann::json(targets[i])));
    if (std::find(targets.begin(), targets.begin() + static_cast<std::ptrdiff_t>(i), targets[i]) !=
        targets.begin() + static_cast<std::ptrdiff_t>(i))
      fail(fn, "targets", "each name once", message("'", targets[i], "' twice"));
  }
}

std::vector<std::string> split_lora_targets(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    std::string_view item = list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    out.emplace_back(item);
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

Lora Lora::create(const Model& base, const LoraOptions& options, uint64_t seed) {
  constexpr std::string_view fn = "Lora::create";
  options.validate(fn);
  Lora l;
  l.options_ = options;
  l.targets_ = LoraAccess::targets(base, options, fn);
  uint64_t state = seed;
  for (const Target& t : l.targets_) {
    // kaiming_uniform_(a = √5): uniform in ±1/√in, i.e. a standard deviation of 1/√(3·in).
    l.a_.push_back(detail::random_tensor({options.rank, t.in}, static_cast<float>(1.0 / std::sqrt(3.0 * double(t.in))),
                                         state));
    l.b_.emplace_back(std::vector<int64_t>{t.out, options.rank});
  }
  return l;
}

std::string Lora::config_json(const std::string& base_model) const {
  nlohmann::ordered_json modules = nlohmann::ordered_json::array();
  for (const auto& [target, module] : kTargets)
    if (std::find(options_.targets.begin(), options_.targets.end(), target) != options_.targets.end())
      modules.push_back(module);
  const double alpha = options_.alpha_or_default();
  nlohmann::ordered_json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(base_model)},
      {"r", options_.rank},
      {"lora_alpha", alpha == std::floor(alpha) && alpha < 1e15 ? nlohmann::ordered_json(static_cast<int64_t>(alpha))
                                                               : nlohmann::ordered_json(alpha)},
      {"lora_dropout", 0.0},
      {"target_modules", modules},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", false},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::ordered_json::object()},
      {"alpha_pattern", nlohmann::ordered_json::object()}};
  return j.dump(2) + "\n";
}

void Lora::save(const fs::path& dir, const std::string& base_model) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::vector<std::pair<std::string, ConstTensorView>> tensors;
  for (const auto& [name, t] : parameters()) tensors.emplace_back(name, t->view());
  save_safetensors((dir / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  const std::string text = config_json(base_model);
  detail::OutputFile file((dir / "adapter_config.json").string(), "Lora::save");
  file.write(text.data(), text.size());
  file.commit();
}

Lora Lora::load(const fs::path& dir, const Model& base) {
  constexpr std::string_view fn = "Lora::load";
  const fs::path config_file = dir / "adapter_config.json", weights_file = dir / "adapter_model.safetensors";
  const nlohmann::json j = detail::parse_json(detail::read_file(config_file, fn, "dir"), fn, config_file.string());
  const auto bad = [&](const char* key, const std::string& expected) {
    fail(fn, message(config_file.string(), ": ", key), expected,
         detail::json_excerpt(j.is_object() ? j.value(key, nlohmann::json()) : j));
  };
  if (!j.is_object() || j.value("peft_type", nlohmann::json()) != "LORA") bad("peft_type", "\"LORA\"");
  LoraOptions o;
  if (!j.contains("r") || !j["r"].is_number_integer()) bad("r", "an integer rank");
  o.rank = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) bad("lora_alpha", "a number");
  o.alpha = j["lora_alpha"].get<double>();
  for (const char* flag : {"use_rslora", "use_dora", "fan_in_fan_out"})
    if (j.contains(flag) && j[flag] != false) bad(flag, "false (mhsa implements plain LoRA)");
  if (j.contains("bias") && j["bias"] != "none") bad("bias", "\"none\"");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (j.contains(key) && !j[key].is_null() && !j[key].empty()) bad(key, "none (one rank and alpha for all layers)");
  for (const char* key : {"layers_to_transform", "modules_to_save"})
    if (j.contains(key) && !j[key].is_null()) bad(key, "null (every layer; no other module trained)");
  const nlohmann::json modules = j.value("target_modules", nlohmann::json());
  if (!modules.is_array()) bad("target_modules", "a list of module names (q_proj, ..., down_proj)");
  o.targets.clear();
  for (const auto& [target, module] : kTargets)
    for (const nlohmann::json& m : modules)
      if (m == module) o.targets.push_back(target);
  if (o.targets.size() != modules.size()) bad("target_modules", "names among q_proj, k_proj, v_proj, o_proj, "
                                                                "gate_proj, up_proj, down_proj, each once");
  try {
    o.validate(fn);
  } catch (const Error& e) {
    fail(fn, config_file.string(), "valid LoRA options", e.what());
  }
  Lora l;
  l.options_ = o;
  l.targets_ = LoraAccess::targets(base, o, fn);
  const SafeTensors st = SafeTensors::open(weights_file.string());
  size_t found = 0;
  for (const Target& t : l.targets_)
    for (const char ab : {'A', 'B'}) {
      const std::string name = peft_name(t.module, ab);
      const std::vector<int64_t> shape = ab == 'A' ? std::vector<int64_t>{o.rank, t.in} : std::vector<int64_t>{t.out, o.rank};
      const SafeTensorInfo* info = st.find(name);
      if (!info) fail(fn, weights_file.string(), message("a tensor '", name, "'"), "none");
      if (info->shape != shape)
        fail(fn, message(weights_file.string(), ": tensor '", name, "'"),
             message("shape [", shape[0], ", ", shape[1], "] (the base's layer and r)"), "another shape");
      (ab == 'A' ? l.a_ : l.b_).push_back(st.load(name));
      ++found;
    }
  if (found != st.tensors().size())
    for (const SafeTensorInfo& info : st.tensors())
      if (std::none_of(l.targets_.begin(), l.targets_.end(), [&](const Target& t) {
            return info.name == peft_name(t.module, 'A') || info.name == peft_name(t.module, 'B');
          }))
        fail(fn, weights_file.string(), "only the tensors of adapter_config.json's target_modules",
             message("a tensor '", info.name, "'"));
  return l;
}

std::vector<std::pair<std::string, Tensor*>> Lora::parameters() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t t = 0; t < targets_.size(); ++t) {
    out.emplace_back(peft_name(targets_[t].module, 'A'), &a_[t]);
    out.emplace_back(peft_name(targets_[t].module, 'B'), &b_[t]);
  }
  return out;
}

std::vector<std::pair<std::string, const Tensor*>> Lora::parameters() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (const auto& [name, t] : const_cast<Lora*>(this)->parameters()) out.emplace_back(name, t);
  return out;
}

std::vector<Tensor> Lora::zero_gradients() const {
  std::vector<Tensor> grads;
  for (size_t t = 0; t < targets_.size(); ++t) {
    grads.emplace_back(a_[t].shape());
    grads.emplace_back(b_[t].shape());
  }
  return grads;
}

Tensor Lora::forward(const Model& base, std::span<const int32_t> ids, int64_t B, int64_t T) const {
  std::vector<std::string> names;
  const nn::Stack s = LoraAccess::stack(*this, base, "Lora::forward", &names);
  const detail::Decoder d{s, "Lora", "max_positions", {}, names, KVType::f32};
  return detail::forward(d, ids, B, T, nullptr);
}

double Lora::loss(const Model& base, std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B,
                  int64_t T) const {
  std::vector<std::string> names;
  const nn::Stack s = LoraAccess::stack(*this, base, "Lora::loss", &names);
  const detail::Decoder d{s, "Lora", "max_positions", {}, names, KVType::f32};
  return detail::loss_and_gradients(d, ids, targets, B, T, nullptr);
}

double Lora::loss_and_gradients(const Model& base, std::span<const int32_t> ids, std::span<const int32_t> targets,
                                int64_t B, int64_t T, std::vector<Tensor>& grads,
                                const std::function<void(size_t)>& on_final) const {
  constexpr std::string_view fn = "Lora::loss_and_gradients";
  const size_t n = 2 * targets_.size();
  if (grads.size() != n) fail(fn, "grads", message(n, " tensors (zero_gradients())"), std::to_string(grads.size()));
  for (size_t i = 0; i < n; ++i)
    if (grads[i].shape() != (i % 2 ? b_ : a_)[i / 2].shape())
      fail(fn, message("grads[", i, "]"), "the shape of its parameter (zero_gradients())", "another shape");
  std::vector<std::string> names;
  const nn::Stack s = LoraAccess::stack(*this, base, fn, &names);
  const size_t frozen = s.params.size() - n;  // the base's parameters: no gradient (undefined tensors)
  std::vector<Tensor> all(frozen);
  for (Tensor& g : grads) all.push_back(std::move(g));
  // The caller's tensors are lent to `all` and given back as they become final, before on_final
  // says so (the caller then reads them: a data-parallel run reduces them during the backward).
  size_t reported = n;
  const auto give_back = [&](size_t from) {
    for (size_t i = from; i < reported; ++i) grads[i] = std::move(all[frozen + i]);
    reported = std::min(reported, from);
  };
  const auto hook = [&](size_t first) {  // the suffix of all that is final, as a suffix of grads
    const size_t mine = first > frozen ? first - frozen : 0;
    if (mine >= reported) return;
    give_back(mine);
    if (on_final) on_final(mine);
  };
  const detail::Decoder d{s, "Lora", "max_positions", {}, names, KVType::f32};
  double loss = 0;
  try {
    loss = detail::loss_and_gradients(d, ids, targets, B, T, &all, hook);
  } catch (...) {
    give_back(0);
    throw;
  }
  give_back(0);
  return loss;
}

void Lora::merge_into(Model& base) const {
  constexpr std::string_view fn = "Lora::merge_into";
  if (base.weight_type() != WeightType::f32)
    fail(fn, "base", "a model with float32 weights (load it with dtype f32 to merge)",
         message("a model of ", weight_type_name(base.weight_type()), " weights"));
  const float scale = static_cast<float>(options_.scale());
  const int64_t r = options_.rank;
  for (size_t t = 0; t < targets_.size(); ++t) {
    Tensor* w = nullptr;
    for (auto& [name, p] : base.parameters())
      if (name == targets_[t].module + ".weight") w = p;
    if (!w || w->shape() != std::vector<int64_t>{targets_[t].out, targets_[t].in})
      fail(fn, "base", message("a model with the layer ", targets_[t].module, " [", targets_[t].out, ", ",
                               targets_[t].in, "] (the adapter's)"),
           w ? "another shape" : "none");
    const float *a = a_[t].data(), *b = b_[t].data();
    float* wd = w->data();
    const int64_t in = targets_[t].in, out = targets_[t].out;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double sum = 0;  // one dot product of r terms per weight, in double: rounded once into W
        for (int64_t k = 0; k < r; ++k) sum += double(b[o * r + k]) * double(a[k * in + i]);
        wd[o * in + i] += static_cast<float>(scale * sum);
      }
  }
}

void save_merged(const fs::path& base_dir, const fs::path& adapter_dir, const fs::path& out) {
  constexpr std::string_view fn = "save_merged";
  if (!fs::is_directory(base_dir))
    fail(fn, "base_dir", "a Hugging Face model directory (merging into a GGUF file is not offered)",
         message("'", base_dir.string(), "'"));
  Model base = Model::load(base_dir, WeightType::f32);
  Lora::load(adapter_dir, base).merge_into(base);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) fail(fn, "out", "a directory that can be created", message("'", out.string(), "' (", ec.message(), ")"));
  std::vector<std::pair<std::string, ConstTensorView>> tensors;
  for (const auto& [name, t] : std::as_const(base).parameters()) tensors.emplace_back(name, t->view());
  save_safetensors((out / "model.safetensors").string(), tensors, {{"format", "pt"}});
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                           "special_tokens_map.json", "vocab.json", "merges.txt", "encoder.json", "vocab.bpe"})
    if (const fs::path from = base_dir / name; fs::is_regular_file(from)) {
      const std::string text = detail::read_file(from, fn, "base_dir");
      detail::OutputFile file((out / name).string(), std::string(fn));
      file.write(text.data(), text.size());
      file.commit();
    }
}

}  // namespace mhsa
