// apps/mhsa/bench_cmd.cpp — `mhsa bench`: the standard speed cases, each reported as time,
// GFLOP/s and the fraction of this machine's FP32 FMA peak measured in the same run (decode as
// bytes/s against the measured read bandwidth). bench/compare_torch.py runs the same cases
// through PyTorch beside it and prints the ratios; with --model DIR, prompt processing and decoding
// of that model directory (any family) instead, which bench/compare_llama_cpp.py compares with
// llama.cpp on the same directory; --profile adds, after each of those cases, the time of its
// forwards phase by phase (nn/profile.h). Not a test: nothing here passes or fails.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "default_model.h"
#include "core/cpu.h"
#include "model/access.h"
#include "nn/profile.h"
#include "kernels/bf16.h"
#include "kernels/dispatch.h"
#include "mhsa/mhsa.h"
#include "options.h"
#include "output.h"
#include "peak.h"

namespace mhsa::cli {
namespace {

struct BenchArgs {
  std::string model;   // a model directory: time its pp/tg cases instead of the standard ones
  std::string dtype;   // its weights: f32, bf16, f16, q8_0 or q4_k
  std::string kv_dtype;  // its KV cache: f32, bf16, f16, q8_0 or KEY/VALUE
  int64_t depth = 0;     // tokens in the cache before the timed decoding
  int64_t batch = 1;     // sequences decoded together (Model::step, as mhsa serve batches them)
  int64_t paged = 0;     // with batch: the caches in one pool of blocks of this many tokens (as mhsa serve's)
  std::string filter;  // comma-separated substrings: the cases whose name contains one of them run
  std::string json;    // write the results here too
  double min_seconds = 1.0;
  int threads = 0;
  bool profile = false;  // print where a model case's forwards spend their time (nn/profile.h)
};

// Seconds per run of a case: the best, which the rates are quoted from, and the median, the
// statistic to compare with a peer that reports a mean or median (bench/compare_llama_cpp.py).
struct Timing {
  double best, median;
  double total = 0;            // seconds of all the timed runs
  nn::profile::Totals phases;  // their phases, when --profile enabled them (the warm-up excluded)
};

// A case's profile (--profile): the forwards it counts (one head per forward), the mean forward's
// seconds, and each phase's seconds per forward, the last row "other": the rest of the timed runs'
// time (between the phases: allocations, sampling, a step's bookkeeping).
struct PhaseShare {
  std::string name;
  double seconds;  // per forward
  bool per_layer;
};
struct Profile {
  int64_t forwards = 0;  // 0: nothing profiled
  double per_forward = 0;
  std::vector<PhaseShare> phases;
};
Profile profile_of(const Timing& t) {
  Profile p;
  p.forwards = t.phases.calls[static_cast<size_t>(nn::profile::Phase::head)];
  if (p.forwards == 0) return p;
  p.per_forward = t.total / double(p.forwards);
  double phased = 0;
  for (int i = 0; i < nn::profile::kPhases; ++i) {
    const auto phase = static_cast<nn::profile::Phase>(i);
    const double seconds = t.phases.seconds[static_cast<size_t>(i)] / double(p.forwards);
    p.phases.push_back({nn::profile::phase_name(phase), seconds, nn::profile::per_layer(phase)});
    phased += seconds;
  }
  p.phases.push_back({"other", std::max(0.0, p.per_forward - phased), false});
  return p;
}

struct Result {
  std::string name, unit;
  Timing seconds;
  double work;        // in FLOPs, or bytes for memory-bound cases
  double tokens = 0;  // tokens processed per run (model cases)
  int64_t layers = 0;  // the model's layers (model cases)
  Profile profile;     // with --profile (model cases)
};

Tensor random_tensor(std::mt19937_64& gen, std::vector<int64_t> dims) {
  Tensor t(std::move(dims));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = normal(gen);
  return t;
}

// Times repeated runs, at least 3 and for at least min_seconds, after one warm-up.
Timing time_runs(const std::function<void()>& run, double min_seconds) {
  run();
  (void)nn::profile::take();  // the warm-up's phases and any before it
  std::vector<double> times;
  double total = 0.0;
  while (times.size() < 3 || total < min_seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    total += times.back();
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return {times.front(), n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]), total, nn::profile::take()};
}

struct Case {
  std::string name;
  std::function<Result(double)> run;  // min_seconds -> result
};

// A variant's options and name suffix: a sliding window of `window` keys (Hugging Face's
// sliding_window: left = window − 1), soft-capping at `softcap`; FLOPs then count the visible pairs.
struct Variant {
  int64_t window = 0;  // 0: none
  float softcap = 0.0f;
  std::string suffix() const {
    return (window ? "_win" + std::to_string(window) : std::string()) +
           (softcap > 0.0f ? "_cap" + std::to_string(static_cast<int>(softcap)) : std::string());
  }
  void apply(AttentionOptions& o) const {
    if (window) o.window.left = window - 1;
    if (softcap > 0.0f) o.softcap = softcap;
  }
  double flops(int64_t H, int64_t T, int64_t D, const AttentionOptions& o) const {
    return window ? attention_flops(1, H, T, T, D, D, o) : attention_flops(1, H, T, T, D, D, o.causal);
  }
};

Case attention_case(int64_t H, int64_t T, int64_t D, bool causal, Variant var = {}) {
  const std::string name = "attention_H" + std::to_string(H) + "_T" + std::to_string(T) + "_D" + std::to_string(D) +
                           (causal ? "_causal" : "_full") + var.suffix();
  return {name, [=](double min_seconds) {
            std::mt19937_64 gen(1);
            const Tensor q = random_tensor(gen, {1, H, T, D}), k = random_tensor(gen, {1, H, T, D});
            const Tensor v = random_tensor(gen, {1, H, T, D});
            Tensor out({1, H, T, D}), lse({1, H, T});
            AttentionOptions opt;
            opt.causal = causal;
            var.apply(opt);
            const Timing s = time_runs(
                [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view()); },
                min_seconds);
            return Result{name, "GFLOP/s", s, var.flops(H, T, D, opt)};
          }};
}

// attention_case on bfloat16 q, k, v and out (the same random values rounded): on AVX512_BF16's dot
// product where the CPU has it (quoted against that peak), else widened to the float32 kernels.
Case attention_bf16_case(int64_t H, int64_t T, int64_t D, bool causal) {
  const std::string name = "attention_H" + std::to_string(H) + "_T" + std::to_string(T) + "_D" + std::to_string(D) +
                           (causal ? "_causal" : "_full") + "_bf16";
  return {name, [=](double min_seconds) {
            std::mt19937_64 gen(1);
            std::vector<bfloat16> q(static_cast<size_t>(H * T * D)), k(q.size()), v(q.size()), out(q.size());
            for (auto* x : {&q, &k, &v}) {
              const Tensor t = random_tensor(gen, {1, H, T, D});
              for (size_t i = 0; i < x->size(); ++i) (*x)[i] = bfloat16{kernels::float_to_bf16(t.data()[i])};
            }
            Tensor lse({1, H, T});
            AttentionOptions opt;
            opt.causal = causal;
            const Timing s = time_runs(
                [&] {
                  scaled_dot_product_attention<bfloat16>(View<const bfloat16>(q.data(), {1, H, T, D}),
                                                         View<const bfloat16>(k.data(), {1, H, T, D}),
                                                         View<const bfloat16>(v.data(), {1, H, T, D}),
                                                         View<bfloat16>(out.data(), {1, H, T, D}), opt, lse.view());
                },
                min_seconds);
            return Result{name, "GFLOP/s", s, Variant{}.flops(H, T, D, opt)};
          }};
}

Case backward_case(int64_t H, int64_t T, int64_t D, bool causal, Variant var = {}) {
  const std::string name = "backward_H" + std::to_string(H) + "_T" + std::to_string(T) + "_D" + std::to_string(D) +
                           (causal ? "_causal" : "_full") + var.suffix();
  return {name, [=](double min_seconds) {
            std::mt19937_64 gen(5);
            const Tensor q = random_tensor(gen, {1, H, T, D}), k = random_tensor(gen, {1, H, T, D});
            const Tensor v = random_tensor(gen, {1, H, T, D}), dout = random_tensor(gen, {1, H, T, D});
            AttentionOptions opt;
            opt.causal = causal;
            var.apply(opt);
            const AttentionResult fwd = scaled_dot_product_attention(q.view(), k.view(), v.view(), opt);
            Tensor dq({1, H, T, D}), dk({1, H, T, D}), dv({1, H, T, D});
            const Timing s = time_runs(
                [&] {
                  scaled_dot_product_attention_backward(dout.view(), q.view(), k.view(), v.view(), fwd.out.view(),
                                                        fwd.lse.view(), dq.view(), dk.view(), dv.view(), opt);
                },
                min_seconds);
            return Result{name, "GFLOP/s", s, 2.5 * var.flops(H, T, D, opt)};  // docs/architecture.md
          }};
}

// backward_case on bfloat16 inputs and gradients (the same random values rounded), from the bfloat16
// forward's out and lse: on AVX512_BF16's dot product where the CPU has it, else widened.
Case backward_bf16_case(int64_t H, int64_t T, int64_t D, bool causal) {
  const std::string name = "backward_H" + std::to_string(H) + "_T" + std::to_string(T) + "_D" + std::to_string(D) +
                           (causal ? "_causal" : "_full") + "_bf16";
  return {name, [=](double min_seconds) {
            std::mt19937_64 gen(5);
            const size_t n = static_cast<size_t>(H * T * D);
            std::vector<bfloat16> q(n), k(n), v(n), dout(n), out(n), dq(n), dk(n), dv(n);
            for (auto* x : {&q, &k, &v, &dout}) {
              const Tensor t = random_tensor(gen, {1, H, T, D});
              for (size_t i = 0; i < n; ++i) (*x)[i] = bfloat16{kernels::float_to_bf16(t.data()[i])};
            }
            const auto in = [&](const std::vector<bfloat16>& x) { return View<const bfloat16>(x.data(), {1, H, T, D}); };
            const auto grad = [&](std::vector<bfloat16>& x) { return View<bfloat16>(x.data(), {1, H, T, D}); };
            Tensor lse({1, H, T});
            AttentionOptions opt;
            opt.causal = causal;
            scaled_dot_product_attention<bfloat16>(in(q), in(k), in(v), grad(out), opt, lse.view());
            const Timing s = time_runs(
                [&] {
                  scaled_dot_product_attention_backward<bfloat16>(in(dout), in(q), in(k), in(v), in(out), lse.view(),
                                                                  grad(dq), grad(dk), grad(dv), opt);
                },
                min_seconds);
            return Result{name, "GFLOP/s", s, 2.5 * Variant{}.flops(H, T, D, opt)};
          }};
}

Case decode_case(int64_t H, int64_t Tk, int64_t D) {
  const std::string name = "decode_H" + std::to_string(H) + "_Tk" + std::to_string(Tk) + "_D" + std::to_string(D);
  return {name, [=](double min_seconds) {
            std::mt19937_64 gen(2);
            const Tensor q = random_tensor(gen, {1, H, 1, D}), k = random_tensor(gen, {1, H, Tk, D});
            const Tensor v = random_tensor(gen, {1, H, Tk, D});
            Tensor out({1, H, 1, D});
            const Timing s = time_runs(
                [&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), out.view()); }, min_seconds);
            return Result{name, "GB/s", s, 2.0 * H * Tk * D * sizeof(float)};  // K and V read once
          }};
}

Case mha_case(int64_t C, int64_t H, int64_t T) {
  const std::string name = "mha_C" + std::to_string(C) + "_H" + std::to_string(H) + "_T" + std::to_string(T) + "_causal";
  return {name, [=](double min_seconds) {
            std::mt19937_64 gen(3);
            const MultiHeadAttention m(C, H);
            const Tensor x = random_tensor(gen, {1, T, C});
            MhaOptions opt;
            opt.causal = true;
            const Timing s = time_runs([&] { (void)m.forward(x.view(), opt); }, min_seconds);
            const double flops = 2.0 * T * C * 3 * C + attention_flops(1, H, T, T, C / H, C / H, true) + 2.0 * T * C * C;
            return Result{name, "GFLOP/s", s, flops};
          }};
}

Case gemm_case(int64_t M, int64_t K, int64_t N) {
  const std::string name = "gemm_M" + std::to_string(M) + "_K" + std::to_string(K) + "_N" + std::to_string(N);
  return {name, [=](double min_seconds) {
            std::mt19937_64 gen(4);
            const Tensor a = random_tensor(gen, {M, K}), b = random_tensor(gen, {K, N}), bias = random_tensor(gen, {N});
            Tensor c({M, N});
            const auto gemm = kernels::kernels().gemm;
            const Timing s = time_runs(
                [&] { gemm(M, N, K, a.data(), K, b.data(), N, bias.data(), c.data(), N); }, min_seconds);
            return Result{name, "GFLOP/s", s, 2.0 * M * N * K};
          }};
}

// GPT-2 small (124M: 12 layers, 12 heads of 64, vocabulary 50257) with random weights, built once.
const Gpt2& gpt2_small() {
  static const Gpt2 model = Gpt2::random(Gpt2Config{}, 5);
  return model;
}

// Prompt processing of T tokens (llama-bench's ppT): one prefill, logits of the last token only.
Case gpt2_prefill_case(int64_t T) {
  const std::string name = "gpt2_124M_pp" + std::to_string(T);
  return {name, [=](double min_seconds) {
            const Gpt2& m = gpt2_small();
            const Gpt2Config& c = m.config();
            std::vector<int32_t> ids(static_cast<size_t>(T));
            for (int64_t t = 0; t < T; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7919) % c.vocab_size);
            const Timing s = time_runs(
                [&] {
                  Gpt2Cache cache = m.new_cache(1, T);
                  (void)m.extend(cache, ids, 1, T, true);
                },
                min_seconds);
            const double C = static_cast<double>(c.n_embd), F = static_cast<double>(c.mlp_dim());
            const double per_layer = 2.0 * T * (3 * C * C + C * C + 2 * C * F) +
                                     attention_flops(1, c.n_head, T, T, c.n_embd / c.n_head, c.n_embd / c.n_head, true);
            return Result{name, "GFLOP/s", s, c.n_layer * per_layer + 2.0 * C * c.vocab_size, double(T)};
          }};
}

// Decoding of n tokens one at a time from an empty context (llama-bench's tgN): each step reads
// every weight once, so it is reported as bytes read per second against the read bandwidth.
Case gpt2_decode_case(int64_t n) {
  const std::string name = "gpt2_124M_tg" + std::to_string(n);
  return {name, [=](double min_seconds) {
            const Gpt2& m = gpt2_small();
            const Gpt2Config& c = m.config();
            const Timing s = time_runs(
                [&] {
                  Gpt2Cache cache = m.new_cache(1, n);
                  std::vector<int32_t> token = {1};
                  for (int64_t i = 0; i < n; ++i) (void)m.extend(cache, token, 1, 1, true);
                },
                min_seconds);
            const double C = static_cast<double>(c.n_embd), F = static_cast<double>(c.mlp_dim());
            const double weights = c.n_layer * (4 * C * C + 2 * C * F + 9 * C + F) + c.vocab_size * C;
            const double kv = c.n_layer * 2.0 * C * (n + 1) / 2.0;  // the cache read per step, on average
            return Result{name, "GB/s", s, n * (weights + kv) * sizeof(float), double(n)};
          }};
}

// One training step of GPT-2 124M on B sequences of T tokens: the loss and every gradient
// (Gpt2::loss_and_gradients), global-norm clipping and an AdamW update. Reported against the
// model FLOPs (6 per parameter-multiply per token, 3× the causal attention's forward; no
// recomputation counted), so rate / peak is the model-FLOP utilisation.
Case gpt2_train_case(int64_t B, int64_t T) {
  const std::string name = "gpt2_124M_train_B" + std::to_string(B) + "_T" + std::to_string(T);
  return {name, [=](double min_seconds) {
            Gpt2 m = Gpt2::random(Gpt2Config{}, 6);
            const Gpt2Config& c = m.config();
            std::vector<int32_t> ids(static_cast<size_t>(B * T + 1));
            for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + i * i * 31) % c.vocab_size);
            const std::span<const int32_t> x(ids.data(), static_cast<size_t>(B * T)), y(ids.data() + 1, x.size());
            const auto params = m.parameters();
            AdamW adam(params);
            std::vector<Tensor> grads = m.zero_gradients();
            const Timing s = time_runs(
                [&] {
                  for (Tensor& g : grads) std::fill(g.data(), g.data() + g.numel(), 0.0f);
                  (void)m.loss_and_gradients(x, y, B, T, grads);
                  (void)clip_gradients(grads, 1.0);
                  adam.step(params, grads, 1e-4f);
                },
                min_seconds);
            const double C = static_cast<double>(c.n_embd), F = static_cast<double>(c.mlp_dim());
            const double dense = c.n_layer * (4 * C * C + 2 * C * F) + C * c.vocab_size;  // multiplies per token
            const double attn = c.n_layer * attention_flops(B, c.n_head, T, T, c.n_embd / c.n_head,
                                                            c.n_embd / c.n_head, true);
            return Result{name, "GFLOP/s", s, 6.0 * dense * B * T + 3.0 * attn, double(B * T)};
          }};
}

// A model directory's cases (--model): prompt processing of min(512, context) tokens and decoding
// of min(128, context), as the GPT-2 cases above, named "<family>_pp512" and "<family>_tg128"
// ("<family>_bf16_..." / "<family>_f16_..." with --dtype bf16 / f16, whose weight matrices count
// 2 bytes a value;
// "<family>_q8_0_..." with --dtype q8_0, 34 bytes per 32 values; "<family>_q4_k_..." with --dtype
// q4_k, 144 bytes per 256 values and the head's 34 per 32; a matrix whose rows are not whole
// blocks counted as the model keeps it).
// No tokenizer: the ids are arbitrary. Work is counted from the config: every projection and the
// LM head (2 FLOPs per weight per token) and the attention pairs each layer's window leaves; a
// decoded token reads every layer's weights, the head and the cache. --kv-dtype bf16/f16/q8_0: the
// cache holds 16-bit or Q8_0 keys and values (the cases named "<family>_kv<type>_pp512" and
// "..._tg128", the cache counted at 2 or 34/32 bytes a value); --depth N: the decoding starts after a prompt of N tokens (prefilled
// once, untimed; each run rewinds the cache to it), named "..._tg128_d<N>" (llama-bench's
// "tg128 @ dN"); --batch N (> 1): N sequences, each with its own cache, decode together through
// Model::step (one forward of N rows per step, as mhsa serve's continuous batching runs them),
// named "..._tg128_b<N>": tokens/s counts all N sequences' tokens, the bytes the weights once per
// step plus every sequence's cache; with --paged B, the N caches are one pool of B-token blocks
// (a KVBlockPool, as mhsa serve keeps them), named "..._tg128_b<N>_paged<B>".
std::vector<Case> model_cases(const std::filesystem::path& dir, const std::string& dtype, const std::string& kv_dtype,
                              int64_t depth, int64_t batch, int64_t paged) {
  const WeightType wt = parse_weight_type(dtype, "--dtype");
  const KVTypes kv_type = parse_kv_types(kv_dtype, "--kv-dtype");
  // Bytes per cached value, keys' and values' types averaged (their head sizes are equal).
  const double kv_value_bytes = double(kv_row_bytes(kv_type.key, 32) + kv_row_bytes(kv_type.value, 32)) / 64.0;
  Model loaded = as_model_option("Model::load", [&] { return Model::load(dir, wt); });
  ModelAccess::block_weights(loaded);  // as mhsa generate and serve load it (default_model.cpp)
  loaded.set_kv_type(kv_type);
  auto model = std::make_shared<const Model>(std::move(loaded));
  const ModelConfig& c = model->config();
  const double C = double(c.hidden_size), V = double(c.vocab_size), F = double(c.intermediate_size);
  const double q = double(c.num_heads * c.head_dim), kv = double(c.num_kv_heads * c.head_dim);
  const double mlp = (c.mlp == MlpKind::gelu ? 2.0 : 3.0) * C * F;
  const double layer_weights = C * (2 * q + 2 * kv) + mlp;  // the matrices only (norms, biases: < 1%)
  const std::string family =
      std::string(family_name(c.family)) + (wt == WeightType::f32 ? "" : "_" + std::string(weight_type_name(wt)));
  // Bytes per value of a matrix with rows of `in` values as the model keeps it (mhsa/model.h).
  const auto per_value = [wt](double in, bool head) {
    const bool q8 = std::fmod(in, 32.0) == 0, q4 = std::fmod(in, 256.0) == 0;
    if (wt == WeightType::bf16 || wt == WeightType::f16) return 2.0;
    if (wt == WeightType::q4_k && q4 && !head) return 144.0 / 256;
    if ((wt == WeightType::q8_0 || wt == WeightType::q4_k) && q8) return 34.0 / 32;
    return 4.0;
  };
  const double in_c = C * (q + 2 * kv) + (c.mlp == MlpKind::gelu ? 1.0 : 2.0) * C * F;  // matrices with rows of C
  const double weight_bytes_read =
      c.num_layers * (in_c * per_value(C, false) + q * C * per_value(q, false) + F * C * per_value(F, false)) +
      V * C * per_value(C, true);
  const int64_t pp = std::min<int64_t>(512, c.max_positions), tg = std::min<int64_t>(128, c.max_positions - depth - (batch - 1));
  const int64_t layers = c.num_layers;
  if (tg < 1)
    throw Error(detail::message("--depth: expected at most ", c.max_positions - batch,
                                " (the model's context less --batch), got ", depth));
  std::string kv_part = kv_type == KVType::f32 ? "" : "_kv" + kv_type_name(kv_type);
  std::replace(kv_part.begin(), kv_part.end(), '/', '_');  // (keys and values apart: "_kvq8_0_f16")
  const std::string pp_name = family + kv_part + "_pp" + std::to_string(pp);
  const std::string tg_name = family + kv_part + "_tg" + std::to_string(tg) +
                              (depth > 0 ? "_d" + std::to_string(depth) : "") +
                              (batch > 1 ? "_b" + std::to_string(batch) : "") +
                              (paged > 0 ? "_paged" + std::to_string(paged) : "");
  Case prefill{pp_name, [=](double min_seconds) {
                 std::vector<int32_t> ids(static_cast<size_t>(pp));
                 for (int64_t t = 0; t < pp; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7919) % c.vocab_size);
                 const Timing s = time_runs(
                     [&] {
                       ModelCache cache = model->new_cache(1, pp);
                       (void)model->extend(cache, ids, 1, pp, true);
                     },
                     min_seconds);
                 double flops = 2.0 * pp * c.num_layers * layer_weights + 2.0 * C * V;
                 for (int64_t l = 0; l < c.num_layers; ++l) {
                   AttentionOptions o;
                   o.causal = true;
                   o.window.left = c.window_left[static_cast<size_t>(l)];
                   flops += attention_flops(1, c.num_heads, pp, pp, c.head_dim, c.head_dim, o);
                 }
                 return Result{pp_name, "GFLOP/s", s, flops, double(pp), layers};
               }};
  // The cache read per step by one sequence, on average: keys and values of depth + (tg + 1)/2 tokens.
  const double cache_values = c.num_layers * 2.0 * kv * (double(depth) + (tg + 1) / 2.0);
  Case batched{tg_name, [=](double min_seconds) {
                 // Sequence s starts after a prompt of depth + s tokens (distinct lengths and
                 // positions, as a server's sequences have), prefilled once, untimed.
                 std::vector<ModelCache> caches;
                 std::optional<KVBlockPool> pool;
                 std::vector<PagedSequence> pages(static_cast<size_t>(batch));
                 if (paged > 0) {
                   int64_t blocks = 0;
                   for (int64_t s = 0; s < batch; ++s) blocks += (depth + s + tg + paged - 1) / paged;
                   pool.emplace(c.num_layers, c.num_kv_heads, c.head_dim, c.head_dim, paged, blocks, kv_type);
                 }
                 std::vector<int64_t> starts;
                 for (int64_t s = 0; s < batch; ++s) {
                   starts.push_back(depth + s);
                   std::vector<int32_t> prompt(static_cast<size_t>(depth + s));
                   for (int64_t t = 0; t < depth + s; ++t)
                     prompt[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7919 + s) % c.vocab_size);
                   if (pool) {
                     PagedSequence& p = pages[static_cast<size_t>(s)];
                     if (!pool->reserve(p, pool->blocks_for(depth + s + tg)))
                       throw Error("mhsa bench: --paged: the pool cannot hold the sequences");
                     pool->grow(p, depth + s + tg);
                     const SequenceStep one{nullptr, prompt, &p};
                     if (!prompt.empty()) (void)model->step(std::span(&one, 1));
                   } else {
                     caches.push_back(model->new_cache(1, depth + s + tg));
                     if (!prompt.empty()) (void)model->extend(caches.back(), prompt, 1, depth + s, true);
                   }
                 }
                 const std::vector<int32_t> token(static_cast<size_t>(batch), 1 % static_cast<int32_t>(c.vocab_size));
                 std::vector<SequenceStep> seqs(static_cast<size_t>(batch));
                 for (size_t s = 0; s < seqs.size(); ++s)
                   seqs[s] = pool ? SequenceStep{nullptr, std::span(token).subspan(s, 1), &pages[s]}
                                  : SequenceStep{&caches[s], std::span(token).subspan(s, 1)};
                 const Timing t = time_runs(
                     [&] {
                       for (size_t s = 0; s < seqs.size(); ++s) {
                         if (pool) pages[s].length = starts[s];  // its blocks stay: they cover depth + s + tg
                         else caches[s].truncate(starts[s]);
                       }
                       for (int64_t i = 0; i < tg; ++i) (void)model->step(seqs);
                     },
                     min_seconds);
                 // Sequence s reads s more cached tokens than cache_values counts: (batch - 1)/2 on average.
                 const double extra = c.num_layers * 2.0 * kv * (batch - 1) / 2.0;
                 const double bytes = weight_bytes_read + batch * (cache_values + extra) * kv_value_bytes;
                 return Result{tg_name, "GB/s", t, tg * bytes, double(tg * batch), layers};
               }};
  if (batch > 1) return {prefill, batched};
  Case decode{tg_name, [=](double min_seconds) {
                ModelCache cache = model->new_cache(1, depth + tg);
                if (depth > 0) {
                  std::vector<int32_t> prompt(static_cast<size_t>(depth));
                  for (int64_t t = 0; t < depth; ++t)
                    prompt[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7919) % c.vocab_size);
                  (void)model->extend(cache, prompt, 1, depth, true);
                }
                const Timing s = time_runs(
                    [&] {
                      cache.truncate(depth);
                      std::vector<int32_t> token = {1 % static_cast<int32_t>(c.vocab_size)};
                      for (int64_t i = 0; i < tg; ++i) (void)model->extend(cache, token, 1, 1, true);
                    },
                    min_seconds);
                return Result{tg_name, "GB/s", s,
                              tg * (weight_bytes_read + cache_values * kv_value_bytes), double(tg),
                              layers};
              }};
  return {prefill, decode};
}

// Whether `name` contains one of the comma-separated substrings of `filter` (all do when empty).
bool selected(const std::string& name, const std::string& filter) {
  size_t begin = 0;
  do {
    const size_t end = std::min(filter.find(',', begin), filter.size());
    if (name.find(filter.substr(begin, end - begin)) != std::string::npos) return true;
    begin = end + 1;
  } while (begin <= filter.size());
  return false;
}

void run(const BenchArgs& a) {
  use_threads(a.threads);
  if (a.profile && a.model.empty())
    throw Error("mhsa bench: --profile: expected with --model (it times a model's phases), got no --model");
  nn::profile::set_enabled(a.profile);
  std::optional<OutputFile> json;  // opened first: a path that cannot be written fails before the cases run
  if (!a.json.empty()) json.emplace(a.json, "--json");
  // A model directory is loaded before the measurements: a bad one fails at once.
  if (a.model.empty() && (a.kv_dtype != "f32" || a.depth != 0 || a.batch != 1 || a.paged != 0))
    throw Error("mhsa bench: --kv-dtype, --depth, --batch and --paged: expected with --model (they set its decode case), "
                "got no --model");
  if (a.paged != 0 && (a.paged & (a.paged - 1)) != 0)
    throw Error(detail::message("mhsa bench: --paged: expected a power of two (tokens per block), got ", a.paged));
  if (a.paged != 0 && a.batch < 2)
    throw Error("mhsa bench: --paged: expected with --batch 2 or more (the batched step's caches), got --batch 1");
  const ResolvedModel named = a.model.empty() ? ResolvedModel{} : resolve_model(a.model);
  const std::vector<Case> cases = !a.model.empty() ? model_cases(named.path, effective_dtype(named, a.dtype), a.kv_dtype, a.depth, a.batch, a.paged) : std::vector<Case>{
      attention_case(12, 4096, 64, false), attention_case(12, 4096, 64, true),
      attention_case(8, 4096, 128, false), attention_case(8, 4096, 128, true),
      attention_case(12, 4096, 64, true, {512}), attention_case(12, 4096, 64, true, {0, 50.0f}),
      attention_bf16_case(12, 4096, 64, false), attention_bf16_case(12, 4096, 64, true),
      backward_case(12, 4096, 64, true),   backward_case(12, 4096, 64, true, {512}),
      backward_bf16_case(12, 4096, 64, true),
      mha_case(768, 12, 1024),             gemm_case(1024, 768, 2304),
      decode_case(12, 16384, 64),          gpt2_prefill_case(512),              gpt2_decode_case(128),
      gpt2_train_case(1, 256),             gpt2_train_case(4, 256)};
  const int threads = omp_get_max_threads();
  const std::string isa(cpu::isa_name(cpu::best_isa()));
  std::printf("mhsa bench: %d thread(s), kernels: %s%s%s\n", threads, isa.c_str(), cpu::bf16_dot() ? " +avx512bf16" : "",
              !cpu::vnni(cpu::best_isa())          ? ""
              : cpu::best_isa() == cpu::Isa::avx512 ? " +avx512vnni"
                                                    : " +avxvnni");
  const double peak = bench::measure_fma_peak_gflops(threads);
  double bandwidth = bench::measure_read_bandwidth_gbs(threads);
  // bfloat16 weights' many-row GEMMs and bfloat16 attention run on AVX512_BF16's dot product where
  // the CPU has it: those cases (bf16 in the name) are quoted against that instruction's peak
  // (twice the FMA's), the stricter yardstick.
  const bool dot = cpu::bf16_dot() && std::any_of(cases.begin(), cases.end(), [&](const Case& c) {
                     return selected(c.name, a.filter) && c.name.find("bf16") != std::string::npos;
                   });
  const double dot_peak = dot ? bench::measure_bf16_dot_peak_gflops(threads) : 0.0;
  std::printf("measured: FP32 FMA peak %.1f GFLOP/s, read bandwidth %.1f GB/s (copy %.1f GB/s)", peak, bandwidth,
              bench::measure_copy_bandwidth_gbs(threads));
  if (dot) std::printf(", BF16 dot-product peak %.1f GFLOP/s (the bf16 cases' yardstick)", dot_peak);
  const auto on_dot = [&](const Result& r) { return dot && r.name.find("bf16") != std::string::npos; };
  std::printf("\n\n");
  std::printf("%-32s %10s %12s %9s\n", "case", "ms", "rate", "of peak");
  std::vector<Result> results;
  for (const Case& c : cases) {
    if (!selected(c.name, a.filter)) continue;
    Result r = c.run(a.min_seconds);
    if (a.profile) r.profile = profile_of(r.seconds);
    const double rate = r.work / r.seconds.best * 1e-9;
    // Bandwidth swings on these hosts: re-measure right after each memory-bound case, and keep
    // the highest reading, so that no case is quoted against a slow moment's yardstick.
    if (r.unit == "GB/s") bandwidth = std::max(bandwidth, bench::measure_read_bandwidth_gbs(threads, rate));
    const double yardstick = r.unit == "GB/s" ? bandwidth : on_dot(r) ? dot_peak : peak;
    std::printf("%-32s %10.3f %7.1f %-7s %5.1f%%", r.name.c_str(), r.seconds.best * 1e3, rate, r.unit.c_str(),
                100.0 * rate / yardstick);
    if (r.tokens > 0) std::printf("  %.1f tokens/s", r.tokens / r.seconds.best);
    std::printf("\n");
    if (r.profile.forwards > 0) {
      std::printf("  where a forward's %.3f ms go (%lld forwards of %lld layers; the mean over all the timed runs):\n",
                  r.profile.per_forward * 1e3, static_cast<long long>(r.profile.forwards),
                  static_cast<long long>(r.layers));
      std::printf("    %-12s %9s %10s %7s\n", "phase", "ms", "us/layer", "share");
      for (const PhaseShare& p : r.profile.phases) {
        std::printf("    %-12s %9.3f ", p.name.c_str(), p.seconds * 1e3);
        if (p.per_layer) std::printf("%10.1f ", p.seconds * 1e6 / double(r.layers));
        else std::printf("%10s ", "");
        std::printf("%6.1f%%\n", 100.0 * p.seconds / r.profile.per_forward);
      }
    }
    flush_stdout();  // a case takes seconds: fail now rather than after all of them
    results.push_back(r);
  }
  if (json) {
    std::ostringstream out;
    out << "{\"threads\": " << threads << ", \"isa\": \"" << cpu::isa_name(cpu::best_isa())
        << "\", \"fma_peak_gflops\": " << peak << ", \"read_bandwidth_gbs\": " << bandwidth
        << (dot ? ", \"bf16_dot_peak_gflops\": " + std::to_string(dot_peak) : std::string()) << ", \"cases\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      out << (i ? ", " : "") << "{\"name\": \"" << results[i].name << "\", \"seconds\": " << results[i].seconds.best
          << ", \"median_seconds\": " << results[i].seconds.median << ", \"work\": " << results[i].work
          << ", \"unit\": \"" << results[i].unit << "\""
          << (results[i].tokens > 0 ? ", \"tokens\": " + std::to_string(results[i].tokens) : std::string());
      const Profile& prof = results[i].profile;
      if (prof.forwards > 0) {
        out << ", \"profile\": {\"forwards\": " << prof.forwards << ", \"layers\": " << results[i].layers
            << ", \"seconds_per_forward\": {";
        for (size_t j = 0; j < prof.phases.size(); ++j)
          out << (j ? ", " : "") << "\"" << prof.phases[j].name << "\": " << prof.phases[j].seconds;
        out << "}}";
      }
      out << "}";
    }
    out << "]}\n";
    json->write(out.str());
    json->commit();
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Time the standard cases against this machine's measured peak");
  cmd->add_option("-m,--model", args->model,
                  "time prompt processing (pp512) and decoding (tg128) of this model directory (any family) "
                  "instead of the standard cases");
  add_dtype_option(cmd, args->dtype);
  add_kv_dtype_option(cmd, args->kv_dtype);
  cmd->add_option("--depth", args->depth,
                  "with --model: decode after a prompt of this many tokens (prefilled once, not timed)")
      ->default_val(0)
      ->check(integer_in(0, int64_t{1} << 30));
  cmd->add_option("--batch", args->batch,
                  "with --model: decode this many sequences together, one forward of N rows per step (as mhsa "
                  "serve batches them); tokens/s counts them all")
      ->default_val(1)
      ->check(integer_in(1, 256));
  cmd->add_option("--paged", args->paged,
                  "with --batch: keep the sequences' caches in one pool of blocks of this many tokens, as mhsa serve "
                  "does (a power of two; serve's is 16)")
      ->check(integer_in(1, 4096));
  cmd->add_option("--filter", args->filter, "run only the cases whose name contains this (or one of these, comma-separated)");
  cmd->add_option("--json", args->json, "also write the results to this JSON file");
  cmd->add_option("--min-seconds", args->min_seconds, "time each case for at least this long")
      ->check(number_above(0));
  cmd->add_flag("--profile", args->profile,
                "with --model: after each case, the time of its forwards phase by phase (norms, q|k|v, attention, "
                "output projection, MLP, residuals, head; per forward, per layer, and shares)");
  add_threads_option(cmd, args->threads);
  cmd->callback([args] { run(*args); });
}

}  // namespace mhsa::cli
