// model/speculative.cpp — see speculative.h.
#include "model/speculative.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/check.h"
#include "mhsa/grammar.h"
#include "model/decoder.h"

namespace mhsa::detail {

namespace {

// Rows up to which each kernel family keeps a row's bits whatever the row count (see exact_rows).
constexpr int64_t kStreamRows = 8;        // nn/linear.cpp: [out, in] weights streamed (matmul_bt*)
constexpr int64_t kGemmStreamRows = 4;    // kernels/gemm.cpp's kStreamMaxM: float [in, out] weights
constexpr int64_t kDecodeQueries = 8;     // kernels/isa/attention_tiles.h: the split-K decode path
constexpr int64_t kDecodeGroupRows = 32;  // its query rows per kv head
constexpr int64_t kMaxDraft = 64;         // a bound on the options, far past what one step checks

int64_t linear_rows(const nn::Stack& s, const nn::LinearRef& r) {
  if (r.w < 0) return kStreamRows;
  if (s.p16(r.w) || s.p8(r.w) || s.p4(r.w) || r.layout == nn::Layout::out_in) return kStreamRows;
  return kGemmStreamRows;
}

}  // namespace

int64_t exact_rows(const nn::Stack& s) {
  int64_t rows = kStreamRows;
  for (const nn::LayerRefs& l : s.layers)
    for (const nn::LinearRef* r : {&l.qkv, &l.q, &l.k, &l.v, &l.o, &l.fc, &l.proj, &l.gate, &l.up, &l.down})
      rows = std::min(rows, linear_rows(s, *r));
  if (s.output_matrix_blocked()) rows = std::min(rows, kGemmStreamRows);
  const ModelConfig& c = *s.config;
  const int64_t group = c.num_kv_heads > 0 ? c.num_heads / c.num_kv_heads : 1;
  rows = std::min({rows, kDecodeQueries, kDecodeGroupRows / std::max<int64_t>(1, group)});
  return std::max<int64_t>(1, rows);
}

void check_speculation(std::string_view fn, const SpeculationOptions& o, int64_t vocab) {
  if (o.draft_tokens < 0 || o.draft_tokens > kMaxDraft)
    fail(fn, "draft_tokens", message("a count in [0, ", kMaxDraft, "] (0: no speculation)"), std::to_string(o.draft_tokens));
  if (o.ngram_min < 1 || o.ngram_min > kMaxDraft)
    fail(fn, "ngram_min", message("a length in [1, ", kMaxDraft, "]"), std::to_string(o.ngram_min));
  if (o.ngram_max < o.ngram_min || o.ngram_max > kMaxDraft)
    fail(fn, "ngram_max", message("a length in [ngram_min = ", o.ngram_min, ", ", kMaxDraft, "]"),
         std::to_string(o.ngram_max));
  if (o.draft_model && o.draft_model->config().vocab_size != vocab)
    fail(fn, "draft_model", message("a model with this model's vocabulary (", vocab, " tokens)"),
         message("a vocabulary of ", o.draft_model->config().vocab_size, " tokens"));
}

std::unique_ptr<Drafter> make_drafter(const SpeculationOptions& o, int64_t max_tokens) {
  if (o.draft_tokens == 0) return nullptr;
  if (o.draft_model) return std::make_unique<ModelDrafter>(*o.draft_model, max_tokens);
  return std::make_unique<LookupDrafter>(o.ngram_min, o.ngram_max);
}

void LookupDrafter::draft(std::span<const int32_t> h, int64_t k, std::vector<int32_t>& out) {
  out.clear();
  const int64_t L = static_cast<int64_t>(h.size());
  for (int64_t n = std::min(max_, L - 1); n >= min_; --n) {
    const int32_t* suffix = h.data() + (L - n);
    // The latest earlier occurrence with at least one token after it: starts j < L − n.
    for (int64_t j = L - n - 1; j >= 0; --j) {
      if (h[static_cast<size_t>(j)] != suffix[0] || !std::equal(suffix, suffix + n, h.data() + j)) continue;
      const int64_t from = j + n, to = std::min(L, from + k);
      out.assign(h.begin() + from, h.begin() + to);
      return;
    }
  }
}

ModelDrafter::ModelDrafter(const Model& draft, int64_t max_tokens)
    : model_(&draft), cache_(draft.new_cache(1, std::min(max_tokens, draft.config().max_positions))) {}

void ModelDrafter::draft(std::span<const int32_t> h, int64_t k, std::vector<int32_t>& out) {
  out.clear();
  const int64_t room = cache_.capacity();
  if (h.empty() || static_cast<int64_t>(h.size()) >= room) return;  // past the draft's context: no guess
  // Keep the longest common prefix, but run at least the last token: its logits are the first guess's.
  size_t keep = static_cast<size_t>(std::mismatch(h.begin(), h.end(), cached_.begin(), cached_.end()).first - h.begin());
  keep = std::min(keep, h.size() - 1);
  cache_.truncate(static_cast<int64_t>(keep));
  cached_.resize(keep);
  constexpr size_t kChunk = 512;  // the prompt in chunks, as the chat session prefills
  Tensor logits;
  for (size_t at = keep; at < h.size();) {
    const size_t n = std::min(kChunk, h.size() - at);
    logits = model_->extend(cache_, h.subspan(at, n), 1, static_cast<int64_t>(n), true);
    cached_.insert(cached_.end(), h.begin() + static_cast<std::ptrdiff_t>(at), h.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  const int64_t V = model_->config().vocab_size;
  k = std::min(k, room - static_cast<int64_t>(h.size()));
  for (int64_t i = 0; i < k; ++i) {
    const float* row = logits.data();
    const int32_t t = static_cast<int32_t>(std::max_element(row, row + V) - row);
    out.push_back(t);
    if (i + 1 == k) break;
    logits = model_->extend(cache_, std::span(&out.back(), 1), 1, 1, true);
    cached_.push_back(t);
  }
}

void RowTimes::add(int64_t rows, double seconds) {
  if (rows < 1 || rows > kMaxRows) return;
  double& t = time_[rows];
  t = t > 0 ? 0.7 * t + 0.3 * seconds : seconds;
}

double RowTimes::time(int64_t n) const {
  const double one = time_[1] > 0 ? time_[1] : 1.0;
  if (time_[n] > 0) return time_[n];
  int64_t m = n - 1;
  while (m > 1 && time_[m] <= 0) --m;
  const double slope = m > 1 ? std::max(0.0, (time_[m] - one) / static_cast<double>(m - 1)) : 0.5 * one;
  return (m > 1 ? time_[m] : one) + static_cast<double>(n - m) * slope;
}

namespace {

// How many guesses a step should check, from this sequence's own record: a guess is kept with
// probability a (the fraction kept so far, recent steps weighing most), so a step of k guesses
// yields (1 − a^(k+1)) / (1 − a) tokens, against the measured time of a forward of k + 1 rows and
// of drafting k guesses. Checking is not free on a CPU: on a 2-core AVX2 host each further row of
// the default model's Q8_0 forward costs about a third of a one-row step, and a fifth row a whole
// second pass over the weights (the 8-bit streams take four rows at a time), so guesses that are
// seldom right make decoding slower. Each row count's time is kept as it is measured; one not yet
// measured is extrapolated from the largest measured below it (optimistically, so it gets tried
// once). Checks no guesses where none pays, and then one guess every kProbe forwards, so that a
// text that turns to copying is noticed.
class Tuner {
 public:
  int64_t choose(int64_t most) {
    most = std::min<int64_t>(most, RowTimes::kMaxRows - 1);
    if (most <= 0) return 0;
    const double a = kept_ / (kept_ + missed_);
    int64_t best = 0;
    double best_gain = 1.02;  // (a gain within timing noise is none)
    double yield = 1, power = 1;
    for (int64_t k = 1; k <= most; ++k) {
      power *= a;
      yield += power;
      const double gain = yield * times_.time(1) / (times_.time(k + 1) + static_cast<double>(k) * draft_);
      if (gain > best_gain) {
        best = k;
        best_gain = gain;
      }
    }
    if (best == 0 && ++idle_ >= kProbe) best = 1;
    if (best > 0) idle_ = 0;
    return best;
  }
  void forward(int64_t rows, double seconds) { times_.add(rows, seconds); }
  void drafted(int64_t guesses, double seconds) {
    if (guesses > 0) draft_ = 0.7 * draft_ + 0.3 * seconds / static_cast<double>(guesses);
  }
  void outcome(int64_t kept, bool missed) {
    kept_ = 0.9 * kept_ + static_cast<double>(kept);
    missed_ = 0.9 * missed_ + (missed ? 1.0 : 0.0);
  }

 private:
  static constexpr int64_t kProbe = 32;

  double kept_ = 1.2, missed_ = 0.8;  // a prior of a = 0.6, worth two forwards
  RowTimes times_;
  double draft_ = 0;
  int64_t idle_ = 0;
};

}  // namespace

DecodeResult decode_sequence(const SequenceRunner& run, std::vector<int32_t>& history, size_t prompt_tokens,
                             std::span<const float> first, const GenerationOptions& o, uint64_t& rng,
                             Drafter* drafter, const DecodeLimits& limits, const std::function<Take(int32_t)>& take) {
  DecodeResult r;
  if (limits.max_new_tokens <= 0) return r;
  const int64_t V = static_cast<int64_t>(first.size());
  const int64_t max_draft = std::min(o.speculation.draft_tokens, limits.exact_rows - 1);
  std::vector<float> row(first.begin(), first.end());  // the sampler changes its row
  Tensor logits;      // [1, 1 + drafts, V] of the last forward (empty before the first)
  std::vector<int32_t> drafts;
  Tuner tuner;
  // The grammar's state, advanced along each kept token: a checked row is masked by the state after
  // the guesses before it, so a guess the grammar forbids is rejected like any other wrong guess.
  std::optional<ConstraintState> constraint;
  if (o.constraint) constraint.emplace(o.constraint->start());
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  for (;;) {
    // Rows 0 .. drafts.size() decide the drafts in turn, then one more token.
    bool dropped = false, stop = false;
    int64_t kept = 0;
    for (size_t i = 0; i <= drafts.size(); ++i) {
      const float* src = logits.numel() ? logits.data() + static_cast<int64_t>(i) * V : first.data();
      if (logits.numel()) row.assign(src, src + V);
      check_logits(row, limits.fn, r.tokens + 1);
      if (constraint) constraint->mask(row);
      bool accepted = false;
      int32_t t;
      if (i < drafts.size()) {
        t = sample_draft(row, history, o, rng, prompt_tokens, drafts[i], accepted);
        ++r.stats.drafted;
        r.stats.accepted += accepted;
        kept += accepted;
      } else {
        t = sample(row, history, o, rng, prompt_tokens);
      }
      ++r.tokens;
      const Take said = take(t);
      if (said == Take::drop) {
        dropped = stop = true;
        break;
      }
      history.push_back(t);
      if (constraint) constraint->advance(t);
      if (said == Take::last || r.tokens == limits.max_new_tokens) stop = true;
      if (stop || !accepted) break;
    }
    if (!drafts.empty()) tuner.outcome(kept, kept < static_cast<int64_t>(drafts.size()));
    // The cache holds the forward's tokens; keep those that are now history (all but the last kept).
    const int64_t held = static_cast<int64_t>(history.size()) - (dropped ? 0 : 1);
    if (run.length() > held) run.truncate(held);
    if (stop) return r;
    if (run.length() + 1 > limits.context) {
      r.context_full = true;
      return r;
    }
    // Guess what follows; one forward runs the last token and the guesses.
    int64_t k = std::min({max_draft, limits.max_new_tokens - r.tokens - 1, limits.context - run.length() - 1});
    if (o.speculation.adaptive) k = tuner.choose(k);
    drafts.clear();
    if (drafter && k > 0) {
      const auto t0 = clock::now();
      drafter->draft(history, k, drafts);
      tuner.drafted(static_cast<int64_t>(drafts.size()), seconds(clock::now() - t0));
    }
    std::vector<int32_t> fed;
    fed.reserve(drafts.size() + 1);
    fed.push_back(history.back());
    fed.insert(fed.end(), drafts.begin(), drafts.end());
    if (run.reserve) run.reserve(run.length() + static_cast<int64_t>(fed.size()));
    const auto t0 = clock::now();
    logits = run.extend(fed);
    tuner.forward(static_cast<int64_t>(fed.size()), seconds(clock::now() - t0));
    ++r.stats.forwards;
  }
}

}  // namespace mhsa::detail
