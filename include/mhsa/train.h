// mhsa/train.h — training a GPT-2 or Llama-shaped model from scratch with the library's own
// gradients: AdamW, gradient clipping, a warm-up + cosine learning-rate schedule, text data (bytes
// or GPT-2 BPE), and checkpoints that resume bit for bit.
//
// A checkpoint directory holds config.json and model.safetensors (a Hugging Face GPT-2 or Llama
// directory: `mhsa generate --model DIR` and transformers run it; vocabulary 256 means byte-level
// text, and a BPE model carries its vocabulary files), and
// train_state.safetensors: the weights, AdamW's moments and the trainer's state (step, options,
// loss history, a fingerprint of the text) in one file. A checkpoint's files are written aside
// and swapped in together while readers wait (see src/io/checkpoint_dir.h), so a crash or Ctrl-C
// mid-write leaves the previous checkpoint and a reader loads one checkpoint whole; one training
// run at a time holds the directory (train.lock). Beside the checkpoint, train_log.jsonl records
// every step (loss, learning rate, gradient norm, tokens/s) and validation as one JSON object a
// line. A run that diverges (a loss or gradient that is not finite) stops with an error and never
// saves its weights. Under `mpirun -np N` (a build with MPI) the ranks share every step's batch
// and AdamW's state and give one process's bits (docs/distributed.md). TrainOptions::dtype "bf16"
// trains in mixed precision (float32 masters, bfloat16 matmul weights) into the same checkpoints.
// TrainOptions::model fine-tunes a pretrained model with a LoRA adapter instead (mhsa/lora.h,
// docs/fine-tuning.md). Not a general training framework: two architectures from scratch, LoRA on
// pretrained ones, data parallelism only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "mhsa/gpt2.h"
#include "mhsa/lora.h"
#include "mhsa/tensor.h"
#include "mhsa/tokenizer.h"

namespace mhsa {

struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled; applied to matrices only (not biases or LayerNorms)
  // Throws mhsa::Error "<fn>: <option>: ..." unless betas are in [0, 1), eps > 0, weight decay
  // >= 0, all finite.
  void validate(std::string_view fn) const;
};

// AdamW over a list of parameters (as Gpt2::parameters() gives them).
class AdamW {
 public:
  // Throws mhsa::Error for options out of range (betas in [0, 1), eps > 0, weight decay >= 0, all finite).
  AdamW(const std::vector<std::pair<std::string, Tensor*>>& params, AdamWOptions options = {});
  // One update with learning rate lr from gradients shaped like the parameters, in their order.
  void step(const std::vector<std::pair<std::string, Tensor*>>& params, const std::vector<Tensor>& grads, float lr);
  int64_t steps() const { return steps_; }
  std::vector<Tensor>& first_moments() { return m_; }
  std::vector<Tensor>& second_moments() { return v_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  AdamWOptions options_;
  int64_t steps_ = 0;
  std::vector<Tensor> m_, v_;
};

// Scales the gradients so that their global L2 norm is at most max_norm (when max_norm > 0);
// returns the norm before clipping (summed in float64, in a fixed order).
double clip_gradients(std::vector<Tensor>& grads, double max_norm);

struct TrainOptions {
  // Model shape (a new model; a resumed one keeps its own).
  int64_t layers = 4, heads = 4, embd = 128, context = 128;
  // The architecture: "gpt2" (learned positions, LayerNorm, GELU MLP of 4·embd, tied head) or
  // "llama" (rotary positions, RMSNorm, SwiGLU MLP, grouped-query heads; Hugging Face's
  // LlamaForCausalLM). The options after it are Llama's; GPT-2 keeps their defaults.
  std::string arch = "gpt2";
  int64_t kv_heads = 0;        // key/value heads, dividing heads (0: as many as heads)
  int64_t mlp = 0;             // the MLP's width (0: 8·embd/3 rounded up to a multiple of 8)
  double rope_theta = 10000;   // RoPE's base
  bool tied_head = true;       // the output matrix is the token embedding
  // Optimisation.
  int64_t steps = 1000, batch = 16, accumulate = 1;  // sequences per step = batch × accumulate
  float lr = 1e-3f, min_lr_ratio = 0.1f;             // cosine from lr down to lr × min_lr_ratio
  int64_t warmup = 100;                              // linear warm-up steps
  // The steps the warm-up + cosine schedule spans (0: steps). A resumed run given another --steps
  // keeps its checkpoint's schedule (the learning rate goes on where it was; steps past the
  // schedule's end train at lr × min_lr_ratio) instead of stretching the cosine anew.
  int64_t schedule_steps = 0;
  float clip = 1.0f;                                 // global gradient-norm clip (0: none)
  AdamWOptions adamw;
  uint64_t seed = 0;
  // Precision: "f32", or "bf16" (mixed precision: float32 master weights and AdamW state, and a
  // bfloat16 copy of every matrix but learned positions, rounded after each step, that the
  // forward and the input gradients read; norms, attention, softmax and the loss in float32; no
  // loss scaling). The checkpoints are the same either way. "": f32, or a resumed run's own.
  std::string dtype;
  // Validation and checkpoints.
  double val_fraction = 0.05;  // the last part of the text, never trained on
  int64_t eval_every = 100, eval_batches = 8, checkpoint_every = 100;
  // Text: empty for bytes (vocabulary 256), else a directory with GPT-2's BPE files (vocab.json +
  // merges.txt, or encoder.json + vocab.bpe): the model gets that vocabulary, and the files are
  // copied into the checkpoint so that it runs as it is.
  std::string tokenizer;
  // Fine-tuning instead of training from scratch: a pretrained model (a path, or a name of
  // mhsa/models.h) kept frozen, and a LoRA adapter on it (mhsa/lora.h, lora.rank >= 1) that is
  // what the run trains. The text is read with the model's tokenizer; the shape options and
  // `tokenizer` above do not apply (context does), dtype is the frozen weights' (f32 or bf16; the
  // adapter is float32), and a checkpoint holds the adapter in peft's format
  // (adapter_config.json + adapter_model.safetensors) instead of config.json + model.safetensors.
  std::string model;
  LoraOptions lora{.rank = 0};

  // Throws mhsa::Error naming the first option out of range: sizes and counts that must be
  // positive (or >= 0: warmup, eval_every, checkpoint_every), rates that must be finite and in
  // range (lr > 0, clip >= 0, min_lr_ratio in [0, 1], val_fraction in (0, 0.5), AdamW's), an
  // unknown arch, Llama's options given for GPT-2, kv_heads not dividing heads, an odd head
  // width for RoPE, rope_theta not finite and > 0, a dtype other than f32 and bf16 ("" is f32),
  // a model without a LoRA rank or a LoRA rank without a model, LoRA options out of range.
  void validate() const;
  // kv_heads and mlp with their defaults applied.
  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t schedule_length() const { return schedule_steps > 0 ? schedule_steps : steps; }
  int64_t mlp_width() const;
};

// The learning rate at a step (0-based): linear warm-up, then cosine decay to lr × min_lr_ratio
// at step schedule_length(), and lr × min_lr_ratio after it.
float learning_rate(const TrainOptions& o, int64_t step);

// A text file as tokens (bytes, or GPT-2 BPE), its last val_fraction of bytes held out for
// validation and tokenized apart; the byte counts turn losses per token into bits per byte.
struct TextCorpus {
  std::vector<int32_t> train, val;
  int64_t train_bytes = 0, val_bytes = 0;
  std::string fingerprint;  // "<size> bytes, FNV-1a <hash>" of the file: a resumed run checks it reads the same text
  static TextCorpus load(const std::filesystem::path& file, double val_fraction, int64_t context,
                         const Tokenizer& tokenizer);
};

// One step's numbers, for progress display.
struct TrainProgress {
  int64_t step = 0, steps = 0;
  double loss = 0, grad_norm = 0, lr = 0, tokens_per_s = 0;  // loss: nats per token
  double loss_bits_per_byte = 0;
  double val_bits_per_byte = -1;  // when validation ran at this step
  double comm_wait_s = -1;        // mpirun: seconds rank 0 waited for the step's gradient reduction
  const TrainOptions* options = nullptr;  // the run's options as they apply (a resumed run's: its checkpoint's)
};

// What train_gpt does with what `out` already holds, and how this run (not the checkpoint) runs.
struct TrainStart {
  bool resume = false;             // continue from out's checkpoint
  bool force = false;              // a new run replaces a checkpoint (or model) out holds; else that is refused
  bool allow_data_change = false;  // a resumed run reads text other than the checkpoint's; else that is refused
  // mpirun: the gradients are reduced in buckets of whole tensors of at least this many bytes, each
  // started as soon as the backward has finished it (0: one bucket, after the backward). The
  // results do not depend on it.
  int64_t bucket_bytes = int64_t{4} << 20;
};

// Trains (or resumes from out/train_state.safetensors when start.resume is set: the checkpoint's
// options then apply, except options.steps when it is > 0 — the run then ends at that step but
// keeps the checkpoint's learning-rate schedule — and options.dtype when it is not empty: a run
// may change precision when it resumes) a GPT on `data` (bytes, or BPE with
// options.tokenizer), writing checkpoints to `out`. on_step sees every step; a false return
// stops after writing a checkpoint. Returns the final validation bits per byte. Before the first
// step it checks the options, that `out` is writable and that no other run holds it; it throws
// mhsa::Error when a step's loss or gradient norm is not finite (the last checkpoint stays).
double train_gpt(const std::filesystem::path& data, const std::filesystem::path& out, const TrainOptions& options,
                 const TrainStart& start, const std::function<bool(const TrainProgress&)>& on_step = {});

// Validation loss over the whole held-out text in windows of the model's context (each token
// predicted once, within its window), in bits per byte: bits per token × tokens / `bytes` (the
// text's length; -1: one byte per token, as for a byte-level model).
double evaluate_bits_per_byte(const Gpt2& model, const std::vector<int32_t>& tokens, int64_t context,
                              int64_t bytes = -1);

}  // namespace mhsa
