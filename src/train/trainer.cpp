// train/trainer.cpp — AdamW, clipping, the schedule, text data (bytes or GPT-2 BPE), checkpoints
// and the training loop (see mhsa/train.h). Every random choice (initial weights, which windows
// form a batch) is a function of the seed and the step, so a resumed run repeats an uninterrupted
// one bit for bit. Nothing read from a checkpoint is trusted: its options are validated and every
// tensor is shape-checked against the model they describe.
#include "mhsa/train.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/checkpoint_dir.h"
#include "io/file.h"
#include "io/json.h"
#include "kernels/dispatch.h"
#include "mhsa/safetensors.h"
#include "mhsa/tokenizer.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::message;
namespace fs = std::filesystem;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: a well-spread hash of (seed, step, row)
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The files of a checkpoint directory (see mhsa/train.h); a new run's first checkpoint replaces
// all of them, so nothing of what the directory held before stays beside it.
const std::vector<std::string> kCheckpointFiles = {"train_state.safetensors", "model.safetensors", "loss_curve.svg",
                                                   "vocab.json", "merges.txt", "encoder.json", "vocab.bpe",
                                                   "config.json"};
const std::vector<std::string> kVocabularyFiles = {"vocab.json", "merges.txt", "encoder.json", "vocab.bpe"};

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) fail("train", "out", "room to write '" + path.string() + "'", "a failed write");
}

// "<size> bytes, FNV-1a <hash>" (64-bit FNV-1a: fast, and any edit changes it).
std::string text_fingerprint(std::string_view bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return message(bytes.size(), " bytes, FNV-1a ", hex);
}

bool all_finite(const Tensor& t) {
  const float* x = t.data();
  bool finite = true;
  for (int64_t i = 0; i < t.numel(); ++i) finite &= std::isfinite(x[i]);
  return finite;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// What a diverged run says: where it stopped and what it kept.
std::string divergence(const fs::path& out, int64_t saved_step) {
  return message("the run diverged: lower --lr (or clip gradients with --clip); ",
                 saved_step > 0 ? message("the checkpoint of step ", saved_step, " in '", out.string(), "' is kept")
                                : std::string("no checkpoint of this run was written"));
}

nlohmann::json options_json(const TrainOptions& o) {
  return {{"layers", o.layers},         {"heads", o.heads},
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
}

TrainOptions options_from_json(const nlohmann::json& j) {
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
  return o;
}

std::string config_json(const Gpt2Config& c) {
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

// The model a run's options and vocabulary describe (a resumed run's too: its config.json is
// only checked against this).
Gpt2Config model_config(const TrainOptions& o, const Tokenizer& tokenizer) {
  Gpt2Config c;
  c.vocab_size = tokenizer.vocab_size();
  c.n_positions = o.context;
  c.n_embd = o.embd;
  c.n_layer = o.layers;
  c.n_head = o.heads;
  c.eos_token_id = o.tokenizer.empty() ? -1 : tokenizer.eos_id();
  return c;
}

struct History {
  double bytes_per_token = 1;                        // of the training text: nats/token -> bits/byte
  std::vector<double> loss;                          // per step, nats per token
  std::vector<std::pair<int64_t, double>> val_bpb;   // (step, bits per byte)
};

// The loss curve as a small self-contained SVG: training loss per step (bits per byte) and the
// validation points.
std::string loss_curve_svg(const History& h) {
  const double W = 640, H = 360, L = 56, R = 16, T = 20, Bm = 40;
  double hi = -INFINITY, lo = INFINITY;
  const auto bpb = [&](double nats) { return nats / std::log(2.0) / h.bytes_per_token; };
  const auto extend = [&](double v) {
    if (std::isfinite(v)) hi = std::max(hi, v), lo = std::min(lo, v);
  };
  for (double l : h.loss) extend(bpb(l));
  for (const auto& [s, v] : h.val_bpb) extend(v);
  if (lo > hi) hi = 1, lo = 0;
  // Gridlines every 0.5, 1, 2, 5, 10, 20, ... bits per byte: at most 10 of them, whatever the
  // range (a run that diverged to 1e8 bits per byte had asked for 2·10^8 lines at a fixed 0.5).
  double tick = 0.5;
  for (int i = 0; (hi - lo) / tick > 10 && std::isfinite(tick); ++i) tick *= i % 3 == 2 ? 2.5 : 2.0;
  lo = std::max(0.0, std::floor(lo / tick) * tick), hi = std::ceil(hi / tick) * tick + 1e-9 * tick;
  const double n = std::max<double>(1, static_cast<double>(h.loss.size()) - 1);
  const auto X = [&](double step) { return L + (W - L - R) * step / n; };
  const auto Y = [&](double bpb) { return T + (H - T - Bm) * (1 - (bpb - lo) / (hi - lo)); };
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif' "
    << "font-size='11'>\n<rect width='100%' height='100%' fill='white'/>\n";
  for (int i = 0; i <= 12 && lo + i * tick <= hi; ++i) {
    const double v = lo + i * tick;
    s << "<line x1='" << L << "' x2='" << W - R << "' y1='" << Y(v) << "' y2='" << Y(v)
      << "' stroke='#ddd'/><text x='" << L - 6 << "' y='" << Y(v) + 4 << "' text-anchor='end'>" << v << "</text>\n";
  }
  s << "<text x='" << (W + L) / 2 << "' y='" << H - 8 << "' text-anchor='middle'>step (0–" << h.loss.size()
    << ")</text>\n<text x='14' y='" << (H - Bm) / 2 << "' transform='rotate(-90 14 " << (H - Bm) / 2
    << ")' text-anchor='middle'>bits per byte</text>\n<polyline fill='none' stroke='#3b6fd6' stroke-width='1.2' points='";
  const size_t stride = std::max<size_t>(1, h.loss.size() / 1000);
  for (size_t i = 0; i < h.loss.size(); i += stride) s << X(double(i)) << "," << Y(bpb(h.loss[i])) << " ";
  s << "'/>\n";
  for (const auto& [step, v] : h.val_bpb)
    s << "<circle cx='" << X(double(step)) << "' cy='" << Y(v) << "' r='3' fill='#d65f3b'/>\n";
  s << "<text x='" << W - R << "' y='" << T << "' text-anchor='end' fill='#3b6fd6'>training</text>"
    << "<text x='" << W - R << "' y='" << T + 14 << "' text-anchor='end' fill='#d65f3b'>validation</text>\n</svg>\n";
  return s.str();
}

// Writes the checkpoint of `step` into `out`: each file staged aside, then all swapped in at once
// (config.json last). A new run's first checkpoint (`replace`) also removes what the directory
// held before and copies the vocabulary files. Refuses non-finite weights or moments: a diverged
// run never overwrites a good checkpoint.
void save_checkpoint(const fs::path& out, Gpt2& model, AdamW& adam, const TrainOptions& o, int64_t step,
                     const History& h, const std::string& data, bool replace, int64_t saved_step) {
  const auto params = model.parameters();
  std::vector<std::pair<std::string, ConstTensorView>> weights, state;
  for (size_t i = 0; i < params.size(); ++i) {
    for (const Tensor* t : {params[i].second, &adam.first_moments()[i], &adam.second_moments()[i]})
      if (!all_finite(*t))
        fail("train", message("step ", step), message("finite weights and AdamW moments to save (", params[i].first, ")"),
             "a value that is not finite: " + divergence(out, saved_step));
    weights.emplace_back(params[i].first, params[i].second->view());
    state.emplace_back("param." + params[i].first, params[i].second->view());
    state.emplace_back("adam_m." + params[i].first, adam.first_moments()[i].view());
    state.emplace_back("adam_v." + params[i].first, adam.second_moments()[i].view());
  }
  nlohmann::json history = {{"loss", h.loss}, {"val_bpb", h.val_bpb}};
  const std::map<std::string, std::string> meta = {{"format", "mhsa-train-1"},
                                                   {"step", std::to_string(step)},
                                                   {"adam_steps", std::to_string(adam.steps())},
                                                   {"options", options_json(o).dump()},
                                                   {"history", history.dump()},
                                                   {"data", data}};
  std::vector<std::pair<fs::path, std::string>> staged;
  const auto stage = [&](const std::string& name) { return staged.emplace_back(detail::staged_name(out, name), name).first; };
  save_safetensors(stage("train_state.safetensors").string(), state, meta);  // the resume point: one file
  save_safetensors(stage("model.safetensors").string(), weights, {{"format", "pt"}});
  write_file(stage("loss_curve.svg"), loss_curve_svg(h));
  if (replace && !o.tokenizer.empty())  // the vocabulary files, so that the directory runs as it is
    for (const std::string& name : kVocabularyFiles)
      if (const fs::path from = fs::path(o.tokenizer) / name; fs::exists(from))
        fs::copy_file(from, stage(name), fs::copy_options::overwrite_existing);
  write_file(stage("config.json"), config_json(model.config()));
  detail::swap_in(out, replace ? kCheckpointFiles : std::vector<std::string>{}, staged, "train");
}

}  // namespace

// ---- AdamW, clipping, schedule ---------------------------------------------------------------

namespace {

// A finite number in [lo, hi] (an open end where the flag says so).
void check_range(std::string_view fn, std::string_view arg, double x, double lo, double hi, bool open_lo = false,
                 bool open_hi = false) {
  const bool ok = std::isfinite(x) && (open_lo ? x > lo : x >= lo) && (open_hi ? x < hi : x <= hi);
  if (ok) return;
  const std::string range = std::isinf(hi) ? message(open_lo ? "> " : ">= ", lo)
                                           : message("in ", open_lo ? "(" : "[", lo, ", ", hi, open_hi ? ")" : "]");
  fail(fn, arg, "a finite number " + range, message(x));
}

void check_adamw(std::string_view fn, const AdamWOptions& o) {
  constexpr double inf = HUGE_VAL;
  check_range(fn, "beta1", o.beta1, 0, 1, false, true);
  check_range(fn, "beta2", o.beta2, 0, 1, false, true);
  check_range(fn, "eps", o.eps, 0, inf, true);
  check_range(fn, "weight_decay", o.weight_decay, 0, inf);
}

}  // namespace

AdamW::AdamW(const std::vector<std::pair<std::string, Tensor*>>& params, AdamWOptions options) : options_(options) {
  check_adamw("AdamW", options);
  for (const auto& [name, t] : params) {
    m_.emplace_back(t->shape());
    v_.emplace_back(t->shape());
  }
}

void AdamW::step(const std::vector<std::pair<std::string, Tensor*>>& params, const std::vector<Tensor>& grads,
                 float lr) {
  if (params.size() != m_.size() || grads.size() != m_.size())
    fail("AdamW::step", "grads", message(m_.size(), " tensors"), std::to_string(grads.size()));
  for (size_t i = 0; i < params.size(); ++i)
    if (grads[i].shape() != params[i].second->shape() || m_[i].shape() != params[i].second->shape())
      fail("AdamW::step", message("grads[", i, "]"), "the shape of " + params[i].first, "another shape");
  ++steps_;
  const double c1 = 1.0 - std::pow(double(options_.beta1), double(steps_));
  const double c2 = 1.0 - std::pow(double(options_.beta2), double(steps_));
  const kernels::KernelTable& k = kernels::kernels();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor& p = *params[i].second;
    const float decay = p.shape().size() >= 2 ? lr * options_.weight_decay : 0.0f;  // matrices only
    k.adamw(p.numel(), p.data(), grads[i].data(), m_[i].data(), v_[i].data(), lr, decay, options_.beta1,
            options_.beta2, static_cast<float>(1.0 / c1), static_cast<float>(1.0 / c2), options_.eps);
  }
}

// The squares are summed in float64 over fixed chunks of each tensor, in parallel, and the chunks'
// sums in order: the same norm for any thread count.
double clip_gradients(std::vector<Tensor>& grads, double max_norm) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  double sum = 0;
  for (const Tensor& g : grads) {
    const int64_t n = g.numel(), chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part(static_cast<size_t>(chunks));
    const float* x = g.data();
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0;
      for (int64_t i = c * kChunk, end = std::min(n, i + kChunk); i < end; ++i) s += double(x[i]) * x[i];
      part[static_cast<size_t>(c)] = s;
    }
    for (double s : part) sum += s;
  }
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / norm);
    for (Tensor& g : grads) {
      float* x = g.data();
      const int64_t n = g.numel();
#pragma omp parallel for schedule(static) if (n >= kChunk)
      for (int64_t i = 0; i < n; ++i) x[i] *= scale;
    }
  }
  return norm;
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
      {"warmup", warmup}, {"eval_every", eval_every}, {"checkpoint_every", checkpoint_every}};
  for (const auto& [name, n] : counts)
    if (n < 0) fail(fn, name, "a count >= 0 (0: none)", std::to_string(n));
  check_range(fn, "lr", lr, 0, inf, true);
  check_range(fn, "min_lr_ratio", min_lr_ratio, 0, 1);
  check_range(fn, "clip", clip, 0, inf);
  check_range(fn, "val_fraction", val_fraction, 0, 0.5, true, true);
  check_adamw(fn, adamw);
}

float learning_rate(const TrainOptions& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<float>(step + 1) / static_cast<float>(o.warmup);
  const double span = std::max<int64_t>(1, o.steps - o.warmup);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine));
}

// ---- data ------------------------------------------------------------------------------------

TextCorpus TextCorpus::load(const fs::path& file, double val_fraction, int64_t context, const Tokenizer& tokenizer) {
  constexpr std::string_view fn = "TextCorpus::load";
  const std::string bytes = detail::read_file(file, fn, "data");
  if (!(val_fraction > 0 && val_fraction < 0.5))
    fail(fn, "val_fraction", "a fraction in (0, 0.5)", std::to_string(val_fraction));
  const int64_t n = static_cast<int64_t>(bytes.size());
  const int64_t n_val = static_cast<int64_t>(std::llround(double(n) * val_fraction));
  TextCorpus c;
  c.train = tokenizer.encode(std::string_view(bytes).substr(0, static_cast<size_t>(n - n_val)));
  c.val = tokenizer.encode(std::string_view(bytes).substr(static_cast<size_t>(n - n_val)));
  c.train_bytes = n - n_val;
  c.val_bytes = n_val;
  c.fingerprint = text_fingerprint(bytes);
  const auto train_tokens = static_cast<int64_t>(c.train.size()), val_tokens = static_cast<int64_t>(c.val.size());
  if (train_tokens < 2 * (context + 1) || val_tokens < context + 1)
    fail(fn, "data",
         message("at least ", 2 * (context + 1), " training and ", context + 1, " validation tokens for a context of ",
                 context, " (validation fraction ", val_fraction, ")"),
         message(train_tokens, " and ", val_tokens, " tokens from the ", n, " bytes of '", file.string(), "'"));
  return c;
}

namespace {

// Mean loss in bits per byte of the windows tokens[s .. s + T] (T inputs, each predicting the
// next) for every start s, in batches.
double windows_bits_per_byte(const Gpt2& model, const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts,
                             int64_t T) {
  constexpr size_t kBatch = 8;
  double total = 0;
  for (size_t w0 = 0; w0 < starts.size(); w0 += kBatch) {
    const int64_t B = static_cast<int64_t>(std::min(kBatch, starts.size() - w0));
    std::vector<int32_t> ids, targets;
    for (int64_t b = 0; b < B; ++b) {
      const auto first = tokens.begin() + starts[w0 + static_cast<size_t>(b)];
      ids.insert(ids.end(), first, first + T);
      targets.insert(targets.end(), first + 1, first + T + 1);
    }
    total += model.loss(ids, targets, B, T) * double(B);
  }
  return total / double(starts.size()) / std::log(2.0);
}

}  // namespace

double evaluate_bits_per_byte(const Gpt2& model, const std::vector<int32_t>& tokens, int64_t context, int64_t bytes) {
  const int64_t T = std::min(context, model.config().n_positions);
  const int64_t windows = (static_cast<int64_t>(tokens.size()) - 1) / T;
  if (windows <= 0)
    fail("evaluate_bits_per_byte", "tokens", message("more than ", T, " tokens"), std::to_string(tokens.size()));
  std::vector<int64_t> starts;
  for (int64_t w = 0; w < windows; ++w) starts.push_back(w * T);
  const double tokens_per_byte = bytes > 0 ? double(tokens.size()) / double(bytes) : 1.0;
  return windows_bits_per_byte(model, tokens, starts, T) * tokens_per_byte;
}

// ---- the loop --------------------------------------------------------------------------------

double train_gpt(const fs::path& data, const fs::path& out, const TrainOptions& requested, const TrainStart& how,
                 const std::function<bool(const TrainProgress&)>& on_step) {
  constexpr std::string_view fn = "train";
  TrainOptions o = requested;
  if (how.resume && o.steps == 0) o.steps = 1;  // 0: the checkpoint's length (checked below)
  o.validate();
  const fs::path state_file = out / "train_state.safetensors";
  if (how.resume && !fs::exists(state_file))
    fail(fn, "--resume", "a checkpoint in " + out.string(), "no train_state.safetensors");
  std::error_code ec;
  if (!how.resume && !how.force)
    for (const char* name : {"train_state.safetensors", "model.safetensors", "config.json"})
      if (fs::exists(out / name, ec))
        fail(fn, "out", "a directory without a checkpoint (--resume continues it, --force replaces it)",
             message("'", out.string(), "' holding ", name));
  detail::check_writable(out, fn, "out");  // before the first step, not at the first checkpoint
  const detail::WriterClaim claim(out, fn, "out");
  detail::remove_temporaries(out, kCheckpointFiles);  // a killed run's: we hold the directory
  int64_t start = 0;
  History history;
  std::string recorded_data;  // the checkpoint's text fingerprint ("" before fingerprints were kept)
  Gpt2Config config;
  std::optional<Gpt2> model;
  std::optional<AdamW> adam;
  std::optional<Tokenizer> tokenizer;
  if (how.resume) {
    const SafeTensors st = SafeTensors::open(state_file.string());
    const auto meta = [&](const char* key) {
      const auto it = st.metadata().find(key);
      if (it == st.metadata().end()) fail(fn, state_file.string(), message("metadata '", key, "'"), "none");
      return it->second;
    };
    const auto count = [&](const char* key) {
      const std::string text = meta(key);
      if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
        fail(fn, message(state_file.string(), ": metadata '", key, "'"), "a count", "'" + text + "'");
      return std::stoll(text);
    };
    try {
      o = options_from_json(detail::parse_json(meta("options"), fn, state_file.string() + ": options"));
      const nlohmann::json h = detail::parse_json(meta("history"), fn, state_file.string() + ": history");
      history.loss = h.at("loss").get<std::vector<double>>();
      history.val_bpb = h.at("val_bpb").get<std::vector<std::pair<int64_t, double>>>();
    } catch (const nlohmann::json::exception& e) {
      fail(fn, state_file.string(), "the trainer's JSON metadata", e.what());
    }
    start = count("step");
    if (history.loss.size() != static_cast<size_t>(start))
      fail(fn, state_file.string(), message("a loss history of ", start, " steps (its step)"),
           message(history.loss.size(), " losses"));
    if (requested.steps > 0) {  // a resumed run may be given another length (which moves the schedule)
      if (requested.steps < start)
        fail(fn, "steps", message("at least ", start, " (the checkpoint's step)"), std::to_string(requested.steps));
      o.steps = requested.steps;
    }
    try {
      o.validate();
    } catch (const Error& e) {
      fail(fn, state_file.string(), "valid training options", e.what());
    }
    if (const auto it = st.metadata().find("data"); it != st.metadata().end()) recorded_data = it->second;
    // The checkpoint's copy of the vocabulary files (the original may have moved).
    tokenizer.emplace(o.tokenizer.empty() ? Tokenizer::bytes() : Tokenizer::load_dir(out));
    config = model_config(o, *tokenizer);
    if (fs::exists(out / "config.json")) {  // absent only after a crash mid-way through a new run's first swap
      const Gpt2Config c = Gpt2Config::load(out / "config.json");
      if (c.vocab_size != config.vocab_size || c.n_positions != config.n_positions || c.n_embd != config.n_embd ||
          c.n_layer != config.n_layer || c.n_head != config.n_head || c.mlp_dim() != config.mlp_dim())
        fail(fn, (out / "config.json").string(),
             message("the shape of train_state.safetensors (vocab_size ", config.vocab_size, ", n_positions ",
                     config.n_positions, ", n_embd ", config.n_embd, ", n_layer ", config.n_layer, ", n_head ",
                     config.n_head, ", MLP width ", config.mlp_dim(), ")"),
             message("vocab_size ", c.vocab_size, ", n_positions ", c.n_positions, ", n_embd ", c.n_embd, ", n_layer ",
                     c.n_layer, ", n_head ", c.n_head, ", MLP width ", c.mlp_dim()));
    }
    model = Gpt2::random(config, 0);
    adam.emplace(model->parameters(), o.adamw);
    const auto params = model->parameters();
    const auto load = [&](const std::string& name, const std::vector<int64_t>& shape) {
      const SafeTensorInfo* info = st.find(name);
      if (info == nullptr) fail(fn, state_file.string(), message("a tensor '", name, "'"), "none");
      if (info->shape != shape)
        fail(fn, message(state_file.string(), ": tensor '", name, "'"), "shape " + shape_text(shape) + " (the model's)",
             shape_text(info->shape));
      return st.load(name);
    };
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<int64_t>& shape = params[i].second->shape();
      *params[i].second = load("param." + params[i].first, shape);
      adam->first_moments()[i] = load("adam_m." + params[i].first, shape);
      adam->second_moments()[i] = load("adam_v." + params[i].first, shape);
    }
    adam->set_steps(count("adam_steps"));
  } else {
    tokenizer.emplace(o.tokenizer.empty() ? Tokenizer::bytes() : Tokenizer::load_dir(o.tokenizer));
    config = model_config(o, *tokenizer);
    model = Gpt2::random(config, mix(o.seed));
    adam.emplace(model->parameters(), o.adamw);
  }
  const TextCorpus corpus = TextCorpus::load(data, o.val_fraction, o.context, *tokenizer);
  if (!recorded_data.empty() && corpus.fingerprint != recorded_data && !how.allow_data_change)
    fail(fn, "data",
         message("the text the checkpoint was trained on (", recorded_data,
                 "; --allow-data-change resumes on other text)"),
         message("'", data.string(), "' (", corpus.fingerprint, ")"));
  history.bytes_per_token = double(corpus.train_bytes) / double(corpus.train.size());
  const double val_tokens_per_byte = double(corpus.val.size()) / double(corpus.val_bytes);
  const int64_t T = o.context, B = o.batch;
  // A step's ids, B·T·accumulate of them, and the validation windows, eval_batches·B: no wrap-around.
  detail::checked_count(message(fn, ": batch [batch, context, accumulate]"), {B, T, o.accumulate}, sizeof(int32_t));
  detail::checked_count(message(fn, ": eval_batches [eval_batches, batch]"), {o.eval_batches, B}, 1);
  const int64_t positions = static_cast<int64_t>(corpus.train.size()) - T - 1;
  double last_val = history.val_bpb.empty() ? -1 : history.val_bpb.back().second;
  int64_t saved_step = how.resume ? start : 0;  // the checkpoint in `out` this run would fall back on

  // Validation during training: eval_batches·B windows spread evenly over the held-out text.
  const auto quick_val = [&] {
    const int64_t windows = (static_cast<int64_t>(corpus.val.size()) - 1) / T;
    const int64_t use = std::min(windows, o.eval_batches * B);
    std::vector<int64_t> starts;
    for (int64_t i = 0; i < use; ++i) starts.push_back(i * windows / use * T);
    return windows_bits_per_byte(*model, corpus.val, starts, T) * val_tokens_per_byte;
  };

  using clock = std::chrono::steady_clock;
  for (int64_t step = start; step < o.steps; ++step) {
    const auto t0 = clock::now();
    std::vector<Tensor> grads = model->zero_gradients();
    double loss = 0;
    for (int64_t a = 0; a < o.accumulate; ++a) {
      std::vector<int32_t> ids(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
      for (int64_t b = 0; b < B; ++b) {
        const uint64_t h = mix(mix(mix(o.seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(a * B + b));
        const int64_t at = static_cast<int64_t>(h % static_cast<uint64_t>(positions + 1));
        for (int64_t t = 0; t < T; ++t) {
          ids[static_cast<size_t>(b * T + t)] = corpus.train[static_cast<size_t>(at + t)];
          targets[static_cast<size_t>(b * T + t)] = corpus.train[static_cast<size_t>(at + t + 1)];
        }
      }
      loss += model->loss_and_gradients(ids, targets, B, T, grads);
    }
    if (o.accumulate > 1) {
      loss /= static_cast<double>(o.accumulate);
      for (Tensor& g : grads)
        for (int64_t i = 0; i < g.numel(); ++i) g.data()[i] /= static_cast<float>(o.accumulate);
    }
    TrainProgress p;
    p.step = step + 1;
    p.steps = o.steps;
    p.loss = loss;
    p.loss_bits_per_byte = loss / std::log(2.0) / history.bytes_per_token;
    p.grad_norm = clip_gradients(grads, o.clip);
    if (!std::isfinite(loss) || !std::isfinite(p.grad_norm))
      fail(fn, message("step ", step + 1), "a finite loss and gradient norm",
           message("loss ", loss, ", gradient norm ", p.grad_norm, ": ", divergence(out, saved_step)));
    // A loss ten times that of guessing uniformly (ln V nats) is no training run any more: one that
    // diverged can stay finite for many steps (1e15 bits per byte) and would save its garbage.
    const double uniform = std::log(static_cast<double>(model->config().vocab_size));
    if (loss > 10.0 * uniform)
      fail(fn, message("step ", step + 1), message("a loss below 10x that of a uniform guess (", 10.0 * uniform, " nats)"),
           message("loss ", loss, ": ", divergence(out, saved_step)));
    p.lr = learning_rate(o, step);
    adam->step(model->parameters(), grads, static_cast<float>(p.lr));
    history.loss.push_back(loss);
    p.tokens_per_s = double(B * T * o.accumulate) / std::chrono::duration<double>(clock::now() - t0).count();
    const bool last = step + 1 == o.steps;
    const bool evaluate = (o.eval_every > 0 && (step + 1) % o.eval_every == 0) || last;
    if (evaluate) {
      last_val = quick_val();
      history.val_bpb.emplace_back(step + 1, last_val);
      p.val_bits_per_byte = last_val;
    }
    const bool go_on = !on_step || on_step(p);
    if (!go_on || last || (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0)) {
      // Finite weights can still be a diverged model (lr 1e30 gives weights near 1e30): what is
      // saved must give a finite loss (this step's validation, or one held-out window).
      const double check = evaluate ? last_val : windows_bits_per_byte(*model, corpus.val, {0}, T);
      if (!std::isfinite(check))
        fail(fn, message("step ", step + 1), "weights that give a finite loss, to save",
             message("a held-out loss of ", check, ": ", divergence(out, saved_step)));
      // A new run's first checkpoint replaces whatever the directory held (--force).
      save_checkpoint(out, *model, *adam, o, step + 1, history, corpus.fingerprint, !how.resume && saved_step == 0,
                      saved_step);
      saved_step = step + 1;
    }
    if (!go_on) break;
  }
  return last_val;
}

}  // namespace mhsa
