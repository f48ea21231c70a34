// apps/mhsa/train_cmd.cpp — `mhsa train`: trains a GPT-2 or Llama-family model (bytes or GPT-2 BPE)
// on a text file with a progress bar (step, loss, validation bits per byte, tokens/s, ETA),
// checkpoints into --out (with train_log.jsonl), and stops cleanly on Ctrl-C (the checkpoint of
// the last finished step is written first). The library checks the options, the directory and
// the run (mhsa/train.h); this file adds the flags that say what to do with what --out holds
// (--resume, --force, --allow-data-change). Under `mpirun -np N` rank 0 prints; a rank that fails
// prints its error and ends the whole job (train/distributed.h).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "mhsa/error.h"
#include "mhsa/train.h"
#include "options.h"
#include "train/distributed.h"

namespace mhsa::cli {
namespace {

std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) { interrupted = true; }

struct TrainArgs {
  std::string data, out;
  TrainOptions options;
  TrainStart start;
  int threads = 0;
  int64_t stop_after = 0;  // end this run (with a checkpoint) after this many steps of it
  double bucket_mb = 4;     // start.bucket_bytes in MiB
  bool untied_head = false;
};

std::string duration(double s) {
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

void run(const TrainArgs& a, bool steps_given) {
  use_threads(a.threads);
  detail::Ranks& ranks = detail::Ranks::world();
  TrainOptions options = a.options;
  options.tied_head = !a.untied_head;
  TrainStart start = a.start;
  start.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
  if (a.start.resume && !steps_given) options.steps = 0;  // the checkpoint's own length
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  const bool tty = isatty(fileno(stderr));
  const auto t0 = std::chrono::steady_clock::now();
  int64_t first_step = -1;
  double last_val = -1;
  TrainProgress last;
  const auto progress = [&](const TrainProgress& p) {
    if (first_step < 0 && !a.start.resume && options.steps < options.warmup)  // once the run has started
      std::fprintf(stderr,
                   "mhsa: warning: --steps %lld ends within the --warmup of %lld steps: the learning rate rises only "
                   "to %.2e, not the --lr %.2e given\n",
                   static_cast<long long>(options.steps), static_cast<long long>(options.warmup),
                   learning_rate(options, options.steps - 1), options.lr);
    if (first_step < 0) first_step = p.step - 1;
    last = p;
    if (p.val_bits_per_byte >= 0) last_val = p.val_bits_per_byte;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double eta = elapsed / double(p.step - first_step) * double(p.steps - p.step);
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * p.step / std::max<int64_t>(1, p.steps));
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    char val_text[32] = "";
    if (last_val >= 0) std::snprintf(val_text, sizeof val_text, " val %.3f bpb", last_val);
    std::fprintf(stderr, "%s[%s] step %lld/%lld  loss %.3f bpb%s  lr %.2e  %.0f tok/s  ETA %s%s",
                 tty ? "\r" : "", bar.c_str(), static_cast<long long>(p.step), static_cast<long long>(p.steps),
                 p.loss_bits_per_byte, val_text, p.lr, p.tokens_per_s, duration(eta).c_str(),
                 tty ? "\033[K" : "\n");
    std::fflush(stderr);
    if (a.stop_after > 0 && p.step - first_step >= a.stop_after) return false;
    return !interrupted.load();
  };
  double val = -1;
  try {
    val = train_gpt(a.data, a.out, options, start, progress);
  } catch (const Error& e) {
    if (tty && first_step >= 0) std::fprintf(stderr, "\n");  // the error (a diverged run) below the progress bar
    if (ranks.size() == 1) throw;
    // The other ranks would wait for this one forever: end the job (the last checkpoint stays).
    std::fprintf(stderr, "mhsa: error: rank %d of %d: %s\n", ranks.rank(), ranks.size(), e.what());
    std::fflush(stderr);
    ranks.abort(2);
  }
  if (ranks.rank() != 0) return;
  std::fprintf(stderr, "\n");
  char val_text[64] = "no validation yet";
  if (val >= 0) std::snprintf(val_text, sizeof val_text, "validation %.4f bits per byte", val);
  std::printf("%s at step %lld: %s; checkpoint in %s (config.json, model.safetensors, train_state.safetensors, "
              "loss_curve.svg; train_log.jsonl)\n",
              last.step == last.steps ? "done" : interrupted ? "interrupted" : "stopped",
              static_cast<long long>(last.step), val_text, a.out.c_str());
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  TrainOptions& o = a->options;
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a GPT-2 or Llama-family model on a text file, byte-level or with GPT-2's BPE (checkpoints "
               "resume bit for bit)");
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later option overrides
  cmd->add_option("--data", a->data, "the training text (its last --val-fraction is held out)")->required();
  cmd->add_option("--out", a->out, "checkpoint directory (a Hugging Face model directory of the --arch)")->required();
  cmd->add_flag("--resume", a->start.resume, "continue from --out's checkpoint (its options; --steps may extend it)");
  cmd->add_flag("--force", a->start.force, "start a new run even where --out holds a checkpoint (it is replaced)")
      ->excludes("--resume");
  cmd->add_flag("--allow-data-change", a->start.allow_data_change,
                "resume on --data other than the text the checkpoint was trained on")
      ->needs("--resume");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "a directory with GPT-2's BPE files (vocab.json + merges.txt); default: bytes, vocabulary 256")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--arch", o.arch, "gpt2, or llama (RoPE, RMSNorm, SwiGLU, grouped-query heads)")
      ->default_val(o.arch)
      ->check(CLI::IsMember({"gpt2", "llama"}));
  cmd->add_option("--layers", o.layers, "transformer blocks")->default_val(o.layers)->check(integer_at_least(1));
  cmd->add_option("--heads", o.heads, "attention heads")->default_val(o.heads)->check(integer_at_least(1));
  cmd->add_option("--embd", o.embd, "model width")->default_val(o.embd)->check(integer_at_least(1));
  cmd->add_option("--context", o.context, "tokens per sequence")->default_val(o.context)->check(integer_in(2, 1 << 16));
  cmd->add_option("--kv-heads", o.kv_heads, "llama: key/value heads, dividing --heads (default: --heads)")
      ->check(integer_at_least(1));
  cmd->add_option("--mlp", o.mlp, "llama: MLP width (default: 8·embd/3 rounded up to a multiple of 8)")
      ->check(integer_at_least(1));
  cmd->add_option("--rope-theta", o.rope_theta, "llama: RoPE base")->default_val(o.rope_theta)->check(number_above(0));
  cmd->add_flag("--untied-head", a->untied_head, "llama: an output matrix of its own (default: the token embedding)");
  cmd->add_option("--dtype", o.dtype,
                  "f32, or bf16: the matmuls read bfloat16 copies of the weights, with float32 master weights and "
                  "AdamW state (the same checkpoints); default f32, or with --resume the checkpoint's")
      ->check(one_of({"f32", "bf16"}));
  cmd->add_option("--steps", o.steps, "optimiser steps")->default_val(o.steps)->check(integer_at_least(1));
  cmd->add_option("--batch", o.batch, "sequences per step (x --accumulate), shared among mpirun's ranks")->default_val(o.batch)->check(integer_at_least(1));
  cmd->add_option("--accumulate", o.accumulate, "micro-batches per step")->default_val(o.accumulate)->check(integer_at_least(1));
  cmd->add_option("--lr", o.lr, "peak learning rate")->default_val(o.lr)->check(number_above(0));
  cmd->add_option("--warmup", o.warmup, "warm-up steps")->default_val(o.warmup)->check(integer_at_least(0));
  cmd->add_option("--weight-decay", o.adamw.weight_decay, "AdamW decoupled weight decay")->default_val(o.adamw.weight_decay);
  cmd->add_option("--clip", o.clip, "gradient-norm clip (0: none)")->default_val(o.clip)->check(number_at_least(0));
  cmd->add_option("-s,--seed", o.seed, "initial weights and batches")->default_val(o.seed)->check(seed_value());
  cmd->add_option("--val-fraction", o.val_fraction, "held-out share of the text")->default_val(o.val_fraction);
  cmd->add_option("--eval-every", o.eval_every, "validate every N steps")->default_val(o.eval_every);
  cmd->add_option("--checkpoint-every", o.checkpoint_every, "checkpoint every N steps")->default_val(o.checkpoint_every);
  cmd->add_option("--stop-after", a->stop_after, "end this run after N steps with a checkpoint (--resume goes on)")
      ->check(integer_at_least(0));
  cmd->add_option("--bucket-mb", a->bucket_mb,
                  "mpirun: gradients reduced in buckets of this many MiB, each as soon as the backward has it "
                  "(0: all after the backward; results are the same)")
      ->default_val(a->bucket_mb)
      ->check(CLI::Range(0.0, 1e6));
  add_threads_option(cmd, a->threads);
  cmd->callback([a, cmd] {
    try {
      run(*a, cmd->count("--steps") > 0);
    } catch (const WriteError&) {
      throw;
    } catch (const Error& e) {  // the library's "data" is the file given as --data
      std::string what = e.what();  // "data: ..." or "<C++ function>: data: ..."
      const size_t at = what.starts_with("data: ") ? 0 : what.find(": data: ");
      if (at == std::string::npos) throw;
      what.insert(at == 0 ? 0 : at + 2, "--");
      throw Error(what);
    }
  });
}

}  // namespace mhsa::cli
