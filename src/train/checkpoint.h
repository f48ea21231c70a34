// train/checkpoint.h — a training run's files in its --out directory (see mhsa/train.h):
// writing a checkpoint (config.json, model.safetensors, train_state.safetensors, loss_curve.svg,
// the vocabulary files) as one swap through io/checkpoint_dir, reading train_state.safetensors
// back for a resume without trusting it, and the per-step train_log.jsonl. Not public; not the
// loop (train/trainer.cpp) nor the optimiser (train/optimizer.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "mhsa/safetensors.h"
#include "mhsa/train.h"
#include "train/trainable.h"

namespace mhsa::detail {

// The files a checkpoint directory holds; a new run's first checkpoint replaces all of them, so
// nothing of what the directory held before stays beside it.
const std::vector<std::string>& checkpoint_files();

// What a run has done so far, stored in train_state.safetensors and drawn in loss_curve.svg.
struct History {
  double bytes_per_token = 1;                        // of the training text: nats/token -> bits/byte
  std::vector<double> loss;                          // per step, nats per token
  std::vector<std::pair<int64_t, double>> val_bpb;   // (step, bits per byte)
};

// The loss curve as a small self-contained SVG: training loss per step (bits per byte) and the
// validation points.
std::string loss_curve_svg(const History& h);

// What a diverged run says: where it stopped and what it kept (saved_step 0: nothing).
std::string divergence(const std::filesystem::path& out, int64_t saved_step);

// Writes the checkpoint of `step` into `out`: each file staged aside, then all swapped in at once
// (config.json last). A new run's first checkpoint (`replace`) also removes what the directory
// held before and copies the vocabulary files. Refuses non-finite weights or moments: a diverged
// run never overwrites a good checkpoint (saved_step: the one it keeps, for the message).
void save_checkpoint(const std::filesystem::path& out, TrainableModel& model, AdamW& adam, const TrainOptions& o,
                     int64_t step, const History& h, const std::string& data, bool replace, int64_t saved_step);

// A train_state.safetensors being resumed from. The constructor reads the trainer's metadata
// (options, step, history, text fingerprint) and checks that the history has one loss per step;
// restore() loads the weights and AdamW's state into a model built from those options, checking
// each tensor's presence and shape. Errors name the file and `fn`.
class ResumePoint {
 public:
  ResumePoint(const std::filesystem::path& state_file, std::string_view fn);
  TrainOptions options;  // as saved (the caller validates them after its own changes)
  int64_t step = 0;
  History history;
  std::string data;      // the text's fingerprint ("" in checkpoints from before fingerprints)
  void restore(TrainableModel& model, AdamW& adam) const;

 private:
  std::string meta(const char* key) const;
  int64_t count(const char* key) const;
  std::filesystem::path file_;
  std::string fn_;
  SafeTensors st_;
};

// out/train_log.jsonl: one JSON object per line, per step {"step", "loss" (nats per token),
// "loss_bpb", "lr", "grad_norm", "tokens_per_s"} (and "dtype": "bf16" for a step trained in bf16)
// and per validation {"step", "val_bpb"}, flushed as written. A new run starts it afresh; a
// resumed one keeps the lines of the steps up to its checkpoint (a killed run may have logged
// steps after it) and appends.
class TrainLog {
 public:
  TrainLog(const std::filesystem::path& out, bool resume, int64_t start, std::string_view dtype, std::string_view fn);
  ~TrainLog();
  TrainLog(const TrainLog&) = delete;
  TrainLog& operator=(const TrainLog&) = delete;
  // Appends the step's lines; a write that fails (a full disk) is an mhsa::WriteError.
  void write(const TrainProgress& p);

 private:
  [[noreturn]] void failed(int err) const;
  std::filesystem::path path_;
  std::string dtype_, fn_;
  int fd_ = -1;
};

}  // namespace mhsa::detail
