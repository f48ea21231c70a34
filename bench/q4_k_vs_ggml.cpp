// bench/q4_k_vs_ggml.cpp — mhsa's Q4_K quantiser (kernels/q4_k.h) against ggml's reference one
// (quantize_row_q4_K_ref, what llama-quantize uses for Q4_K without an importance matrix) on the
// same weights: every matrix of a model directory whose rows are whole 256-value blocks (in the
// [out, in] orientation GGUF stores), and synthetic Gaussian and heavy-tailed rows. Prints each
// one's RMS error relative to the weights' RMS, both ways, and checks that ggml's dequantiser
// reads our blocks as ours does. Not built by CMake (it links llama.cpp's ggml):
//
//   g++ -O2 -std=c++20 -fopenmp -Isrc -Iinclude bench/q4_k_vs_ggml.cpp build/libmhsa.a \
//       LLAMA_BUILD/ggml/src/libggml-base.a -o build/q4_k_vs_ggml -lpthread -lm
//   build/q4_k_vs_ggml [MODEL_DIR ...]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/q4_k.h"
#include "mhsa/model.h"

extern "C" {
void quantize_row_q4_K_ref(const float* x, void* y, int64_t k);
void dequantize_row_q4_K(const void* x, float* y, int64_t k);
}

namespace {

struct Errors {
  double ours = 0, ggml = 0, norm = 0;
  int64_t n = 0;
  bool same_reading = true;
};

// rows [R, C] (C a multiple of 256) quantised both ways; squared errors added into e.
void compare(const float* x, int64_t R, int64_t C, Errors& e) {
  const int64_t nb = C / mhsa::kernels::kQ4KBlock;
  std::vector<mhsa::kernels::BlockQ4_K> ours(static_cast<size_t>(nb)), theirs(static_cast<size_t>(nb));
  std::vector<float> y(static_cast<size_t>(C)), z(static_cast<size_t>(C)), w(static_cast<size_t>(C));
  for (int64_t r = 0; r < R; ++r) {
    const float* row = x + r * C;
    mhsa::kernels::quantize_row_q4_k(row, C, ours.data());
    mhsa::kernels::dequantize_row_q4_k(ours.data(), C, y.data());
    dequantize_row_q4_K(ours.data(), w.data(), C);
    quantize_row_q4_K_ref(row, theirs.data(), C);
    dequantize_row_q4_K(theirs.data(), z.data(), C);
    e.same_reading = e.same_reading && std::memcmp(y.data(), w.data(), y.size() * sizeof(float)) == 0;
    for (int64_t i = 0; i < C; ++i) {
      e.ours += (double{y[i]} - row[i]) * (double{y[i]} - row[i]);
      e.ggml += (double{z[i]} - row[i]) * (double{z[i]} - row[i]);
      e.norm += double{row[i]} * row[i];
    }
    e.n += C;
  }
}

void report(const std::string& what, const Errors& e) {
  std::printf("%-44s %10lld  ours %.5f  ggml %.5f  ratio %.3f%s\n", what.c_str(), static_cast<long long>(e.n),
              std::sqrt(e.ours / e.norm), std::sqrt(e.ggml / e.norm), std::sqrt(e.ours / e.ggml),
              e.same_reading ? "" : "  (ggml reads our blocks differently!)");
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("%-44s %10s  relative RMS error (RMS(x̂ − x) / RMS(x))\n", "weights", "values");
  for (int a = 1; a < argc; ++a) {
    const mhsa::Model m = mhsa::Model::load(argv[a]);
    const bool gpt2 = m.family() == mhsa::Family::gpt2;
    Errors all;
    for (const auto& [name, t] : m.parameters()) {
      if (t->shape().size() != 2 || name == "wpe.weight") continue;
      const bool conv1d = gpt2 && name != "wte.weight";  // [in, out]: GGUF stores it [out, in]
      const int64_t R = conv1d ? t->dim(1) : t->dim(0), C = conv1d ? t->dim(0) : t->dim(1);
      if (C % mhsa::kernels::kQ4KBlock != 0) continue;
      std::vector<float> x(static_cast<size_t>(R * C));
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          x[static_cast<size_t>(r * C + c)] = conv1d ? t->data()[c * R + r] : t->data()[r * C + c];
      Errors e;
      compare(x.data(), R, C, e);
      report(name, e);
      all.ours += e.ours, all.ggml += e.ggml, all.norm += e.norm, all.n += e.n;
      all.same_reading = all.same_reading && e.same_reading;
    }
    report(std::string(argv[a]) + " (all)", all);
  }
  std::mt19937_64 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> heavy(3.0f);
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<float> x(256 * 4096);
    for (float& v : x) v = kind == 0 ? normal(gen) : heavy(gen);
    Errors e;
    compare(x.data(), 256, 4096, e);
    report(kind == 0 ? "synthetic Gaussian" : "synthetic Student t (3)", e);
  }
}
