// tests/arm/check.cpp — run under qemu-aarch64 by scripts/test.sh: on ARM the library builds its
// portable kernels only; they must agree with the reference paths there too, and the GPT-2
// runner and tokenizer must work (run from the repository root: it reads tests/data).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>
#include <mhsa/mhsa.h>
int main() {
  std::mt19937 gen(1); std::normal_distribution<float> n;
  int bad = 0;
  for (auto [Tq, Tk, D] : {std::array<int64_t,3>{1, 3000, 64}, {97, 97, 40}, {300, 300, 80}}) {
    mhsa::Tensor q({2, 4, Tq, D}), k({2, 2, Tk, D}), v({2, 2, Tk, D});
    for (auto* t : {&q, &k, &v}) for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = n(gen);
    mhsa::AttentionOptions fast; fast.causal = true;
    mhsa::AttentionOptions ref = fast; ref.backend = mhsa::Backend::reference;
    auto a = mhsa::scaled_dot_product_attention(q.view(), k.view(), v.view(), fast);
    auto b = mhsa::scaled_dot_product_attention(q.view(), k.view(), v.view(), ref);
    double num = 0, den = 0;
    for (int64_t i = 0; i < a.out.numel(); ++i) { num += std::pow(a.out.data()[i] - b.out.data()[i], 2); den += std::pow(b.out.data()[i], 2); }
    std::printf("Tq=%lld Tk=%lld D=%lld rel L2 %.3g\n", (long long)Tq, (long long)Tk, (long long)D, std::sqrt(num / den));
    bad += std::sqrt(num / den) > 1e-5;
  }
  mhsa::MultiHeadAttention m(96, 4); mhsa::Tensor x({1, 33, 96});
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = n(gen);
  mhsa::MhaOptions f, r; r.backend = mhsa::Backend::reference;
  auto y1 = m.forward(x.view(), f), y2 = m.forward(x.view(), r);
  double num = 0, den = 0;
  for (int64_t i = 0; i < y1.numel(); ++i) { num += std::pow(y1.data()[i] - y2.data()[i], 2); den += std::pow(y2.data()[i], 2); }
  std::printf("MHA rel L2 %.3g\n", std::sqrt(num / den));
  bad += std::sqrt(num / den) > 1e-5;
  // GPT-2 (LayerNorm, GELU, the Bᵀ stream, small-M GEMM): one token at a time equals the full forward.
  mhsa::Gpt2Config c; c.vocab_size = 97; c.n_positions = 32; c.n_embd = 48; c.n_layer = 2; c.n_head = 4; c.eos_token_id = -1;
  const mhsa::Gpt2 g = mhsa::Gpt2::random(c, 3);
  std::vector<int32_t> ids(40); for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(gen() % 97);
  const mhsa::Tensor full = g.forward(ids, 2, 20);
  mhsa::Gpt2Cache cache = g.new_cache(2, 20);
  num = den = 0;
  for (int64_t t = 0; t < 20; ++t) {
    const std::vector<int32_t> step = {ids[size_t(t)], ids[size_t(20 + t)]};
    const mhsa::Tensor l = g.extend(cache, step, 2, 1, false);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t v = 0; v < 97; ++v) {
        const double want = full.data()[(b * 20 + t) * 97 + v];
        num += std::pow(l.data()[b * 97 + v] - want, 2); den += want * want;
      }
  }
  std::printf("GPT-2 cached vs full rel L2 %.3g\n", std::sqrt(num / den));
  bad += std::sqrt(num / den) > 1e-5;
  // 16-bit weights (the B·Aᵀ streams widening f16 and bf16 B): a forward of 8 rows (register blocks
  // of 3 B rows against passes of 4 A rows) equals decoding one row at a time (2 B rows side by side).
  for (const mhsa::WeightType dtype : {mhsa::WeightType::f16, mhsa::WeightType::bf16}) {
    const mhsa::Model lm = mhsa::Model::random(mhsa::ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 97,
        "hidden_size": 48, "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 32, "tie_word_embeddings": false})"), 5, dtype);
    const std::vector<int32_t> eight(ids.begin(), ids.begin() + 8);
    const mhsa::Tensor all = lm.forward(eight, 1, 8);
    mhsa::ModelCache mc = lm.new_cache(1, 8);
    num = den = 0;
    for (int64_t t = 0; t < 8; ++t) {
      const mhsa::Tensor l = lm.extend(mc, std::span<const int32_t>(eight).subspan(size_t(t), 1), 1, 1, false);
      for (int64_t v = 0; v < 97; ++v) {
        const double want = all.data()[t * 97 + v];
        num += std::pow(l.data()[v] - want, 2); den += want * want;
      }
    }
    std::printf("%s: 8 rows vs one at a time rel L2 %.3g\n", std::string(mhsa::weight_type_name(dtype)).c_str(),
                std::sqrt(num / den));
    bad += !(std::sqrt(num / den) <= 1e-5);
  }
  // Training (transposed GEMMs, the cross-entropy head, AdamW): the gradient against a central
  // difference of the loss along it, then AdamW steps on one batch must fit it.
  {
    mhsa::Gpt2 t = mhsa::Gpt2::random(c, 4);
    std::vector<int32_t> x(ids.begin(), ids.end() - 1), y(ids.begin() + 1, ids.end());
    x.resize(38), y.resize(38);
    auto params = t.parameters();
    std::vector<mhsa::Tensor> grads = t.zero_gradients();
    const double loss0 = t.loss_and_gradients(x, y, 2, 19, grads);
    double norm = 0;
    for (const auto& gr : grads) for (int64_t i = 0; i < gr.numel(); ++i) norm += double(gr.data()[i]) * gr.data()[i];
    norm = std::sqrt(norm);
    const auto shifted = [&](double h) {  // loss at w + h·g/|g|
      for (size_t p = 0; p < params.size(); ++p)
        for (int64_t i = 0; i < grads[p].numel(); ++i) params[p].second->data()[i] += float(h * grads[p].data()[i] / norm);
      const double l = t.loss(x, y, 2, 19);
      for (size_t p = 0; p < params.size(); ++p)
        for (int64_t i = 0; i < grads[p].numel(); ++i) params[p].second->data()[i] -= float(h * grads[p].data()[i] / norm);
      return l;
    };
    const double h = 3e-3, slope = (shifted(h) - shifted(-h)) / (2 * h);
    std::printf("gradient norm %.5f, central difference along it %.5f\n", norm, slope);
    bad += std::abs(slope - norm) > 0.01 * norm;  // measured 0.07% on x86
    mhsa::AdamW adam(params);
    double loss = loss0;
    for (int step = 0; step < 30; ++step) {
      for (auto& gr : grads) std::fill(gr.data(), gr.data() + gr.numel(), 0.0f);
      loss = t.loss_and_gradients(x, y, 2, 19, grads);
      mhsa::clip_gradients(grads, 1.0);
      adam.step(params, grads, 1e-2f);
    }
    std::printf("training loss %.3f -> %.3f after 30 AdamW steps\n", loss0, loss);
    bad += !(loss < 0.5 * loss0);
  }
  const mhsa::Tokenizer tok = mhsa::Tokenizer::load_dir("tests/data/gpt2-tokenizer");
  const std::string text = "Hello world, it's caf\xc3\xa9 \xf0\x9f\x98\x80 \xff";
  const std::vector<int32_t> hello = tok.encode("Hello world");
  const bool tok_ok = tok.decode(tok.encode(text)) == text && hello == std::vector<int32_t>{15496, 995};
  std::printf("tokenizer %s\n", tok_ok ? "ok" : "WRONG");
  bad += !tok_ok;
  std::printf("%s\n", bad ? "FAILED" : "ok");
  return bad;
}
