// train/trainable.cpp — the model families the trainer builds (see train/trainable.h): GPT-2
// (mhsa::Gpt2, written as Hugging Face's GPT2LMHeadModel directory).
#include "train/trainable.h"

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "mhsa/gpt2.h"

namespace mhsa::detail {
namespace {

class TrainableGpt2 final : public TrainableModel {
 public:
  explicit TrainableGpt2(Gpt2 model) : model_(std::move(model)) {}

  std::vector<std::pair<std::string, Tensor*>> parameters() override { return model_.parameters(); }
  std::vector<Tensor> zero_gradients() const override { return model_.zero_gradients(); }
  double loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                            std::vector<Tensor>& grads) const override {
    return model_.loss_and_gradients(ids, targets, B, T, grads);
  }
  double loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const override {
    return model_.loss(ids, targets, B, T);
  }

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

 private:
  Gpt2 model_;
};

}  // namespace

std::unique_ptr<TrainableModel> new_trainable_model(const TrainOptions& o, const Tokenizer& tokenizer, uint64_t seed) {
  Gpt2Config c;
  c.vocab_size = tokenizer.vocab_size();
  c.n_positions = o.context;
  c.n_embd = o.embd;
  c.n_layer = o.layers;
  c.n_head = o.heads;
  c.eos_token_id = o.tokenizer.empty() ? -1 : tokenizer.eos_id();
  return std::make_unique<TrainableGpt2>(Gpt2::random(c, seed));
}

}  // namespace mhsa::detail
