// apps/mhsa/attention_cmd.cpp — `mhsa attention`: one scaled_dot_product_attention call on random
// inputs of a chosen shape (and optionally its backward), timed, with a summary of the output. A quick way to try shapes and
// options from the shell; the benchmarks with peers live in `mhsa bench` and bench/.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "commands.h"
#include "mhsa/attention.h"
#include "mhsa/error.h"
#include "options.h"

namespace mhsa::cli {
namespace {

struct AttentionArgs {
  int64_t batch = 1, heads = 12, kv_heads = 0, tokens = 512, kv_tokens = 0, head_dim = 64;
  bool causal = false;
  bool backward = false;
  uint64_t seed = 0;
  int repeats = 3;
  int threads = 0;
};

void run(const AttentionArgs& a) {
  use_threads(a.threads);
  const int64_t kv_heads = a.kv_heads ? a.kv_heads : a.heads;
  const int64_t kv_tokens = a.kv_tokens ? a.kv_tokens : a.tokens;
  std::mt19937_64 gen(a.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random_tensor = [&](std::vector<int64_t> dims) {
    Tensor t(std::move(dims));
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = normal(gen);
    return t;
  };
  if (kv_heads <= 0 || a.heads % kv_heads != 0)
    throw Error(detail::message("--kv-heads: expected a count dividing --heads = ", a.heads, ", got ", kv_heads));
  const Tensor q = random_tensor({a.batch, a.heads, a.tokens, a.head_dim});     // [B, Hq, Tq, D]
  const Tensor k = random_tensor({a.batch, kv_heads, kv_tokens, a.head_dim});   // [B, Hkv, Tk, D]
  const Tensor v = random_tensor({a.batch, kv_heads, kv_tokens, a.head_dim});   // [B, Hkv, Tk, D]
  Tensor out({a.batch, a.heads, a.tokens, a.head_dim});
  Tensor lse({a.batch, a.heads, a.tokens});
  AttentionOptions opt;
  opt.causal = a.causal;
  double best = INFINITY;
  for (int r = 0; r < a.repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    scaled_dot_product_attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double sum_sq = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) sum_sq += static_cast<double>(out.data()[i]) * out.data()[i];
  const double flops = attention_flops(a.batch, a.heads, a.tokens, kv_tokens, a.head_dim, a.head_dim, a.causal);
  std::printf("attention q [%lld, %lld, %lld, %lld]  k/v [%lld, %lld, %lld, %lld]  %s\n",
              static_cast<long long>(a.batch), static_cast<long long>(a.heads), static_cast<long long>(a.tokens),
              static_cast<long long>(a.head_dim), static_cast<long long>(a.batch), static_cast<long long>(kv_heads),
              static_cast<long long>(kv_tokens), static_cast<long long>(a.head_dim), a.causal ? "causal" : "full");
  std::printf("best of %d: %.3f ms, %.2f GFLOP/s, rms(out) = %.6f\n", a.repeats, best * 1e3, flops / best * 1e-9,
              std::sqrt(sum_sq / static_cast<double>(std::max<int64_t>(out.numel(), 1))));
  if (!a.backward) return;
  const Tensor dout = random_tensor({a.batch, a.heads, a.tokens, a.head_dim});
  Tensor dq(q.shape()), dk(k.shape()), dv(v.shape());
  double best_bwd = INFINITY;
  for (int r = 0; r < a.repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    scaled_dot_product_attention_backward(dout.view(), q.view(), k.view(), v.view(), out.view(), lse.view(), dq.view(),
                                          dk.view(), dv.view(), opt);
    best_bwd = std::min(best_bwd, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("backward, best of %d: %.3f ms, %.2f GFLOP/s (2.5x the forward's FLOPs)\n", a.repeats, best_bwd * 1e3,
              2.5 * flops / best_bwd * 1e-9);
}

}  // namespace

void add_attention_command(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand("attention", "Run scaled dot-product attention on random inputs and time it");
  cmd->add_option("-B,--batch", args->batch, "batch size B")->check(integer_at_least(1));
  cmd->add_option("-H,--heads", args->heads, "query heads Hq")->check(integer_at_least(1));
  cmd->add_option("--kv-heads", args->kv_heads, "key/value heads Hkv (default Hq; fewer = grouped-query)")
      ->check(integer_at_least(1));
  cmd->add_option("-T,--tokens", args->tokens, "query tokens Tq")->check(integer_at_least(1));
  cmd->add_option("--kv-tokens", args->kv_tokens, "key/value tokens Tk (default Tq)")->check(integer_at_least(1));
  cmd->add_option("-D,--head-dim", args->head_dim, "head size D")->check(integer_at_least(1));
  cmd->add_flag("--causal", args->causal, "mask the future (bottom-right aligned)");
  cmd->add_flag("--backward", args->backward, "also run and time the backward (dq, dk, dv)");
  cmd->add_option("-s,--seed", args->seed, "random seed for the inputs")->check(seed_value());
  cmd->add_option("--repeats", args->repeats, "timed runs; the best is reported")->check(integer_in(1, INT32_MAX));
  add_threads_option(cmd, args->threads);
  cmd->callback([args] { run(*args); });
}

}  // namespace mhsa::cli
