// train/options.cpp — TrainOptions: their validation and their JSON form in a checkpoint (see
// train/options.h).
#include "train/options.h"

#include <cmath>

#include "core/check.h"
#include "io/json.h"
#include "text/unicode_data.h"

namespace mhsa {

using detail::check_range;
using detail::fail;
using detail::message;

void detail::check_range(std::string_view fn, std::string_view arg, double x, double lo, double hi, bool open_lo,
                         bool open_hi) {
  const bool ok = std::isfinite(x) && (open_lo ? x > lo : x >= lo) && (open_hi ? x < hi : x <= hi);
  if (ok) return;
  const std::string range = std::isinf(hi) ? message(open_lo ? "> " : ">= ", lo)
                                           : message("in ", open_lo ? "(" : "[", lo, ", ", hi, open_hi ? ")" : "]");
  fail(fn, arg, "a finite number " + range, message(x));
}

void TrainOptions::validate() const {
  constexpr std::string_view fn = "TrainOptions";
  constexpr double inf = HUGE_VAL;
  if (layers <= 0 || heads <= 0 || embd <= 0 || embd % heads != 0 || context <= 1)
    fail(fn, "shape", "layers, heads > 0, embd a multiple of heads, context > 1",
         message(layers, " layers, ", heads, " heads, embd ", embd, ", context ", context));
  const std::pair<const char*, int64_t> positive[] = {
      {"steps", steps}, {"batch", batch}, {"accumulate", accumulate}, {"eval_batches", eval_batches}};
  for (const auto& [name, n] : positive)
    if (n <= 0) fail(fn, name, "a count > 0", std::to_string(n));
  const std::pair<const char*, int64_t> counts[] = {
      {"warmup", warmup}, {"schedule_steps", schedule_steps}, {"eval_every", eval_every},
      {"checkpoint_every", checkpoint_every}};
  for (const auto& [name, n] : counts)
    if (n < 0) fail(fn, name, "a count >= 0 (0: none)", std::to_string(n));
  if (arch != "gpt2" && arch != "llama") fail(fn, "arch", "gpt2 or llama", detail::json_excerpt(nlohmann::json(arch)));
  if (arch == "gpt2") {
    const TrainOptions d;
    if (kv_heads != d.kv_heads || mlp != d.mlp || rope_theta != d.rope_theta || tied_head != d.tied_head)
      fail(fn, "arch", "llama for the options kv_heads, mlp, rope_theta and tied_head (GPT-2 has none of them)",
           message("gpt2 with kv_heads ", kv_heads, ", mlp ", mlp, ", rope_theta ", rope_theta, ", tied_head ",
                   tied_head ? "true" : "false"));
  } else {
    if (kv_heads < 0 || heads % kv_head_count() != 0)
      fail(fn, "kv_heads", message("a count dividing heads (", heads, "), or 0 for as many"), std::to_string(kv_heads));
    if (mlp < 0) fail(fn, "mlp", "a width >= 0 (0: 8·embd/3)", std::to_string(mlp));
    if ((embd / heads) % 2 != 0)
      fail(fn, "shape", "an even head width embd / heads (RoPE rotates pairs)",
           message("embd ", embd, " / ", heads, " heads = ", embd / heads));
    check_range(fn, "rope_theta", rope_theta, 0, inf, true);
  }
  if (!dtype.empty() && dtype != "f32" && dtype != "bf16")
    fail(fn, "dtype", "f32 or bf16", detail::json_excerpt(nlohmann::json(dtype)));
  // The checkpoint records the tokenizer's directory in its options (JSON, which holds UTF-8 only),
  // and a resumed run loads the vocabulary from there.
  if (const size_t at = text::invalid_utf8_at(tokenizer); at != std::string_view::npos)
    fail(fn, "tokenizer", "a directory path of valid UTF-8 (checkpoints record it in JSON)",
         message(detail::quote(tokenizer), ", invalid UTF-8 at byte ", at));
  if (model.empty() != (lora.rank == 0))
    fail(fn, model.empty() ? "lora_rank" : "model",
         "a LoRA rank with a pretrained model, or neither (full fine-tuning of a pretrained model is not offered)",
         model.empty() ? message("rank ", lora.rank, " without a model") : "a model without a LoRA rank");
  if (!model.empty()) {
    lora.validate(fn);
    if (const size_t at = text::invalid_utf8_at(model); at != std::string_view::npos)
      fail(fn, "model", "a path of valid UTF-8 (checkpoints record it in JSON)",
           message(detail::quote(model), ", invalid UTF-8 at byte ", at));
  }
  check_range(fn, "lr", lr, 0, inf, true);
  check_range(fn, "min_lr_ratio", min_lr_ratio, 0, 1);
  check_range(fn, "clip", clip, 0, inf);
  check_range(fn, "val_fraction", val_fraction, 0, 0.5, true, true);
  adamw.validate(fn);
}

int64_t TrainOptions::mlp_width() const { return mlp > 0 ? mlp : (8 * embd / 3 + 7) / 8 * 8; }

nlohmann::json detail::options_json(const TrainOptions& o) {
  nlohmann::json j = {{"layers", o.layers},         {"heads", o.heads},
          {"embd", o.embd},             {"context", o.context},
          {"steps", o.steps},           {"batch", o.batch},
          {"accumulate", o.accumulate}, {"lr", o.lr},
          {"min_lr_ratio", o.min_lr_ratio}, {"warmup", o.warmup},
          {"clip", o.clip},             {"beta1", o.adamw.beta1},
          {"beta2", o.adamw.beta2},     {"eps", o.adamw.eps},
          {"weight_decay", o.adamw.weight_decay}, {"seed", o.seed},
          {"val_fraction", o.val_fraction}, {"eval_every", o.eval_every},
          {"eval_batches", o.eval_batches}, {"checkpoint_every", o.checkpoint_every},
          {"tokenizer", o.tokenizer}};
  if (o.arch != "gpt2")  // a GPT-2 run's checkpoint stays as it was before there were others
    j.update({{"arch", o.arch},
              {"kv_heads", o.kv_heads},
              {"mlp", o.mlp},
              {"rope_theta", o.rope_theta},
              {"tied_head", o.tied_head}});
  if (o.dtype == "bf16") j["dtype"] = o.dtype;  // absent: f32, as in checkpoints from before bf16
  if (o.schedule_steps > 0 && o.schedule_steps != o.steps) j["schedule_steps"] = o.schedule_steps;  // absent: steps
  if (!o.model.empty())
    j.update({{"model", o.model},
              {"lora_rank", o.lora.rank},
              {"lora_alpha", o.lora.alpha_or_default()},
              {"lora_targets", o.lora.targets}});
  return j;
}

TrainOptions detail::options_from_json(const nlohmann::json& j) {
  TrainOptions o;
  o.layers = j.at("layers");
  o.heads = j.at("heads");
  o.embd = j.at("embd");
  o.context = j.at("context");
  o.steps = j.at("steps");
  o.batch = j.at("batch");
  o.accumulate = j.at("accumulate");
  o.lr = j.at("lr");
  o.min_lr_ratio = j.at("min_lr_ratio");
  o.warmup = j.at("warmup");
  o.clip = j.at("clip");
  o.adamw.beta1 = j.at("beta1");
  o.adamw.beta2 = j.at("beta2");
  o.adamw.eps = j.at("eps");
  o.adamw.weight_decay = j.at("weight_decay");
  o.seed = j.at("seed");
  o.val_fraction = j.at("val_fraction");
  o.eval_every = j.at("eval_every");
  o.eval_batches = j.at("eval_batches");
  o.checkpoint_every = j.at("checkpoint_every");
  o.tokenizer = j.value("tokenizer", "");  // absent in checkpoints from before BPE: bytes
  o.arch = j.value("arch", o.arch);        // absent: GPT-2 (and Llama's options at their defaults)
  o.kv_heads = j.value("kv_heads", o.kv_heads);
  o.mlp = j.value("mlp", o.mlp);
  o.rope_theta = j.value("rope_theta", o.rope_theta);
  o.tied_head = j.value("tied_head", o.tied_head);
  o.dtype = j.value("dtype", "f32");
  o.schedule_steps = j.value("schedule_steps", int64_t{0});
  if (j.contains("model")) {
    o.model = j.at("model");
    o.lora.rank = j.at("lora_rank");
    o.lora.alpha = j.at("lora_alpha");
    o.lora.targets = j.at("lora_targets").get<std::vector<std::string>>();
  }
  return o;
}

}  // namespace mhsa
