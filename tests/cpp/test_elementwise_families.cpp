// tests/cpp/test_elementwise_families.cpp — the model families' row kernels (RMSNorm forward and
// backward, LayerNorm backward, SwiGLU/GeGLU forward and backward, logit soft-capping, rotary
// embedding and its tables): every usable ISA's fast kernel against its float64 twin on odd
// sizes, padded rows and in-place calls, and bitwise the same for 1, 2 and 3 threads.
// KernelsFromFile.Run is the C++ half of tests/python/test_kernels_torch.py, which compares these
// kernels with PyTorch and transformers: it runs every kernel on the inputs that test wrote and
// writes the results back (skipped unless MHSA_KERNEL_CASES names its file).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/elementwise.h"
#include "test_util.h"

namespace mhsa {
namespace {

using kernels::GluKind;
using kernels::KernelTable;
using Outputs = std::vector<std::vector<float>>;
// Runs one case with a table's fast kernel, or with the float64 twin when k is null, and returns
// every buffer the kernel may write (padding included: a write past a row shows up as a mismatch).
using Run = std::function<Outputs(const KernelTable* k)>;

std::vector<float> randn(std::mt19937_64& gen, int64_t n, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(gen);
  return v;
}

// Every output within `tol` (relative L2) of the twin's, on every ISA, and the same bits for any
// thread count (the sizes below are large enough for the kernels to go parallel).
void check(const std::string& what, const Run& run, double tol) {
  const Outputs ref = run(nullptr);
  const int saved = omp_get_max_threads();
  for (cpu::Isa isa : cpu::usable_isas()) {
    std::vector<Outputs> got;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      got.push_back(run(&kernels::kernels_for(isa)));
    }
    const std::string where = what + " [" + std::string(cpu::isa_name(isa)) + "]";
    for (size_t o = 0; o < ref.size(); ++o) {
      const std::vector<double> ref64(ref[o].begin(), ref[o].end());
      EXPECT_LE(test::rel_l2(got[0][o].data(), ref64), tol) << where << " output " << o;
      for (size_t t = 1; t < got.size(); ++t)
        EXPECT_EQ(0, std::memcmp(got[0][o].data(), got[t][o].data(), ref[o].size() * sizeof(float)))
            << where << " output " << o << ": 1 thread vs " << t + 1;
    }
  }
  omp_set_num_threads(saved);
}

struct Rows {
  int64_t rows, C, ld;  // ld ≥ C: padded rows
};
// No single-column case: with C = 1 a norm's backward is pure cancellation (LayerNorm's x̂ is 0,
// RMSNorm's dx is proportional to eps / (x² + eps)), and a single element's relative error says
// nothing of a kernel.
const std::vector<Rows> kRowCases = {{1, 5, 5},       {3, 7, 9},         {5, 64, 64},
                                     {2, 33, 40},     {301, 577, 600},   {129, 1000, 1003}};

std::string describe(const char* kernel, const Rows& c) {
  return std::string(kernel) + " rows=" + std::to_string(c.rows) + " C=" + std::to_string(c.C) +
         " ld=" + std::to_string(c.ld);
}

TEST(ElementwiseFamilies, RmsNormForward) {
  auto gen = test::test_rng();
  for (const Rows& c : kRowCases)
    for (float offset : {0.0f, 1.0f})
      for (bool in_place : {false, true}) {
        const auto x = randn(gen, c.rows * c.ld, 2.0f), w = randn(gen, c.C, 0.5f);
        const float eps = 1e-6f;
        check(describe("rms_norm", c) + (in_place ? " in place" : "") + " offset " + std::to_string(offset),
              [&](const KernelTable* k) {
                std::vector<float> y(in_place ? x : std::vector<float>(x.size(), 7.0f));
                const float* in = in_place ? y.data() : x.data();
                if (k)
                  k->rms_norm(c.rows, c.C, in, c.ld, w.data(), offset, eps, y.data(), c.ld);
                else
                  kernels::rms_norm_ref(c.rows, c.C, in, c.ld, w.data(), offset, eps, y.data(), c.ld);
                return Outputs{y};
              },
              2e-7);
      }
}

TEST(ElementwiseFamilies, RmsNormBackward) {
  auto gen = test::test_rng();
  for (const Rows& c : kRowCases)
    for (float offset : {0.0f, 1.0f})
      for (bool with_dw : {true, false}) {
        const auto x = randn(gen, c.rows * c.ld), w = randn(gen, c.C, 0.5f), dy = randn(gen, c.rows * c.ld);
        const auto dx0 = randn(gen, c.rows * c.ld), dw0 = randn(gen, c.C);  // both accumulate
        check(describe("rms_norm_backward", c) + (with_dw ? "" : " without dw"),
              [&](const KernelTable* k) {
                std::vector<float> dx = dx0, dw = dw0;
                float* dwp = with_dw ? dw.data() : nullptr;
                if (k)
                  k->rms_norm_backward(c.rows, c.C, x.data(), c.ld, w.data(), offset, 1e-5f, dy.data(), c.ld,
                                       dx.data(), c.ld, dwp);
                else
                  kernels::rms_norm_backward_ref(c.rows, c.C, x.data(), c.ld, w.data(), offset, 1e-5f, dy.data(),
                                                 c.ld, dx.data(), c.ld, dwp);
                return Outputs{dx, dw};
              },
              1e-6);
      }
}

TEST(ElementwiseFamilies, LayerNormBackward) {
  auto gen = test::test_rng();
  for (const Rows& c : kRowCases)
    for (bool with_params : {true, false}) {
      auto x = randn(gen, c.rows * c.ld);
      for (float& v : x) v += 3.0f;  // a mean far from 0: the centring matters
      const auto g = randn(gen, c.C, 0.5f), dy = randn(gen, c.rows * c.ld);
      const auto dx0 = randn(gen, c.rows * c.ld), dg0 = randn(gen, c.C), db0 = randn(gen, c.C);
      check(describe("layer_norm_backward", c) + (with_params ? "" : " without dgamma, dbeta"),
            [&](const KernelTable* k) {
              std::vector<float> dx = dx0, dg = dg0, db = db0;
              float* dgp = with_params ? dg.data() : nullptr;
              float* dbp = with_params ? db.data() : nullptr;
              if (k)
                k->layer_norm_backward(c.rows, c.C, x.data(), c.ld, g.data(), 1e-5f, dy.data(), c.ld, dx.data(), c.ld,
                                       dgp, dbp);
              else
                kernels::layer_norm_backward_ref(c.rows, c.C, x.data(), c.ld, g.data(), 1e-5f, dy.data(), c.ld,
                                                 dx.data(), c.ld, dgp, dbp);
              return Outputs{dx, dg, db};
            },
            4e-6);  // dx is a difference of float32 sums over centred values (mean 3): a 5-value row
                    // measured 2.2e-6 (MHSA_TEST_SEED=234384200); a wrong formula is off by > 1e-3
    }
}

// gate and up as the two halves of one fused row [gate | up | pad], and out written over gate
// (in place) or into its own padded buffer.
TEST(ElementwiseFamilies, GatedActivations) {
  auto gen = test::test_rng();
  for (GluKind kind : {GluKind::swiglu, GluKind::geglu})
    for (const Rows& c : kRowCases)
      for (bool in_place : {false, true}) {
        const int64_t ld = 2 * c.C + (c.ld - c.C);
        const auto fused = randn(gen, c.rows * ld, 3.0f), dout = randn(gen, c.rows * c.ld);
        const std::string name = describe(kind == GluKind::swiglu ? "swiglu" : "geglu", c) +
                                 (in_place ? " in place" : "");
        check(name, [&](const KernelTable* k) {
          std::vector<float> buf = fused, out(static_cast<size_t>(c.rows * c.ld), 7.0f);
          float* o = in_place ? buf.data() : out.data();
          const int64_t ldo = in_place ? ld : c.ld;
          if (k)
            k->glu(kind, c.rows, c.C, buf.data(), ld, buf.data() + c.C, ld, o, ldo);
          else
            kernels::glu_ref(kind, c.rows, c.C, buf.data(), ld, buf.data() + c.C, ld, o, ldo);
          return Outputs{buf, out};
        }, 1e-6);  // a few float32 roundings of exp and one division per value: ~8 ulp on 5 values
        check(name + " backward", [&](const KernelTable* k) {
          std::vector<float> buf = fused, grads(static_cast<size_t>(c.rows * ld), 7.0f);
          float* dg = in_place ? buf.data() : grads.data();  // in place: d gate over gate, d up over up
          if (k)
            k->glu_backward(kind, c.rows, c.C, buf.data(), ld, buf.data() + c.C, ld, dout.data(), c.ld, dg, ld,
                            dg + c.C, ld);
          else
            kernels::glu_backward_ref(kind, c.rows, c.C, buf.data(), ld, buf.data() + c.C, ld, dout.data(), c.ld, dg,
                                      ld, dg + c.C, ld);
          return Outputs{buf, grads};
        }, 2e-6);
      }
}

TEST(ElementwiseFamilies, Softcap) {
  auto gen = test::test_rng();
  for (const Rows& c : kRowCases)
    for (float cap : {30.0f, 0.7f})
      for (float spread : {0.05f, 5.0f}) {  // x / cap from 0.002 (the series) to ~7 (nearly saturated)
        const auto x = randn(gen, c.rows * c.ld, spread), dy0 = randn(gen, c.rows * c.ld);
        const std::string name = describe("softcap", c) + " cap " + std::to_string(cap) + " spread " +
                                 std::to_string(spread);
        check(name, [&](const KernelTable* k) {
          std::vector<float> y(x.size(), 7.0f);
          if (k)
            k->softcap(c.rows, c.C, x.data(), c.ld, cap, y.data(), c.ld);
          else
            kernels::softcap_ref(c.rows, c.C, x.data(), c.ld, cap, y.data(), c.ld);
          return Outputs{y};
        }, 3e-7);
        // sech²(u) at u = x / cap: a relative error δ in u (x / cap rounded: up to 2⁻²³) moves it by
        // 2·|u·tanh u|·δ relative, which the float64 twin (u exact) does not have; at |u| ~ 10 that
        // alone is ~2e-6. So the bound grows with the largest |u| of the case.
        double u_max = 0;
        for (float v : x) u_max = std::max(u_max, std::abs(double{v}) / cap);
        check(name + " backward", [&](const KernelTable* k) {
          std::vector<float> dy = dy0;
          if (k)
            k->softcap_backward(c.rows, c.C, x.data(), c.ld, cap, dy.data(), c.ld);
          else
            kernels::softcap_backward_ref(c.rows, c.C, x.data(), c.ld, cap, dy.data(), c.ld);
          return Outputs{dy};
        }, 5e-7 + 2 * u_max * 0x1p-23);
      }
}

struct RopeCase {
  int64_t rows, heads, head_dim, rotary_dim, ld;
};

TEST(ElementwiseFamilies, Rope) {
  auto gen = test::test_rng();
  const std::vector<RopeCase> cases = {{1, 1, 2, 2, 2},       {3, 2, 64, 64, 130},   {7, 3, 40, 20, 125},
                                       {5, 9, 64, 64, 576},    {2, 4, 128, 96, 600}, {300, 12, 64, 64, 12 * 64},
                                       {97, 5, 80, 80, 500}};
  for (const RopeCase& c : cases) {
    const int64_t positions_in_table = 1000;
    const auto inv_freq = kernels::rope_inv_freq(c.rotary_dim, 10000.0, RopeScaling{});
    std::vector<float> table(static_cast<size_t>(positions_in_table * c.rotary_dim));
    kernels::rope_table(inv_freq, 0, positions_in_table, table.data());
    std::vector<int64_t> pos(static_cast<size_t>(c.rows));
    std::uniform_int_distribution<int64_t> any(0, positions_in_table - 1);
    for (int64_t& p : pos) p = any(gen);  // per-row positions, as a batch of sequences has them
    const auto x = randn(gen, c.rows * c.ld);
    for (bool backward : {false, true}) {
      const std::string name = "rope rows=" + std::to_string(c.rows) + " heads=" + std::to_string(c.heads) +
                               " D=" + std::to_string(c.head_dim) + " rotary=" + std::to_string(c.rotary_dim) +
                               (backward ? " backward" : "");
      check(name, [&](const KernelTable* k) {
        std::vector<float> y = x;
        if (k)
          k->rope(c.rows, c.heads, c.head_dim, c.rotary_dim, y.data(), c.ld, pos.data(), table.data(), backward);
        else
          kernels::rope_ref(c.rows, c.heads, c.head_dim, c.rotary_dim, y.data(), c.ld, pos.data(), table.data(),
                            backward);
        return Outputs{y};
      }, 2e-7);
    }
    // The backward is the forward's transpose: rotating forth and back returns x.
    std::vector<float> y = x;
    const auto& k = kernels::kernels();
    k.rope(c.rows, c.heads, c.head_dim, c.rotary_dim, y.data(), c.ld, pos.data(), table.data(), false);
    k.rope(c.rows, c.heads, c.head_dim, c.rotary_dim, y.data(), c.ld, pos.data(), table.data(), true);
    const std::vector<double> x64(x.begin(), x.end());
    EXPECT_LE(test::rel_l2(y.data(), x64), 3e-7) << "rope forward then backward";
  }
}

// The float32 inverse frequencies (transformers' arithmetic) against the same formulas in float64
// (the float32 exponent 2i/dim alone is off by up to ln θ·2⁻²⁵ relative),
// for the default, "linear" and "llama3" (Llama 3.1/3.2's parameters) scalings; and the table's
// rows against cos/sin of the float32 angle.
TEST(ElementwiseFamilies, RopeTables) {
  RopeScaling linear;
  linear.kind = RopeScalingKind::linear;
  linear.factor = 4.0;
  RopeScaling llama3;
  llama3.kind = RopeScalingKind::llama3;
  llama3.factor = 32.0;
  llama3.original_max_position_embeddings = 8192;
  for (const RopeScaling& s : {RopeScaling{}, linear, llama3})
    for (int64_t dim : {2, 32, 64, 100, 128})
      for (double theta : {10000.0, 500000.0}) {
        const auto f = kernels::rope_inv_freq(dim, theta, s);
        const auto f64 = kernels::rope_inv_freq_ref(dim, theta, s);
        ASSERT_EQ(f.size(), static_cast<size_t>(dim / 2));
        for (size_t i = 0; i < f.size(); ++i)
          EXPECT_NEAR(f[i], f64[i], 1e-5 * f64[i]) << "dim " << dim << " theta " << theta << " i " << i;
        std::vector<float> table(static_cast<size_t>(3 * dim));
        kernels::rope_table(f, 4094, 3, table.data());  // rows for positions 4094, 4095, 4096
        for (int64_t p = 0; p < 3; ++p)
          for (int64_t i = 0; i < dim / 2; ++i) {
            const double angle = static_cast<float>(4094 + p) * f[static_cast<size_t>(i)];
            EXPECT_EQ(table[static_cast<size_t>(p * dim + i)], static_cast<float>(std::cos(angle)));
            EXPECT_EQ(table[static_cast<size_t>(p * dim + dim / 2 + i)], static_cast<float>(std::sin(angle)));
          }
      }
  // llama3 keeps the highest frequency and divides the lowest by factor.
  const auto plain = kernels::rope_inv_freq(64, 500000.0, RopeScaling{});
  const auto scaled = kernels::rope_inv_freq(64, 500000.0, llama3);
  EXPECT_EQ(plain.front(), scaled.front());
  EXPECT_FLOAT_EQ(plain.back() / 32.0f, scaled.back());
}

// Inputs (safetensors, float32) at $MHSA_KERNEL_CASES, scalars in its metadata; results to
// $MHSA_KERNEL_RESULTS as "<isa>.<output>" for every usable ISA, plus the rotary tables.
TEST(KernelsFromFile, Run) {
  const char* cases = std::getenv("MHSA_KERNEL_CASES");
  const char* results = std::getenv("MHSA_KERNEL_RESULTS");
  if (!cases || !results) GTEST_SKIP() << "run by tests/python/test_kernels_torch.py";
  const SafeTensors in = SafeTensors::open(cases);
  const auto scalar = [&](const std::string& key) { return std::stod(in.metadata().at(key)); };
  std::map<std::string, Tensor> out;
  const auto zeros_like = [](const Tensor& t) {
    Tensor z(t.shape());
    std::fill(z.data(), z.data() + z.numel(), 0.0f);
    return z;
  };

  const Tensor rx = in.load("rms.x"), rw = in.load("rms.w"), rdy = in.load("rms.dy");
  const Tensor lx = in.load("ln.x"), lg = in.load("ln.g"), ldy = in.load("ln.dy");
  const Tensor gate = in.load("glu.gate"), up = in.load("glu.up"), gdo = in.load("glu.dout");
  const Tensor sx = in.load("softcap.x"), sdy = in.load("softcap.dy");
  const Tensor qx = in.load("rope.x"), qdy = in.load("rope.dy"), qpos = in.load("rope.pos");
  const int64_t R = rx.dim(0), C = rx.dim(1), F = gate.dim(1), rows = qx.dim(0), heads = qx.dim(1), D = qx.dim(2);

  RopeScaling scaling;
  const std::string kind = in.metadata().at("rope.scaling");
  scaling.kind = kind == "linear" ? RopeScalingKind::linear : kind == "llama3" ? RopeScalingKind::llama3
                                                                              : RopeScalingKind::none;
  scaling.factor = scalar("rope.factor");
  scaling.low_freq_factor = scalar("rope.low_freq_factor");
  scaling.high_freq_factor = scalar("rope.high_freq_factor");
  scaling.original_max_position_embeddings = static_cast<int64_t>(scalar("rope.original_max_position_embeddings"));
  const int64_t rotary_dim = static_cast<int64_t>(scalar("rope.rotary_dim"));
  const auto inv_freq = kernels::rope_inv_freq(rotary_dim, scalar("rope.theta"), scaling);
  std::vector<int64_t> pos(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) pos[static_cast<size_t>(r)] = static_cast<int64_t>(qpos.data()[r]);
  const int64_t positions = *std::max_element(pos.begin(), pos.end()) + 1;
  Tensor table({positions, rotary_dim}), freq({rotary_dim / 2});
  kernels::rope_table(inv_freq, 0, positions, table.data());
  std::copy(inv_freq.begin(), inv_freq.end(), freq.data());
  out["rope.inv_freq"] = freq;
  out["rope.table"] = table;

  for (cpu::Isa isa : cpu::usable_isas()) {
    const KernelTable& k = kernels::kernels_for(isa);
    const std::string p = std::string(cpu::isa_name(isa)) + ".";
    Tensor y = zeros_like(rx), dx = zeros_like(rx), dw = zeros_like(rw);
    k.rms_norm(R, C, rx.data(), C, rw.data(), float(scalar("rms.offset")), float(scalar("rms.eps")), y.data(), C);
    k.rms_norm_backward(R, C, rx.data(), C, rw.data(), float(scalar("rms.offset")), float(scalar("rms.eps")),
                        rdy.data(), C, dx.data(), C, dw.data());
    out[p + "rms.y"] = y, out[p + "rms.dx"] = dx, out[p + "rms.dw"] = dw;

    Tensor ldx = zeros_like(lx), ldg = zeros_like(lg), ldb = zeros_like(lg);
    k.layer_norm_backward(lx.dim(0), lx.dim(1), lx.data(), lx.dim(1), lg.data(), float(scalar("ln.eps")), ldy.data(),
                          lx.dim(1), ldx.data(), lx.dim(1), ldg.data(), ldb.data());
    out[p + "ln.dx"] = ldx, out[p + "ln.dg"] = ldg, out[p + "ln.db"] = ldb;

    for (GluKind g : {GluKind::swiglu, GluKind::geglu}) {
      const std::string name = p + (g == GluKind::swiglu ? "swiglu." : "geglu.");
      Tensor o = zeros_like(gate), dg = zeros_like(gate), du = zeros_like(gate);
      k.glu(g, gate.dim(0), F, gate.data(), F, up.data(), F, o.data(), F);
      k.glu_backward(g, gate.dim(0), F, gate.data(), F, up.data(), F, gdo.data(), F, dg.data(), F, du.data(), F);
      out[name + "out"] = o, out[name + "dgate"] = dg, out[name + "dup"] = du;
    }

    const float cap = float(scalar("softcap.cap"));
    Tensor sy = zeros_like(sx), sdx = sdy;
    k.softcap(sx.dim(0), sx.dim(1), sx.data(), sx.dim(1), cap, sy.data(), sx.dim(1));
    k.softcap_backward(sx.dim(0), sx.dim(1), sx.data(), sx.dim(1), cap, sdx.data(), sx.dim(1));
    out[p + "softcap.y"] = sy, out[p + "softcap.dx"] = sdx;

    Tensor qy = qx, qdx = qdy;
    k.rope(rows, heads, D, rotary_dim, qy.data(), heads * D, pos.data(), table.data(), false);
    k.rope(rows, heads, D, rotary_dim, qdx.data(), heads * D, pos.data(), table.data(), true);
    out[p + "rope.y"] = qy, out[p + "rope.dx"] = qdx;
  }
  std::vector<std::pair<std::string, ConstTensorView>> views;
  for (const auto& [name, t] : out) views.emplace_back(name, t.view());
  save_safetensors(results, views);
}

}  // namespace
}  // namespace mhsa
