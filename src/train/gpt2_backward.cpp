// train/gpt2_backward.cpp — GPT-2's training pass (see Gpt2::loss_and_gradients in gpt2.h):
// a forward that records what backward needs, the loss through a fused softmax cross-entropy
// over blocks of rows (the [rows, V] logits never exist whole), and backward through the head,
// ln_f, every block (MLP, GELU, LayerNorms, attention through MultiHeadAttention::backward) and
// the embeddings. Sums that cross rows (LayerNorm and bias gradients, embedding rows) run in a
// fixed order in float64, so results do not depend on the thread count.
#include <cmath>
#include <string>
#include <vector>

#include "core/check.h"
#include "kernels/dispatch.h"
#include "mhsa/gpt2.h"
#include "nn/linear.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::message;

constexpr int64_t kLossRows = 256;  // rows of logits alive at once: kLossRows × V floats

// dx += ∂/∂x, dg += Σ dy·x̂, db += Σ dy   (x̂ = (x − mean)·rstd) for y = LayerNorm(x) as the
// forward's kernel computes it; the row statistics are recomputed here in float64 (two passes over
// a row cost less than keeping them), and the sums over rows run in row order.
void layer_norm_backward(int64_t rows, int64_t C, const float* x, const Tensor& g, float eps, const float* dy,
                         float* dx, Tensor& dg, Tensor& db) {
  std::vector<double> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static) if (rows * C >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    double m = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    const double rs = 1.0 / std::sqrt(var / static_cast<double>(C) + eps);
    mean[static_cast<size_t>(r)] = m;
    rstd[static_cast<size_t>(r)] = rs;
    double a = 0, b = 0;  // mean of dx̂ and of dx̂·x̂
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xr[c] - m) * rs, dxhat = double(dy[r * C + c]) * g.data()[c];
      a += dxhat;
      b += dxhat * xhat;
    }
    a /= static_cast<double>(C);
    b /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xr[c] - m) * rs, dxhat = double(dy[r * C + c]) * g.data()[c];
      dx[r * C + c] += static_cast<float>(rs * (dxhat - a - xhat * b));
    }
  }
  std::vector<double> sg(static_cast<size_t>(C), 0.0), sb(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double m = mean[static_cast<size_t>(r)], rs = rstd[static_cast<size_t>(r)];
    for (int64_t c = 0; c < C; ++c) {
      sg[static_cast<size_t>(c)] += double(dy[r * C + c]) * (x[r * C + c] - m) * rs;
      sb[static_cast<size_t>(c)] += dy[r * C + c];
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    dg.data()[c] += static_cast<float>(sg[static_cast<size_t>(c)]);
    db.data()[c] += static_cast<float>(sb[static_cast<size_t>(c)]);
  }
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

// ---- parameters ----------------------------------------------------------------------------

std::vector<std::pair<std::string, const Tensor*>> Gpt2::parameters() const {
  std::vector<std::pair<std::string, const Tensor*>> p = {{"wte.weight", &wte_}, {"wpe.weight", &wpe_}};
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    const std::string h = message("h.", l, ".");
    p.insert(p.end(), {{h + "ln_1.weight", &b.ln1_g},
                       {h + "ln_1.bias", &b.ln1_b},
                       {h + "attn.c_attn.weight", &b.attn.parameter("w_qkv")},
                       {h + "attn.c_attn.bias", &b.attn.parameter("b_qkv")},
                       {h + "attn.c_proj.weight", &b.attn.parameter("w_o")},
                       {h + "attn.c_proj.bias", &b.attn.parameter("b_o")},
                       {h + "ln_2.weight", &b.ln2_g},
                       {h + "ln_2.bias", &b.ln2_b},
                       {h + "mlp.c_fc.weight", &b.fc_w},
                       {h + "mlp.c_fc.bias", &b.fc_b},
                       {h + "mlp.c_proj.weight", &b.proj_w},
                       {h + "mlp.c_proj.bias", &b.proj_b}});
  }
  p.emplace_back("ln_f.weight", &lnf_g_);
  p.emplace_back("ln_f.bias", &lnf_b_);
  if (lm_head_.defined()) p.emplace_back("lm_head.weight", &lm_head_);
  return p;
}

std::vector<std::pair<std::string, Tensor*>> Gpt2::parameters() {
  std::vector<std::pair<std::string, Tensor*>> p;
  for (const auto& [name, t] : static_cast<const Gpt2&>(*this).parameters())
    p.emplace_back(name, const_cast<Tensor*>(t));  // the object itself is not const
  return p;
}

std::vector<Tensor> Gpt2::zero_gradients() const {
  std::vector<Tensor> g;
  for (const auto& [name, t] : parameters()) g.emplace_back(t->shape());
  return g;
}

// ---- loss and gradients ----------------------------------------------------------------------

double Gpt2::loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const {
  std::vector<Tensor> none;
  return loss_and_gradients(ids, targets, B, T, none);
}

// grads empty: the loss only (no tape, no backward).
double Gpt2::loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                                std::vector<Tensor>& grads) const {
  constexpr std::string_view fn = "Gpt2::loss_and_gradients";
  const int64_t C = config_.n_embd, V = config_.vocab_size, F = config_.mlp_dim();
  const float eps = config_.layer_norm_epsilon;
  const bool backward = !grads.empty();
  if (B <= 0 || T <= 0 || T > config_.n_positions)
    fail(fn, "ids", message("a batch [B, T] with 1 <= T <= n_positions = ", config_.n_positions),
         message("[", B, ", ", T, "]"));
  const int64_t rows = detail::checked_count(message(fn, ": ids [B, T]"), {B, T}, sizeof(int32_t));
  if (static_cast<int64_t>(ids.size()) != rows || static_cast<int64_t>(targets.size()) != rows)
    fail(fn, "ids, targets", message(rows, " ids each (B·T)"), message(ids.size(), " and ", targets.size()));
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)], t = targets[static_cast<size_t>(i)];
    if (id < 0 || id >= V) fail(fn, message("ids[", i / T, ", ", i % T, "]"), message("a token id in [0, ", V, ")"), std::to_string(id));
    if (t < -1 || t >= V)
      fail(fn, message("targets[", i / T, ", ", i % T, "]"), message("a token id in [0, ", V, ") or -1 (ignored)"),
           std::to_string(t));
    counted += t >= 0;
  }
  const auto params = parameters();
  if (backward) {
    if (grads.size() != params.size())
      fail(fn, "grads", message(params.size(), " tensors (zero_gradients())"), std::to_string(grads.size()));
    for (size_t i = 0; i < params.size(); ++i)
      if (grads[i].shape() != params[i].second->shape())
        fail(fn, message("grads[", i, "]"), "the shape of " + params[i].first, "another shape");
  }
  if (counted == 0) return 0.0;
  const kernels::KernelTable& k = kernels::kernels();

  // Forward, recording each block's inputs and intermediate values.
  struct Saved {
    Tensor x_in, h1, x_mid, h2, z, u;
    MhaTape tape;
  };
  std::vector<Saved> saved(blocks_.size());
  Tensor x({B, T, C});
  for (int64_t r = 0; r < rows; ++r) {
    const float* te = wte_.data() + ids[static_cast<size_t>(r)] * C;
    const float* pe = wpe_.data() + (r % T) * C;
    for (int64_t c = 0; c < C; ++c) x.data()[r * C + c] = te[c] + pe[c];
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    Saved& s = saved[l];
    s.x_in = x;
    s.h1 = Tensor({B, T, C});
    k.layer_norm(rows, C, x.data(), C, b.ln1_g.data(), b.ln1_b.data(), eps, s.h1.data(), C);
    MhaOptions opt;
    opt.causal = true;
    if (backward) opt.tape = &s.tape;
    const Tensor a = b.attn.forward(s.h1.view(), opt);
    add_into(x.data(), a.data(), rows * C);
    s.x_mid = x;
    s.h2 = Tensor({B, T, C});
    k.layer_norm(rows, C, x.data(), C, b.ln2_g.data(), b.ln2_b.data(), eps, s.h2.data(), C);
    s.z = Tensor({rows, F});
    k.gemm(rows, F, C, s.h2.data(), C, b.fc_w.data(), F, b.fc_b.data(), s.z.data(), F);
    s.u = s.z;
    k.gelu_tanh(rows * F, s.u.data());
    Tensor y({rows, C});
    k.gemm(rows, C, F, s.u.data(), F, b.proj_w.data(), C, b.proj_b.data(), y.data(), C);
    add_into(x.data(), y.data(), rows * C);
    if (!backward) s = Saved();  // nothing to keep
  }
  Tensor hf({rows, C});
  k.layer_norm(rows, C, x.data(), C, lnf_g_.data(), lnf_b_.data(), eps, hf.data(), C);

  // Fused softmax cross-entropy, a block of rows at a time: logits, loss, dlogits, dhf, dW.
  const Tensor& w = output_matrix();  // [V, C]
  const Tensor wt = nn::transposed(w.data(), V, C, C);  // [C, V]
  Tensor dhf = backward ? Tensor({rows, C}) : Tensor();
  Tensor& dw = backward ? grads[lm_head_.defined() ? grads.size() - 1 : 0] : dhf;  // wte.weight is first
  Tensor no_bias;
  double total = 0;
  const double inv = 1.0 / static_cast<double>(counted);
  std::vector<double> row_loss(static_cast<size_t>(std::min(kLossRows, rows)));
  for (int64_t r0 = 0; r0 < rows; r0 += kLossRows) {
    const int64_t R = std::min(kLossRows, rows - r0);
    Tensor logits({R, V});
    k.gemm(R, V, C, hf.data() + r0 * C, C, wt.data(), V, nullptr, logits.data(), V);
    k.softmax_cross_entropy(R, V, logits.data(), V, targets.data() + r0, static_cast<float>(inv), row_loss.data());
    for (int64_t r = 0; r < R; ++r) total += row_loss[static_cast<size_t>(r)];  // rows in order
    if (!backward) continue;
    k.gemm(R, C, V, logits.data(), V, w.data(), C, nullptr, dhf.data() + r0 * C, C);
    nn::add_weight_grads(logits.data(), R, V, hf.data() + r0 * C, C, dw, 0, no_bias);
  }
  if (!backward) return total * inv;

  // Backward: ln_f, then the blocks in reverse, then the embeddings.
  const auto grad = [&](const std::string& name) -> Tensor& {
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].first == name) return grads[i];
    fail(fn, "grads", "a gradient for " + name, "none");
  };
  Tensor dx({B, T, C});
  layer_norm_backward(rows, C, x.data(), lnf_g_, eps, dhf.data(), dx.data(), grad("ln_f.weight"), grad("ln_f.bias"));
  for (size_t l = blocks_.size(); l-- > 0;) {
    const Block& b = blocks_[l];
    Saved& s = saved[l];
    const std::string h = message("h.", l, ".");
    // MLP: x_out = x_mid + gelu(h2·fc_w + fc_b)·proj_w + proj_b
    nn::add_weight_grads(s.u.data(), rows, F, dx.data(), C, grad(h + "mlp.c_proj.weight"), 0, grad(h + "mlp.c_proj.bias"));
    Tensor du = nn::times_transposed(dx.data(), 1, rows, C, b.proj_w, 0);  // [1, rows, F]
    k.gelu_tanh_backward(rows * F, s.z.data(), du.data(), du.data());
    nn::add_weight_grads(s.h2.data(), rows, C, du.data(), F, grad(h + "mlp.c_fc.weight"), 0, grad(h + "mlp.c_fc.bias"));
    const Tensor dh2 = nn::times_transposed(du.data(), 1, rows, F, b.fc_w, 0);  // [1, rows, C]
    layer_norm_backward(rows, C, s.x_mid.data(), b.ln2_g, eps, dh2.data(), dx.data(), grad(h + "ln_2.weight"),
                        grad(h + "ln_2.bias"));
    // Attention: x_mid = x_in + attn(h1)
    MhaGradients mg{std::move(grad(h + "attn.c_attn.weight")), std::move(grad(h + "attn.c_attn.bias")),
                    std::move(grad(h + "attn.c_proj.weight")), std::move(grad(h + "attn.c_proj.bias"))};
    const MhaInputGradients in = b.attn.backward(s.tape, dx.view(), mg);
    grad(h + "attn.c_attn.weight") = std::move(mg.w_qkv);
    grad(h + "attn.c_attn.bias") = std::move(mg.b_qkv);
    grad(h + "attn.c_proj.weight") = std::move(mg.w_o);
    grad(h + "attn.c_proj.bias") = std::move(mg.b_o);
    layer_norm_backward(rows, C, s.x_in.data(), b.ln1_g, eps, in.dx.data(), dx.data(), grad(h + "ln_1.weight"),
                        grad(h + "ln_1.bias"));
    s = Saved();  // free this block's activations as soon as they are used
  }
  Tensor& dwte = grad("wte.weight");
  Tensor& dwpe = grad("wpe.weight");
  for (int64_t r = 0; r < rows; ++r) {  // rows in order: the same sums for any thread count
    const float* d = dx.data() + r * C;
    add_into(dwte.data() + ids[static_cast<size_t>(r)] * C, d, C);
    add_into(dwpe.data() + (r % T) * C, d, C);
  }
  return total * inv;
}

}  // namespace mhsa
