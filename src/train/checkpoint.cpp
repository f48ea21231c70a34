// train/checkpoint.cpp — a training run's files (see train/checkpoint.h). Nothing read from a
// checkpoint is trusted: its metadata is parsed with bounds and every tensor is shape-checked
// against the model the options describe.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/checkpoint_dir.h"
#include "io/file.h"
#include "io/json.h"
#include "train/options.h"

namespace mhsa::detail {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kVocabularyFiles = {"vocab.json", "merges.txt", "encoder.json", "vocab.bpe"};

// The whole of `text` at `path` (a staged name, itself moved into place later), through an
// OutputFile: every write checked, fsync'd.
void write_file(const fs::path& path, const std::string& text) {
  OutputFile file(path.string(), "train");
  file.write(text.data(), text.size());
  file.commit();
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

}  // namespace

const std::vector<std::string>& checkpoint_files() {
  static const std::vector<std::string> files = {"train_state.safetensors", "model.safetensors",
                                                 "adapter_model.safetensors", "loss_curve.svg", "vocab.json",
                                                 "merges.txt", "encoder.json", "vocab.bpe", "adapter_config.json",
                                                 "config.json"};
  return files;
}

std::string divergence(const fs::path& out, int64_t saved_step) {
  return message("the run diverged: lower --lr (or clip gradients with --clip); ",
                 saved_step > 0 ? message("the checkpoint of step ", saved_step, " in '", out.string(), "' is kept")
                                : std::string("no checkpoint of this run was written"));
}

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
  // x is the step (1-based, as the log and the validation points count them): the loss of
  // history index i is step i + 1, drawn over [1, last step].
  const auto steps = static_cast<int64_t>(h.loss.size());
  const double n = std::max<double>(1, static_cast<double>(steps) - 1);
  const auto X = [&](double step) { return L + (W - L - R) * (step - 1) / n; };
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
  // Step ticks every 1, 2, 5, 10, 20, ... steps: at most 10 of them, labelled below the axis.
  int64_t step_tick = 1;
  for (int64_t mag = 1; steps / step_tick > 10; mag *= 10)
    for (const int64_t m : {1, 2, 5})
      if (steps / (step_tick = m * mag) <= 10) break;
  for (int64_t t = step_tick; t <= std::max<int64_t>(1, steps); t += step_tick)
    s << "<line x1='" << X(double(t)) << "' x2='" << X(double(t)) << "' y1='" << H - Bm << "' y2='" << H - Bm + 4
      << "' stroke='#888'/><text x='" << X(double(t)) << "' y='" << H - Bm + 15 << "' text-anchor='middle'>" << t
      << "</text>\n";
  s << "<text x='" << (W + L) / 2 << "' y='" << H - 4 << "' text-anchor='middle'>step</text>\n<text x='14' y='" << (H - Bm) / 2 << "' transform='rotate(-90 14 " << (H - Bm) / 2
    << ")' text-anchor='middle'>bits per byte</text>\n<polyline fill='none' stroke='#3b6fd6' stroke-width='1.2' points='";
  const size_t stride = std::max<size_t>(1, h.loss.size() / 1000);
  for (size_t i = 0; i < h.loss.size(); i += stride) s << X(double(i + 1)) << "," << Y(bpb(h.loss[i])) << " ";
  s << "'/>\n";
  for (const auto& [step, v] : h.val_bpb)
    s << "<circle cx='" << X(double(step)) << "' cy='" << Y(v) << "' r='3' fill='#d65f3b'/>\n";
  s << "<text x='" << W - R << "' y='" << T << "' text-anchor='end' fill='#3b6fd6'>training</text>"
    << "<text x='" << W - R << "' y='" << T + 14 << "' text-anchor='end' fill='#d65f3b'>validation</text>\n</svg>\n";
  return s.str();
}

void save_checkpoint(const fs::path& out, TrainableModel& model, AdamW& adam, const TrainOptions& o, int64_t step,
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
  const auto stage = [&](const std::string& name) { return staged.emplace_back(staged_name(out, name), name).first; };
  try {
    save_safetensors(stage("train_state.safetensors").string(), state, meta);  // the resume point: one file
    save_safetensors(stage(model.weights_file()).string(), weights, {{"format", "pt"}});
    write_file(stage("loss_curve.svg"), loss_curve_svg(h));
    if (replace && !o.tokenizer.empty())  // the vocabulary files, so that the directory runs as it is
      for (const std::string& name : kVocabularyFiles)
        if (const fs::path from = fs::path(o.tokenizer) / name; fs::exists(from))
          write_file(stage(name), read_file(from, "train", "tokenizer"));
    write_file(stage(model.config_file()), model.config_json());
  } catch (const WriteError& e) {  // a full disk: the directory keeps the last checkpoint, and says so
    std::error_code ec;
    for (const auto& [file, name] : staged) fs::remove(file, ec);
    throw WriteError(message("train: out: expected room for the checkpoint of step ", step, " in '", out.string(),
                             "', got ", std::strerror(e.os_error()), " writing ", staged.back().second, "; ",
                             saved_step > 0 ? message("the checkpoint of step ", saved_step, " is kept")
                                            : std::string("no checkpoint of this run was written")),
                     e.os_error());
  }
  swap_in(out, replace ? checkpoint_files() : std::vector<std::string>{}, staged, "train");
}

// ---- resuming --------------------------------------------------------------------------------

ResumePoint::ResumePoint(const fs::path& state_file, std::string_view fn)
    : file_(state_file), fn_(fn), st_(SafeTensors::open(state_file.string())) {
  try {
    options = options_from_json(parse_json(meta("options"), fn_, file_.string() + ": options"));
    const nlohmann::json h = parse_json(meta("history"), fn_, file_.string() + ": history");
    history.loss = h.at("loss").get<std::vector<double>>();
    history.val_bpb = h.at("val_bpb").get<std::vector<std::pair<int64_t, double>>>();
  } catch (const nlohmann::json::exception& e) {
    fail(fn_, file_.string(), "the trainer's JSON metadata", e.what());
  }
  step = count("step");
  if (history.loss.size() != static_cast<size_t>(step))
    fail(fn_, file_.string(), message("a loss history of ", step, " steps (its step)"),
         message(history.loss.size(), " losses"));
  if (const auto it = st_.metadata().find("data"); it != st_.metadata().end()) data = it->second;
}

std::string ResumePoint::meta(const char* key) const {
  const auto it = st_.metadata().find(key);
  if (it == st_.metadata().end()) fail(fn_, file_.string(), message("metadata '", key, "'"), "none");
  return it->second;
}

int64_t ResumePoint::count(const char* key) const {
  const std::string text = meta(key);
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
    fail(fn_, message(file_.string(), ": metadata '", key, "'"), "a count", "'" + text + "'");
  return std::stoll(text);
}

void ResumePoint::restore(TrainableModel& model, AdamW& adam) const {
  const auto load = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const SafeTensorInfo* info = st_.find(name);
    if (info == nullptr) fail(fn_, file_.string(), message("a tensor '", name, "'"), "none");
    if (info->shape != shape)
      fail(fn_, message(file_.string(), ": tensor '", name, "'"), "shape " + shape_text(shape) + " (the model's)",
           shape_text(info->shape));
    return st_.load(name);
  };
  const auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<int64_t> shape = params[i].second->shape();
    *params[i].second = load("param." + params[i].first, shape);
    adam.first_moments()[i] = load("adam_m." + params[i].first, shape);
    adam.second_moments()[i] = load("adam_v." + params[i].first, shape);
  }
  adam.set_steps(count("adam_steps"));
}

// ---- the log ---------------------------------------------------------------------------------

TrainLog::TrainLog(const fs::path& out, bool resume, int64_t start, std::string_view dtype, std::string_view fn)
    : path_(out / "train_log.jsonl"), dtype_(dtype), fn_(fn) {
  std::string kept;
  if (resume && fs::exists(path_)) {  // the lines of steps up to the checkpoint's; unreadable lines dropped
    std::istringstream lines(read_file(path_, fn_, "out"));
    for (std::string line; std::getline(lines, line);) {
      try {
        const nlohmann::json j = parse_json(line, fn_, "train_log.jsonl");
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= start)
          kept += line + "\n";
      } catch (const Error&) {  // a line cut short by a kill
      }
    }
  }
  check_replaceable(path_, fn_, "out");  // the rename below would replace a device or FIFO
  const fs::path staged = staged_name(out, "train_log.jsonl");
  try {
    write_file(staged, kept);
  } catch (const WriteError& e) {
    failed(e.os_error());
  }
  if (std::rename(staged.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::error_code ec;
    fs::remove(staged, ec);
    failed(err);
  }
  do fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) failed(errno);
}

TrainLog::~TrainLog() {
  if (fd_ >= 0) ::close(fd_);
}

void TrainLog::failed(int err) const {
  throw WriteError(message(fn_, ": out: expected room to write '", path_.string(), "', got ", std::strerror(err)), err);
}

void TrainLog::write(const TrainProgress& p) {
  using line = nlohmann::ordered_json;  // keys in this order
  line l{{"step", p.step},       {"loss", p.loss},           {"loss_bpb", p.loss_bits_per_byte},
         {"lr", p.lr},           {"grad_norm", p.grad_norm}, {"tokens_per_s", p.tokens_per_s}};
  if (p.comm_wait_s >= 0) l["comm_wait_s"] = p.comm_wait_s;
  if (dtype_ != "f32") l["dtype"] = dtype_;
  std::string text = l.dump() + "\n";
  if (p.val_bits_per_byte >= 0) text += line{{"step", p.step}, {"val_bpb", p.val_bits_per_byte}}.dump() + "\n";
  // One write(2) per step: with O_APPEND a killed run leaves whole lines or one cut short at the end.
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failed(n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
}

}  // namespace mhsa::detail
