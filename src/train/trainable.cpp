// train/trainable.cpp — the model families the trainer builds (see train/trainable.h): GPT-2
// (mhsa::Gpt2, written as Hugging Face's GPT2LMHeadModel directory), Llama (mhsa::Model,
// written as a LlamaForCausalLM directory) and a LoRA adapter on a pretrained model (written as
// peft's adapter directory); with dtype bf16, the bfloat16 copy of their matrices
// that the training forward and backward read (mixed precision: float32 masters and AdamW state).
#include "train/trainable.h"

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file.h"
#include "io/json.h"
#include "mhsa/gpt2.h"
#include "mhsa/lora.h"
#include "mhsa/model.h"
#include "mhsa/models.h"
#include "model/access.h"
#include "model/decoder.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

// What the trainer asks of a model, forwarded to M (mhsa::Gpt2 or mhsa::Model, which share these
// calls); a family adds its config.json.
template <class M>
class Trainable : public TrainableModel {
 public:
  Trainable(M model, std::string_view cls, std::string_view context_key, bool bf16)
      : model_(std::move(model)), cls_(cls), context_key_(context_key) {
    if (bf16) {
      parts_ = nn::half_parts(ModelAccess::stack(model_));
      half_.resize(parts_.size());
      refresh_weights();
    }
  }

  std::vector<std::pair<std::string, Tensor*>> parameters() override { return model_.parameters(); }
  std::vector<Tensor> zero_gradients() const override { return model_.zero_gradients(); }
  // M::loss_and_gradients, with the backward's hook; with bf16 over the bfloat16 copies.
  double loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                            std::vector<Tensor>& grads, const std::function<void(size_t)>& on_final) const override {
    nn::Stack s = ModelAccess::stack(model_);
    if (!parts_.empty()) {
      s.half.assign(s.params.size(), nullptr);
      for (size_t i = 0; i < parts_.size(); ++i) s.half[static_cast<size_t>(parts_[i].index)] = &half_[i];
    }
    std::vector<std::string> names;
    for (auto& [name, t] : model_.parameters()) names.push_back(std::move(name));
    const Decoder d{s, cls_, context_key_, {}, names};
    return detail::loss_and_gradients(d, ids, targets, B, T, &grads, on_final);
  }
  double loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const override {
    return model_.loss(ids, targets, B, T);
  }
  void refresh_weights() override {
    const nn::Stack s = ModelAccess::stack(model_);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < parts_.size(); ++i) half_[i].round_from(s.p(parts_[i].index), parts_[i].transposed);
  }

 protected:
  M model_;
  std::string_view cls_, context_key_;  // as M's own messages name them
  std::vector<nn::HalfPart> parts_;     // bf16: the matrices kept as bfloat16 copies (empty: f32)
  std::vector<nn::HalfMatrix> half_;    // bf16: their copies, parts_' order
};

class TrainableGpt2 final : public Trainable<Gpt2> {
 public:
  TrainableGpt2(Gpt2 m, bool bf16) : Trainable(std::move(m), "Gpt2", "n_positions", bf16) {}

  std::string config_json() const override {
    const Gpt2Config& c = model_.config();
    nlohmann::json j = {{"model_type", "gpt2"},
                        {"architectures", {"GPT2LMHeadModel"}},
                        {"vocab_size", c.vocab_size},
                        {"n_positions", c.n_positions},
                        {"n_ctx", c.n_positions},
                        {"n_embd", c.n_embd},
                        {"n_layer", c.n_layer},
                        {"n_head", c.n_head},
                        {"n_inner", nullptr},
                        {"activation_function", "gelu_new"},
                        {"layer_norm_epsilon", c.layer_norm_epsilon},
                        {"bos_token_id", c.eos_token_id >= 0 ? nlohmann::json(c.eos_token_id) : nlohmann::json()},
                        {"eos_token_id", c.eos_token_id >= 0 ? nlohmann::json(c.eos_token_id) : nlohmann::json()},
                        {"mhsa_tokenizer", c.vocab_size == 256 ? "bytes" : "gpt2"}};
    return j.dump(2) + "\n";
  }

  void check_config(const std::filesystem::path& file, std::string_view fn) const override {
    const Gpt2Config& config = model_.config();
    const Gpt2Config c = Gpt2Config::load(file);
    if (c.vocab_size != config.vocab_size || c.n_positions != config.n_positions || c.n_embd != config.n_embd ||
        c.n_layer != config.n_layer || c.n_head != config.n_head || c.mlp_dim() != config.mlp_dim())
      fail(fn, file.string(),
           message("the shape of train_state.safetensors (vocab_size ", config.vocab_size, ", n_positions ",
                   config.n_positions, ", n_embd ", config.n_embd, ", n_layer ", config.n_layer, ", n_head ",
                   config.n_head, ", MLP width ", config.mlp_dim(), ")"),
           message("vocab_size ", c.vocab_size, ", n_positions ", c.n_positions, ", n_embd ", c.n_embd, ", n_layer ",
                   c.n_layer, ", n_head ", c.n_head, ", MLP width ", c.mlp_dim()));
  }
};

// The Llama a run's options describe: Hugging Face's LlamaConfig with rope_scaling none, no
// biases, RMSNorm eps 1e-5, every layer global.
ModelConfig llama_config(const TrainOptions& o, const Tokenizer& tokenizer) {
  ModelConfig c;
  c.family = Family::llama;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = tokenizer.vocab_size();
  c.hidden_size = o.embd;
  c.num_layers = o.layers;
  c.num_heads = o.heads;
  c.num_kv_heads = o.kv_head_count();
  c.head_dim = o.embd / o.heads;
  c.intermediate_size = o.mlp_width();
  c.max_positions = o.context;
  c.norm = NormKind::rms_norm;
  c.norm_eps = 1e-5;
  c.positions = PositionKind::rotary;
  c.rope_theta = o.rope_theta;
  c.rotary_dim = c.head_dim;
  c.mlp = MlpKind::swiglu;
  c.qkv_bias = c.o_bias = c.mlp_bias = false;
  c.window_left.assign(static_cast<size_t>(o.layers), -1);
  c.tie_word_embeddings = o.tied_head;
  if (!o.tokenizer.empty()) {  // GPT-2's BPE: its one special token begins and ends texts
    c.bos_token_id = tokenizer.eos_id();
    c.eos_token_ids = {tokenizer.eos_id()};
  }
  return c;
}

// config.json as the model's family writes it (model/families/).
std::string family_config_json(const ModelConfig& c) {
  const FamilyInfo& family = family_info(c.family);
  if (!family.write_config) fail("train", "model", "a family mhsa writes config.json for", family_name(c.family));
  return family.write_config(c);
}

class TrainableLlama final : public Trainable<Model> {
 public:
  TrainableLlama(Model m, bool bf16) : Trainable(std::move(m), "Model", "max_positions", bf16) {}

  std::string config_json() const override { return family_config_json(model_.config()); }

  // The keys that decide the weights' shapes and meaning, compared with what this model writes.
  void check_config(const std::filesystem::path& file, std::string_view fn) const override {
    const nlohmann::json mine = nlohmann::json::parse(family_config_json(model_.config()));
    const nlohmann::json theirs = parse_json(read_file(file, fn, "config.json"), fn, file.string());
    std::string want, got;
    bool same = theirs.is_object();
    for (const char* key : {"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                            "rope_theta", "tie_word_embeddings"}) {
      const nlohmann::json value = theirs.is_object() ? theirs.value(key, nlohmann::json()) : nlohmann::json();
      same = same && value == mine[key];
      want += message(want.empty() ? "" : ", ", key, " ", mine[key].dump());
      got += message(got.empty() ? "" : ", ", key, " ", json_excerpt(value));
    }
    if (!same) fail(fn, file.string(), "the shape of train_state.safetensors (" + want + ")", got);
  }
};

// A LoRA adapter on a frozen pretrained model (mhsa/lora.h): parameters() are the adapter's A and
// B under peft's names; the checkpoint's files are peft's.
class TrainableLora final : public TrainableModel {
 public:
  TrainableLora(const TrainOptions& o, uint64_t seed)
      : name_(o.model),
        base_(Model::load(resolve_model(o.model, "model").path, o.dtype == "bf16" ? WeightType::bf16 : WeightType::f32)),
        lora_(Lora::create(base_, o.lora, seed)) {
    if (o.context > base_.config().max_positions)
      fail("train", "context", message("at most the model's max_positions, ", base_.config().max_positions),
           std::to_string(o.context));
  }

  std::vector<std::pair<std::string, Tensor*>> parameters() override { return lora_.parameters(); }
  std::vector<Tensor> zero_gradients() const override { return lora_.zero_gradients(); }
  double loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                            std::vector<Tensor>& grads, const std::function<void(size_t)>& on_final) const override {
    return lora_.loss_and_gradients(base_, ids, targets, B, T, grads, on_final);
  }
  double loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const override {
    return lora_.loss(base_, ids, targets, B, T);
  }
  void refresh_weights() override {}  // the adapter is float32; a bf16 base is rounded once, at load
  std::string config_json() const override { return lora_.config_json(name_); }
  std::string config_file() const override { return "adapter_config.json"; }
  std::string weights_file() const override { return "adapter_model.safetensors"; }

  // The adapter's rank, alpha and targets, compared with what this run writes.
  void check_config(const std::filesystem::path& file, std::string_view fn) const override {
    const nlohmann::json mine = parse_json(config_json(), fn, "adapter_config.json");
    const nlohmann::json theirs = parse_json(read_file(file, fn, "adapter_config.json"), fn, file.string());
    for (const char* key : {"peft_type", "r", "lora_alpha", "target_modules"}) {
      const nlohmann::json value = theirs.is_object() ? theirs.value(key, nlohmann::json()) : nlohmann::json();
      if (value != mine[key])
        fail(fn, file.string(), message("the adapter of train_state.safetensors (", key, " ", mine[key].dump(), ")"),
             message(key, " ", json_excerpt(value)));
    }
  }

 private:
  std::string name_;
  Model base_;
  Lora lora_;
};

}  // namespace

Tokenizer run_tokenizer(const TrainOptions& o, const std::filesystem::path& vocabulary) {
  if (!o.model.empty()) return Tokenizer::load_dir(resolve_model(o.model, "model").path);
  return o.tokenizer.empty() ? Tokenizer::bytes() : Tokenizer::load_dir(vocabulary);
}

std::unique_ptr<TrainableModel> new_trainable_model(const TrainOptions& o, const Tokenizer& tokenizer, uint64_t seed) {
  if (!o.model.empty()) return std::make_unique<TrainableLora>(o, seed);
  const bool bf16 = o.dtype == "bf16";
  if (o.arch == "llama") return std::make_unique<TrainableLlama>(Model::random(llama_config(o, tokenizer), seed), bf16);
  Gpt2Config c;
  c.vocab_size = tokenizer.vocab_size();
  c.n_positions = o.context;
  c.n_embd = o.embd;
  c.n_layer = o.layers;
  c.n_head = o.heads;
  c.eos_token_id = o.tokenizer.empty() ? -1 : tokenizer.eos_id();
  return std::make_unique<TrainableGpt2>(Gpt2::random(c, seed), bf16);
}

}  // namespace mhsa::detail
