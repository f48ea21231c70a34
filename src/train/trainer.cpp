// train/trainer.cpp — the training loop (see mhsa/train.h): a run's start (new or resumed), the
// batches, each step's gradients → clipping → AdamW, validation, progress, the divergence stops
// and when to checkpoint. The model is reached only through train/trainable.h, the optimiser is
// train/optimizer.cpp, the files train/checkpoint.cpp. Every random choice (initial weights,
// which windows form a batch) is a function of the seed and the step, so a resumed run repeats an
// uninterrupted one bit for bit.
//
// A step is three phases with nothing shared between them but the gradients: step_gradients
// (forward and backward over the step's rows, reduced across the ranks of a data-parallel run:
// train/gradient_tree.h), clip_gradients (the global norm), the optimiser update (with dtype bf16
// followed by the rounding of the weights' bfloat16 copy that the next forward and backward read:
// float32 masters, bf16 matmuls; train/trainable.h). Under
// `mpirun -np N` every rank computes its share of each step's rows, holds the whole model and
// updates its shard of it with its shard of AdamW's state (ZeRO-1: train/sharded_adamw.h); rank 0
// alone validates, reports progress, logs and writes checkpoints (the optimiser's shards gathered),
// and its on_step answer (go on or stop) is every rank's.
#include "mhsa/train.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>

#include "core/check.h"
#include "io/checkpoint_dir.h"
#include "io/file.h"
#include "train/checkpoint.h"
#include "train/distributed.h"
#include "train/gradient_tree.h"
#include "train/options.h"
#include "train/sharded_adamw.h"
#include "train/trainable.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::message;
using detail::Ranks;
namespace fs = std::filesystem;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: a well-spread hash of (seed, step, row)
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Mean loss in bits per byte of the windows tokens[s .. s + T] (T inputs, each predicting the
// next) for every start s, in batches. Model: anything with Gpt2's loss(ids, targets, B, T).
template <class Model>
double windows_bits_per_byte(const Model& model, const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts,
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

// The step's mean loss over its batch × accumulate rows; grads receives this rank's slice of their
// mean gradient. Row r reads the window at a position drawn from (seed, step, r), and its gradient
// is computed alone (train/gradient_tree.h sums the rows in a fixed order, reduced across ranks in
// buckets of bucket_bytes overlapped with the backward): this rank computes only its own rows, and
// one process or N ranks give the same bits.
double step_gradients(Ranks& ranks, const detail::TrainableModel& model, const std::vector<int32_t>& train,
                      const TrainOptions& o, int64_t step, std::span<const int64_t> slice, int64_t bucket_bytes,
                      std::vector<Tensor>& grads) {
  const int64_t T = o.context;
  const int64_t positions = static_cast<int64_t>(train.size()) - T - 1;
  std::vector<int32_t> ids(static_cast<size_t>(T)), targets(static_cast<size_t>(T));
  const auto row_gradient = [&](int64_t r, std::vector<Tensor>& g, const std::function<void(size_t)>& on_final) {
    const uint64_t h = mix(mix(mix(o.seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(r));
    const int64_t at = static_cast<int64_t>(h % static_cast<uint64_t>(positions + 1));
    for (int64_t t = 0; t < T; ++t) {
      ids[static_cast<size_t>(t)] = train[static_cast<size_t>(at + t)];
      targets[static_cast<size_t>(t)] = train[static_cast<size_t>(at + t + 1)];
    }
    return model.loss_and_gradients(ids, targets, 1, T, g, on_final);
  };
  return detail::tree_gradients(ranks, o.batch * o.accumulate, row_gradient, slice,
                                bucket_bytes / static_cast<int64_t>(sizeof(float)), grads);
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

double train_gpt(const fs::path& data, const fs::path& out, const TrainOptions& requested, const TrainStart& how,
                 const std::function<bool(const TrainProgress&)>& on_step) {
  constexpr std::string_view fn = "train";
  TrainOptions o = requested;
  if (how.resume && o.steps == 0) o.steps = 1;  // 0: the checkpoint's length (checked below)
  if (o.dtype.empty()) o.dtype = "f32";          // or, resuming, the checkpoint's (below)
  if (how.bucket_bytes < 0) fail(fn, "bucket_bytes", "a count >= 0", std::to_string(how.bucket_bytes));
  o.validate();
  const fs::path state_file = out / "train_state.safetensors";
  if (how.resume && !fs::exists(state_file))
    fail(fn, "--resume", "a checkpoint in " + out.string(), "no train_state.safetensors");
  Ranks& ranks = Ranks::world();
  const bool lead = ranks.rank() == 0;  // the rank that owns `out`
  std::error_code ec;
  if (!how.resume && !how.force)
    for (const char* name : {"train_state.safetensors", "model.safetensors", "config.json", "adapter_model.safetensors",
                             "adapter_config.json"})
      if (fs::exists(out / name, ec))
        fail(fn, "out", "a directory without a checkpoint (--resume continues it, --force replaces it)",
             message("'", out.string(), "' holding ", name));
  std::optional<detail::WriterClaim> claim;
  if (lead) {
    detail::check_writable(out, fn, "out");  // before the first step, not at the first checkpoint
    claim.emplace(out, fn, "out");
    std::vector<std::string> temporaries = detail::checkpoint_files();
    temporaries.push_back("train_log.jsonl");
    detail::remove_temporaries(out, temporaries);  // a killed run's: we hold the directory
    // A checkpoint renames its files into place: a device or FIFO under one of their names is
    // refused now, not after the steps before the first checkpoint (swap_in checks again).
    for (const std::string& name : temporaries) detail::check_replaceable(out / name, fn, "out");
  }

  // The run's start: a new model, or the checkpoint's model, optimiser state and history.
  int64_t start = 0;
  detail::History history;
  std::string recorded_data;  // the checkpoint's text fingerprint ("" before fingerprints were kept)
  std::unique_ptr<detail::TrainableModel> model;
  std::optional<detail::ShardedAdamW> adam;  // this rank's shard of AdamW's state (ZeRO-1)
  std::optional<Tokenizer> tokenizer;
  if (how.resume) {
    const detail::ResumePoint checkpoint(state_file, fn);
    o = checkpoint.options;
    start = checkpoint.step;
    history = checkpoint.history;
    recorded_data = checkpoint.data;
    if (requested.steps > 0) {  // another length ends the run elsewhere; the schedule stays the checkpoint's
      if (requested.steps < start)
        fail(fn, "steps", message("at least ", start, " (the checkpoint's step)"), std::to_string(requested.steps));
      const int64_t schedule = o.schedule_length();
      o.steps = requested.steps;
      o.schedule_steps = schedule == o.steps ? 0 : schedule;
    }
    if (!requested.dtype.empty()) o.dtype = requested.dtype;  // the same checkpoints in either precision
    try {
      o.validate();
    } catch (const Error& e) {
      fail(fn, state_file.string(), "valid training options", e.what());
    }
    // The checkpoint's copy of the vocabulary files (the original may have moved).
    tokenizer.emplace(detail::run_tokenizer(o, out));
    model = detail::new_trainable_model(o, *tokenizer, 0);
    if (fs::exists(out / model->config_file()))  // absent only after a crash mid-way through a new run's first swap
      model->check_config(out / model->config_file(), fn);
    AdamW whole(model->parameters(), o.adamw);
    checkpoint.restore(*model, whole);
    model->refresh_weights();
    adam.emplace(model->parameters(), o.adamw, ranks);
    adam->load(whole);
  } else {
    tokenizer.emplace(detail::run_tokenizer(o, o.tokenizer));
    model = detail::new_trainable_model(o, *tokenizer, mix(o.seed));
    adam.emplace(model->parameters(), o.adamw, ranks);
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
  double last_val = history.val_bpb.empty() ? -1 : history.val_bpb.back().second;
  int64_t saved_step = how.resume ? start : 0;  // the checkpoint in `out` this run would fall back on
  // Every rank must be running the same run: the same options, step and text as rank 0 (on hosts
  // that do not share --out or --data, a stale checkpoint or another text would differ).
  const std::string run = message("step ", start, " of ", detail::options_json(o).dump(), " on ", corpus.fingerprint);
  if (const std::string lead_run = ranks.broadcast(run); lead_run != run)
    fail(fn, message("rank ", ranks.rank(), " of ", ranks.size()), "the run rank 0 starts (" + lead_run + ")", run);
  std::optional<detail::TrainLog> log;
  if (lead) log.emplace(out, how.resume, start, o.dtype, fn);
  // A loss ten times that of guessing uniformly (ln V nats) is no training run any more: one that
  // diverged can stay finite for many steps (1e15 bits per byte) and would save its garbage.
  const double uniform = std::log(static_cast<double>(tokenizer->vocab_size()));

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
    const double waited = ranks.wait_seconds();
    const double loss =
        step_gradients(ranks, *model, corpus.train, o, step, adam->bounds(), how.bucket_bytes, grads);
    TrainProgress p;
    if (ranks.size() > 1) p.comm_wait_s = ranks.wait_seconds() - waited;
    p.step = step + 1;
    p.steps = o.steps;
    p.options = &o;
    p.loss = loss;
    p.loss_bits_per_byte = loss / std::log(2.0) / history.bytes_per_token;
    p.grad_norm = adam->clip(grads, o.clip);  // clip_gradients' norm, over every rank's shard
    if (!std::isfinite(loss) || !std::isfinite(p.grad_norm))
      fail(fn, message("step ", step + 1), "a finite loss and gradient norm",
           message("loss ", loss, ", gradient norm ", p.grad_norm, ": ", detail::divergence(out, saved_step)));
    if (loss > 10.0 * uniform)
      fail(fn, message("step ", step + 1), message("a loss below 10x that of a uniform guess (", 10.0 * uniform, " nats)"),
           message("loss ", loss, ": ", detail::divergence(out, saved_step)));
    p.lr = learning_rate(o, step);
    adam->step(model->parameters(), grads, static_cast<float>(p.lr));
    model->refresh_weights();
    history.loss.push_back(loss);
    p.tokens_per_s = double(B * T * o.accumulate) / std::chrono::duration<double>(clock::now() - t0).count();
    const bool last = step + 1 == o.steps;
    const bool evaluate = (o.eval_every > 0 && (step + 1) % o.eval_every == 0) || last;
    if (evaluate && lead) {
      last_val = quick_val();
      history.val_bpb.emplace_back(step + 1, last_val);
      p.val_bits_per_byte = last_val;
    }
    bool go_on = true;
    if (lead) {
      log->write(p);
      go_on = !on_step || on_step(p);
    }
    go_on = ranks.broadcast(go_on);
    const bool save = !go_on || last || (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0);
    std::optional<AdamW> whole;  // rank 0: the optimiser's shards gathered into one state to save
    if (save) {
      if (lead) whole.emplace(model->parameters(), o.adamw);
      adam->gather(lead ? &*whole : nullptr);
    }
    if (save && lead) {
      // Finite weights can still be a diverged model (lr 1e30 gives weights near 1e30): what is
      // saved must give a finite loss (this step's validation, or one held-out window).
      const double check = evaluate ? last_val : windows_bits_per_byte(*model, corpus.val, {0}, T);
      if (!std::isfinite(check))
        fail(fn, message("step ", step + 1), "weights that give a finite loss, to save",
             message("a held-out loss of ", check, ": ", detail::divergence(out, saved_step)));
      // A new run's first checkpoint replaces whatever the directory held (--force).
      detail::save_checkpoint(out, *model, *whole, o, step + 1, history, corpus.fingerprint,
                              !how.resume && saved_step == 0, saved_step);
      saved_step = step + 1;
    }
    if (!go_on) break;
  }
  return last_val;
}

}  // namespace mhsa
