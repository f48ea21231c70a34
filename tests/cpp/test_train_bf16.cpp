// tests/cpp/test_train_bf16.cpp — mixed-precision training (`mhsa train --dtype bf16`): the kernel
// behind its input gradients (gemm_bf16: C (+)= A·B with a bfloat16 B [K, N]) against its float64
// twin and bitwise against gemm_ex on the widened B, for any thread count; a bf16 training step of
// GPT-2 and of Llama (tied and untied heads) bit for bit the float32 step of the same model with
// its matrices rounded to bfloat16 (loss and every gradient), its gradients near the float32
// gradients of the unrounded weights, the float32 masters left unrounded; and a short run of a
// tiny model in bf16 within 1% of the float32 run's final loss, where two plausible mistakes (the
// bfloat16 copy not refreshed after a step, the masters themselves rounded every step) are not.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/dispatch.h"
#include "mhsa/train.h"
#include "test_util.h"
#include "train/trainable.h"

namespace mhsa::test {
namespace {

using kernels::bf16_to_float;
using kernels::float_to_bf16;

bool same_bits(const float* x, const float* y, int64_t n) {
  return std::memcmp(x, y, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST(Bf16Gemm, MatchesTheReferenceAndGemmExOnTheWidenedB) {
  auto gen = test_rng();
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int saved = omp_get_max_threads();
  for (int64_t M : {1, 5, 17, 40})
    for (int64_t K : {3, 97, 300})
      for (int64_t N : {1, 33, 130}) {
        const int64_t lda = K + 3, ldb = N + 5, ldc = N + 2;
        std::vector<float> a(static_cast<size_t>(M * lda)), b_wide(static_cast<size_t>(K * ldb)),
            c0(static_cast<size_t>(M * ldc));
        std::vector<uint16_t> b(b_wide.size());
        for (float& x : a) x = d(gen);
        for (float& x : c0) x = d(gen);
        for (size_t i = 0; i < b.size(); ++i) {
          b[i] = float_to_bf16(d(gen));
          b_wide[i] = bf16_to_float(b[i]);
        }
        for (bool accumulate : {false, true}) {
          std::vector<float> ref = c0;
          kernels::gemm_bf16_ref(M, N, K, a.data(), lda, b.data(), ldb, ref.data(), ldc, accumulate);
          for (cpu::Isa isa : cpu::usable_isas()) {
            const kernels::KernelTable& k = kernels::kernels_for(isa);
            const std::string what = ::testing::PrintToString(static_cast<int>(isa)) + " M=" + std::to_string(M) +
                                     " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                                     (accumulate ? " accumulate" : "");
            std::vector<float> got[2];
            for (int threads : {1, 2}) {
              omp_set_num_threads(threads);
              got[threads - 1] = c0;
              k.gemm_bf16(M, N, K, a.data(), lda, b.data(), ldb, got[threads - 1].data(), ldc, accumulate);
            }
            EXPECT_TRUE(same_bits(got[0].data(), got[1].data(), M * ldc)) << what << ": 1 vs 2 threads";
            // The packed path's chains: gemm_ex accumulating (onto zeros, for a plain product).
            std::vector<float> wide = c0;
            if (!accumulate)
              for (int64_t i = 0; i < M; ++i) std::fill_n(wide.data() + i * ldc, N, 0.0f);
            k.gemm_ex(M, N, K, a.data(), lda, false, b_wide.data(), ldb, false, wide.data(), ldc, true);
            EXPECT_TRUE(same_bits(got[0].data(), wide.data(), M * ldc)) << what << ": vs gemm_ex on the widened B";
            if (!accumulate && M > 16) {  // where gemm_ex's plain product (gemm) has the same chains
              std::vector<float> plain = c0;
              k.gemm_ex(M, N, K, a.data(), lda, false, b_wide.data(), ldb, false, plain.data(), ldc, false);
              EXPECT_TRUE(same_bits(got[0].data(), plain.data(), M * ldc)) << what << ": vs gemm_ex, no accumulate";
            }
            double worst = 0;  // |got − ref| relative to |A row|·|B column| (+ |C| when accumulating)
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) {
                double na = 0, nb = 0;
                for (int64_t q = 0; q < K; ++q) {
                  na += double{a[i * lda + q]} * a[i * lda + q];
                  nb += double{b_wide[q * ldb + j]} * b_wide[q * ldb + j];
                }
                const double scale = std::sqrt(na * nb) + (accumulate ? std::abs(c0[i * ldc + j]) : 0.0);
                worst = std::max(worst, std::abs(double{got[0][i * ldc + j]} - ref[i * ldc + j]) / scale);
              }
            EXPECT_LE(worst, 4e-7 * std::sqrt(double(K))) << what;
            for (int64_t i = 0; i < M; ++i)  // C's padding untouched
              for (int64_t j = N; j < ldc; ++j) EXPECT_EQ(got[0][i * ldc + j], c0[i * ldc + j]) << what;
          }
        }
      }
  omp_set_num_threads(saved);
}

// What bf16 training keeps a bfloat16 copy of: every matrix but GPT-2's learned positions.
bool rounded_in_bf16(const std::string& name, const Tensor& t) { return t.shape().size() == 2 && name != "wpe.weight"; }

void round_matrices(detail::TrainableModel& m) {
  for (auto& [name, t] : m.parameters())
    if (rounded_in_bf16(name, *t))
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = bf16_to_float(float_to_bf16(t->data()[i]));
}

TrainOptions tiny(const std::string& arch, bool tied, std::mt19937_64& gen) {
  TrainOptions o;
  o.arch = arch;
  o.layers = 2;
  o.heads = 4;
  o.embd = 4 * static_cast<int64_t>(6 + gen() % 4) * (arch == "llama" ? 2 : 1);  // odd-sized heads for GPT-2
  o.context = 24;
  if (arch == "llama") {
    o.kv_heads = 2;
    o.mlp = 40 + static_cast<int64_t>(gen() % 30);
    o.tied_head = tied;
  }
  return o;
}

// Loss and gradients of m on a random batch [B, T] (B·T > 16 rows: the GEMMs' plain chains).
double loss_and_grads(const detail::TrainableModel& m, uint64_t seed, int64_t B, int64_t T, std::vector<Tensor>& g) {
  std::mt19937_64 gen(seed);
  std::vector<int32_t> ids(static_cast<size_t>(B * T)), targets(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(gen() % 256);
    targets[i] = static_cast<int32_t>(gen() % 256);
  }
  g = m.zero_gradients();
  return m.loss_and_gradients(ids, targets, B, T, g, {});
}

double rel_error(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    num += std::pow(double{got.data()[i]} - want.data()[i], 2);
    den += std::pow(double{want.data()[i]}, 2);
  }
  return std::sqrt(num / den);
}

void check_step(const std::string& arch, bool tied) {
  auto gen = test_rng();
  TrainOptions o = tiny(arch, tied, gen);
  const uint64_t seed = gen();
  const Tokenizer bytes = Tokenizer::bytes();
  o.dtype = "bf16";
  const auto half = detail::new_trainable_model(o, bytes, seed);
  o.dtype = "f32";
  const auto exact = detail::new_trainable_model(o, bytes, seed);     // the unrounded weights
  const auto rounded = detail::new_trainable_model(o, bytes, seed);   // the same, matrices rounded
  round_matrices(*rounded);
  const uint64_t batch = gen();
  std::vector<Tensor> g16, g32, gr;
  const double l16 = loss_and_grads(*half, batch, 2, o.context, g16);
  const double lr = loss_and_grads(*rounded, batch, 2, o.context, gr);
  const double l32 = loss_and_grads(*exact, batch, 2, o.context, g32);
  // Where bfloat16 GEMMs run on AVX512_BF16's dot product, the forward's activations are rounded
  // to bfloat16 too (kernels::gemm_bt_bf16_dot): near the rounded model, not bit for bit (ctest's
  // Bf16WithoutDotProduct runs these again with MHSA_BF16_DOT=0 for the bitwise contract).
  const bool dot = kernels::kernels().gemm_bt_bf16_dot != nullptr;
  if (dot)
    EXPECT_NEAR(l16, lr, 1e-3 * std::abs(lr)) << "the bf16 forward is near the float32 forward on the rounded matrices";
  else
    EXPECT_EQ(l16, lr) << "the bf16 forward is the float32 forward on the rounded matrices";
  EXPECT_NE(l16, l32) << "the forward read the bfloat16 copy, not the masters";
  const auto params16 = half->parameters(), params32 = exact->parameters();
  ASSERT_EQ(g16.size(), gr.size());
  int64_t rounded_count = 0;
  for (size_t i = 0; i < g16.size(); ++i) {
    const std::string& name = params16[i].first;
    ASSERT_EQ(g16[i].shape(), gr[i].shape()) << name;
    if (dot)
      EXPECT_LE(rel_error(g16[i], gr[i]), 0x1p-5) << name << ": vs the rounded float32 model";
    else
      EXPECT_TRUE(same_bits(g16[i].data(), gr[i].data(), g16[i].numel())) << name << ": vs the rounded float32 model";
    // Against the float32 gradient of the unrounded weights: bfloat16's 8-bit mantissas (relative
    // rounding ≤ 2^-9 per weight) move each gradient by a fraction of a percent; 2^-5 leaves room
    // for a small tensor's worst case, and would not hold if a gradient itself were rounded by a
    // wrong rounding or taken from other weights.
    EXPECT_LE(rel_error(g16[i], g32[i]), 0x1p-5) << name;
    // The masters stay float32: the bf16 model's weights are the unrounded ones.
    EXPECT_TRUE(same_bits(params16[i].second->data(), params32[i].second->data(), g16[i].numel())) << name;
    rounded_count += rounded_in_bf16(name, *params16[i].second);
  }
  EXPECT_GT(rounded_count, 4);
}

TEST(TrainBf16, Gpt2StepIsTheFloatStepOnRoundedMatrices) { check_step("gpt2", true); }
TEST(TrainBf16, LlamaStepIsTheFloatStepOnRoundedMatrices) { check_step("llama", true); }
TEST(TrainBf16, UntiedLlamaStepIsTheFloatStepOnRoundedMatrices) { check_step("llama", false); }

enum class Mode { f32, bf16, stale_copy, rounded_masters };

// The training loss per step of a tiny Llama on real text (bytes), as the trainer steps: the
// rows of a step drawn from (seed, step), gradients → clip → AdamW → refresh of the bf16 copy.
// stale_copy: the copy never refreshed after the first step; rounded_masters: float32 training
// whose matrices are rounded to bfloat16 after every step (weights that live in bfloat16).
std::vector<double> run(const TrainOptions& base, Mode mode, const std::vector<int32_t>& text, int64_t steps,
                        uint64_t seed) {
  TrainOptions o = base;
  o.dtype = mode == Mode::bf16 || mode == Mode::stale_copy ? "bf16" : "f32";
  const auto model = detail::new_trainable_model(o, Tokenizer::bytes(), seed);
  AdamW adam(model->parameters(), o.adamw);
  const int64_t T = o.context, B = o.batch;
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    std::mt19937_64 gen(seed ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull));
    std::vector<int32_t> ids, targets;
    for (int64_t r = 0; r < B; ++r) {
      const size_t at = gen() % (text.size() - static_cast<size_t>(T) - 1);
      ids.insert(ids.end(), text.begin() + at, text.begin() + at + T);
      targets.insert(targets.end(), text.begin() + at + 1, text.begin() + at + T + 1);
    }
    std::vector<Tensor> grads = model->zero_gradients();
    losses.push_back(model->loss_and_gradients(ids, targets, B, T, grads, {}));
    clip_gradients(grads, o.clip);
    adam.step(model->parameters(), grads, learning_rate(o, step));
    if (mode == Mode::rounded_masters) round_matrices(*model);
    if (mode != Mode::stale_copy) model->refresh_weights();
  }
  return losses;
}

double mean_of_last(const std::vector<double>& x, size_t n) {
  double s = 0;
  for (size_t i = x.size() - n; i < x.size(); ++i) s += x[i];
  return s / double(n);
}

TEST(TrainBf16, AShortRunReachesTheFloatLossWithinOnePercent) {
  auto gen = test_rng();
  std::ifstream file(std::string(MHSA_TEST_DATA_DIR) + "/tokenizer_corpus.json", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 50000u);
  const std::vector<int32_t> text(reinterpret_cast<const unsigned char*>(bytes.data()),
                                  reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
  TrainOptions o = tiny("llama", true, gen);
  o.embd = 48;
  o.batch = 4;
  // A learning rate whose AdamW steps (about lr per weight) are a few times bfloat16's spacing at
  // the weights' scale (0.02 · 2^-7 ≈ 1.6e-4): masters rounded to bfloat16 then lose a good part of
  // each update, and end about 2% above float32 after 300 steps; at 1e-3 they would end within 1%.
  o.lr = 3e-4f;
  o.warmup = 10;
  o.steps = 300;
  const uint64_t seed = gen();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);  // the same bits for any count (tested elsewhere); one thread copes best with a busy machine
  const std::vector<double> f32 = run(o, Mode::f32, text, o.steps, seed);
  const std::vector<double> bf16 = run(o, Mode::bf16, text, o.steps, seed);
  // The same batches: compare the mean loss of the last 20 steps (one step's loss is one batch's).
  const double a = mean_of_last(f32, 20), b = mean_of_last(bf16, 20);
  EXPECT_LT(a, 0.8 * f32[0]) << "the float32 run learns";
  EXPECT_LE(std::abs(b - a), 0.01 * a) << "bf16 " << b << " vs f32 " << a;
  const double stale = mean_of_last(run(o, Mode::stale_copy, text, o.steps, seed), 20);
  EXPECT_GT(std::abs(stale - a), 0.01 * a) << "a copy never refreshed: " << stale << " vs " << a;
  const double masters = mean_of_last(run(o, Mode::rounded_masters, text, o.steps, seed), 20);
  EXPECT_GT(std::abs(masters - a), 0.01 * a) << "masters rounded each step: " << masters << " vs " << a;
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace mhsa::test
