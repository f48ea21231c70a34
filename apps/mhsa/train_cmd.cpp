// apps/mhsa/train_cmd.cpp — `mhsa train`: trains a GPT-2 or Llama-family model (bytes or GPT-2 BPE)
// on a text file with a progress bar (step, loss, validation bits per byte, tokens/s, ETA),
// checkpoints into --out (with train_log.jsonl), and stops cleanly on Ctrl-C (the checkpoint of
// the last finished step is written first). The library checks the options, the directory and
// the run (mhsa/train.h); this file adds the flags that say what to do with what --out holds
// (--resume, --force, --allow-data-change), and with --model M --lora-rank R fine-tunes M with a LoRA
// adapter (--merge-to writes M with it merged). Under `mpirun -np N` rank 0 prints; a rank that fails
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
#include "mhsa/lora.h"
#include "mhsa/models.h"
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
  std::string lora_targets = "q,k,v,o,gate,up,down";
  std::string merge_to;  // a LoRA run: write the model with the adapter merged here at the end
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

// What the run's schedule will do that its options may not have meant, said once it has started
// (a resumed run's options are its checkpoint's): a run that ends inside its warm-up, and a resumed
// run whose --steps differs from the schedule it keeps.
void announce(const TrainOptions& o) {
  if (o.steps < o.warmup)
    std::fprintf(stderr,
                 "mhsa: warning: --steps %lld ends within the --warmup of %lld steps: the learning rate rises only "
                 "to %.2e, not the --lr %.2e given\n",
                 static_cast<long long>(o.steps), static_cast<long long>(o.warmup), learning_rate(o, o.steps - 1), o.lr);
  if (o.schedule_steps > 0 && o.schedule_steps != o.steps) {
    char after[96] = "the run ends before the cosine does";
    if (o.steps > o.schedule_steps)
      std::snprintf(after, sizeof after, "the steps after it train at %.2e", learning_rate(o, o.schedule_steps));
    std::fprintf(stderr,
                 "mhsa: note: --steps %lld keeps the checkpoint's learning-rate schedule of %lld steps (%s; a new "
                 "run lays a new one)\n",
                 static_cast<long long>(o.steps), static_cast<long long>(o.schedule_steps), after);
  }
  std::fflush(stderr);
}

void run(const TrainArgs& a, bool steps_given) {
  use_threads(a.threads);
  detail::Ranks& ranks = detail::Ranks::world();
  TrainOptions options = a.options;
  options.tied_head = !a.untied_head;
  options.lora.targets = split_lora_targets(a.lora_targets);
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
  bool adapter = false;  // a LoRA run: its checkpoint is peft's adapter directory
  std::string base_model;  // its frozen model
  const auto progress = [&](const TrainProgress& p) {
    if (first_step < 0) announce(*p.options);
    adapter = !p.options->model.empty();
    base_model = p.options->model;
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
  std::printf("%s at step %lld: %s; checkpoint in %s (%s, train_state.safetensors, loss_curve.svg; "
              "train_log.jsonl)\n",
              last.step == last.steps ? "done" : interrupted ? "interrupted" : "stopped",
              static_cast<long long>(last.step), val_text, a.out.c_str(),
              adapter ? "adapter_config.json, adapter_model.safetensors" : "config.json, model.safetensors");
  if (!a.merge_to.empty() && last.step == last.steps) {
    if (!adapter) throw Error("--merge-to: expected a LoRA run (--model, --lora-rank), got a model trained from scratch");
    save_merged(resolve_model(base_model, "--model").path, a.out, a.merge_to);
    std::printf("merged model in %s (config.json, model.safetensors)\n", a.merge_to.c_str());
  }
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
  cmd->add_option("--model", o.model,
                  "fine-tune this pretrained model (a directory, GGUF file or name; frozen) with a LoRA adapter "
                  "(--lora-rank); the text is read with its tokenizer")
      ->excludes("--tokenizer");
  cmd->add_option("--lora-rank", o.lora.rank, "with --model: the adapter's rank r")
      ->check(integer_at_least(1))
      ->needs("--model");
  cmd->add_option("--lora-alpha", o.lora.alpha, "with --model: the adapter's alpha (scale alpha / r; default 2·r)")
      ->check(number_above(0))
      ->needs("--model");
  cmd->add_option("--lora-targets", a->lora_targets,
                  "with --model: the layers of every block that get an adapter, of q,k,v,o,gate,up,down")
      ->default_val(a->lora_targets)
      ->needs("--model");
  cmd->add_option("--merge-to", a->merge_to,
                  "a LoRA run: when it is done, write the model with the adapter merged into its weights into this "
                  "directory (float32 safetensors; the model must be a Hugging Face directory)");
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
                  "AdamW state (the same checkpoints); with --model, the frozen weights' type (the adapter is f32); "
                  "default f32, or with --resume the checkpoint's")
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
