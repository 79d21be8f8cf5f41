// The paper's "Unit Test Coverage" table (wiola-paper.tex, Table tab:tests:
// 22 tests over eight components), rewritten against this implementation's
// API (ops, layer_forward, Model) with assertions that fail on a wrong
// implementation: hand computations of the docs/model.md §2 formulas, exact
// invariances, and the cached-decoding and parameter-count contracts.
//
//   WiolaRMSNorm 3  PaperRMSNorm.{Shape, DeltaEffect, NoNaN}
//   SRPE 3          PaperSRPE.{Shape, PositionSensitivity, Offset}
//   GCLA 3          PaperGCLA.{Shape, KvGrowth, CtxBlendChange}
//   DSFF 2          PaperDSFF.{Shape, StreamIndependence}
//   ATM 2           PaperATM.{MergeUnmergeRoundtrip, ShortSeq}
//   DecoderLayer 2  PaperDecoderLayer.{Forward, MidLayerAtmFlag}
//   WiolaModel 3    PaperModel.{Shape, KvCache, IncrementalMatch}
//   CausalLM 4      PaperCausalLM.{Loss, Logits, Generation, ParamCount}
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "tests/model/backend_under_test.h"
#include "model/atm.h"
#include "model/config.h"
#include "model/layer.h"
#include "model/model.h"
#include "model/params.h"
#include "model/srpe.h"
#include "util/error.h"

namespace wiola {
namespace {

// ---- helpers -------------------------------------------------------------------

// wiola-tiny (d=64, L=6, H=4, Hkv=2, dh=16, dA=64, dB=256) with a small
// vocabulary and window.
ModelConfig tiny_cfg(int V = 64, int Tn = 16) {
  ModelConfig c = model_preset("wiola-tiny");
  c.V = V;
  c.T = Tn;
  return c;
}

std::vector<double> randn(size_t n, uint64_t seed, double sd = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> dist(0.0, sd);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(g);
  return v;
}

std::vector<int32_t> rand_tokens(size_t n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(g);
  return v;
}

template <class T>
std::vector<T> down(Ops<T>& ops, CPtr p, size_t n) {
  std::vector<T> h(n);
  ops.download(h.data(), p.as<T>(), n * sizeof(T));
  return h;
}

template <class T>
Buffer<T> up(Ops<T>& ops, const std::vector<T>& h) {
  Buffer<T> b(ops, h.size());
  ops.upload(b.data(), h.data(), h.size() * sizeof(T));
  return b;
}

// Index arrays (int32) in backend memory.
template <class T>
Buffer<T, int32_t> up_idx(Ops<T>& ops, const std::vector<int32_t>& h) {
  Buffer<T, int32_t> b(ops, h.size());
  ops.upload(b.data(), h.data(), h.size() * sizeof(int32_t));
  return b;
}

template <class A, class B>
double max_abs_diff(const A& a, const B& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

template <class A>
bool all_finite(const A& a) {
  for (const auto& x : a)
    if (!std::isfinite(double(x))) return false;
  return true;
}

template <class T>
std::vector<T> get_param(Model<T>& m, Ops<T>& ops, const std::string& name) {
  const ParamEntry& e = m.layout().find(name);
  return down(ops, m.params() + e.offset, e.size());
}

template <class T>
void set_param(Model<T>& m, Ops<T>& ops, const std::string& name,
               const std::vector<T>& v) {
  const ParamEntry& e = m.layout().find(name);
  ASSERT_EQ(v.size(), e.size()) << name;
  ops.upload(m.params() + e.offset, v.data(), v.size() * sizeof(T));
  m.refresh_weights();  // master changed: the weight copy GEMMs read follows
}

template <class T>
void set_phi_all(Model<T>& m, Ops<T>& ops, double phi) {
  for (int l = 0; l < m.config().L; ++l)
    set_param(m, ops, layer_param_name(l, "self_attn.ctx_gate_logit"), {T(phi)});
}

// y[N, out] = x[N, in] W[out, in]^T in double.
std::vector<double> matmul_t(const std::vector<double>& x, const double* W,
                             int N, int in, int out, int ldw) {
  std::vector<double> y(size_t(N) * out, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < in; ++i) s += x[size_t(n) * in + i] * W[size_t(o) * ldw + i];
      y[size_t(n) * out + o] = s;
    }
  return y;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// docs/model.md §2 WiolaRMSNorm of one row, by hand.
std::vector<double> rms_ref(const double* x, const double* g, const double* dl,
                            int d, double eps, double* rstd = nullptr) {
  double ss = 0;
  for (int j = 0; j < d; ++j) ss += (x[j] + dl[j]) * (x[j] + dl[j]);
  const double r = 1.0 / std::sqrt(ss / d + eps);
  if (rstd) *rstd = r;
  std::vector<double> y(static_cast<size_t>(d));
  for (int j = 0; j < d; ++j) y[size_t(j)] = g[j] * (x[j] + dl[j]) * r;
  return y;
}

// One layer in double with the parameters of a Model (init std 0.02),
// driven through layer_forward directly.
struct LayerHarness {
  LayerHarness(const ModelConfig& c, int batch, uint64_t seed = 7)
      : ops(test_backend<double>()), cfg(c), B(batch), Tn(c.T),
        ld(c, ModelShard{}),
        model(*ops, c, ModelShard{}, nullptr, ModelOptions{batch, false, false}) {
    model.init(seed);
    srpe = up(*ops, srpe_table<double>(cfg, 0, Tn));
    proj = Buffer<double>(*ops, size_t(B) * Tn * size_t(qkvg_width(ld)));
  }
  // A LayerCtx with possibly different tau / atm flag (the model's
  // parameters do not depend on them).
  LayerCtx<double> ctx(const ModelConfig& c) const {
    return LayerCtx<double>{*ops, c, ld, nullptr, B, Tn, srpe.data(), ops->precision(), proj.data()};
  }
  size_t Nd() const { return size_t(B) * Tn * cfg.d; }
  const LayerParams& lp(int l) const { return model.p().layers[size_t(l)]; }

  std::unique_ptr<Ops<double>> ops;
  ModelConfig cfg;
  int B, Tn;
  LocalDims ld;
  Model<double> model;
  Buffer<double> srpe;
  mutable Buffer<double> proj;  // LayerCtx::proj (scratch, written through a const harness)
};

// Runs layer l; checks that nothing past the [N, d] output is written.
std::vector<double> run_layer(LayerHarness& h, const LayerCtx<double>& c, int l,
                              const std::vector<double>& x,
                              const std::vector<std::vector<double>>& ctx,
                              bool training, LayerActs<double>& a) {
  Ops<double>& ops = *h.ops;
  const size_t nd = h.Nd(), guard = 16;
  EXPECT_EQ(x.size(), nd);
  Buffer<double> bx = up(ops, x);
  std::vector<Buffer<double>> bc;
  for (const auto& v : ctx) bc.push_back(up(ops, v));
  std::vector<CPtr> pc;
  for (const auto& b : bc) pc.push_back(b.data());
  std::vector<double> init(nd + guard, 4242.0);
  Buffer<double> out = up(ops, init);
  layer_forward(c, l, h.lp(l), bx.data(), pc.data(), int(pc.size()), training, a,
                out.data());
  std::vector<double> y = down(ops, out.data(), nd + guard);
  for (size_t i = nd; i < nd + guard; ++i)
    EXPECT_EQ(y[i], 4242.0) << "layer_forward wrote past [N, d] at " << i;
  y.resize(nd);
  return y;
}

// ===================================================================================
// WiolaRMSNorm (3): Shape; delta effect; no NaN
// ===================================================================================

TEST(PaperRMSNorm, Shape) {
  auto ops = test_backend<double>();
  const int N = 3, d = 8;
  const double eps = 1e-6;
  const auto x = randn(size_t(N) * d, 1);
  auto g = randn(size_t(d), 2, 0.1);
  for (auto& v : g) v += 1.0;
  const auto dl = randn(size_t(d), 3, 0.1);
  auto bx = up(*ops, x), bg = up(*ops, g), bd = up(*ops, dl);
  // Guard cells after y [N, d] and rstd [N].
  auto by = up(*ops, std::vector<double>(size_t(N) * d + 8, -7.0));
  auto br = up(*ops, std::vector<double>(size_t(N) + 4, -7.0));
  ops->rmsnorm_fwd(bx.data(), bg.data(), bd.data(), N, d, eps, by.data(), br.data(), nullptr);
  const auto y = down(*ops, by.data(), by.size());
  const auto r = down(*ops, br.data(), br.size());
  for (int i = 0; i < N; ++i) {
    double rstd = 0;
    const auto ref = rms_ref(&x[size_t(i) * d], g.data(), dl.data(), d, eps, &rstd);
    EXPECT_NEAR(r[size_t(i)], rstd, 1e-13 * rstd) << "row " << i;
    for (int j = 0; j < d; ++j)
      EXPECT_NEAR(y[size_t(i) * d + j], ref[size_t(j)], 1e-13) << i << "," << j;
    // y / gamma has mean square ms/(ms + eps) ~ 1.
    double ms = 0;
    for (int j = 0; j < d; ++j) ms += std::pow(y[size_t(i) * d + j] / g[size_t(j)], 2);
    EXPECT_NEAR(ms / d, 1.0, 1e-5);
  }
  for (size_t i = size_t(N) * d; i < y.size(); ++i) EXPECT_EQ(y[i], -7.0) << "y overrun";
  for (size_t i = size_t(N); i < r.size(); ++i) EXPECT_EQ(r[i], -7.0) << "rstd overrun";
}

TEST(PaperRMSNorm, DeltaEffect) {
  auto ops = test_backend<double>();
  const int N = 4, d = 16;
  const double eps = 1e-6;
  const auto x = randn(size_t(N) * d, 11);
  const auto g = randn(size_t(d), 12, 0.2);
  const std::vector<double> zero(size_t(d), 0.0);
  const auto dl = randn(size_t(d), 13, 0.5);
  auto run = [&](const std::vector<double>& xin, const std::vector<double>& delta) {
    auto bx = up(*ops, xin), bg = up(*ops, g), bd = up(*ops, delta);
    Buffer<double> by(*ops, xin.size()), br(*ops, xin.size() / d);
    ops->rmsnorm_fwd(bx.data(), bg.data(), bd.data(), int(xin.size() / d), d, eps,
                     by.data(), br.data(), nullptr);
    return down(*ops, by.data(), xin.size());
  };
  const auto y0 = run(x, zero), y1 = run(x, dl);
  EXPECT_GT(max_abs_diff(y0, y1), 0.05) << "delta does not change the output";
  for (int i = 0; i < N; ++i) {
    const auto r0 = rms_ref(&x[size_t(i) * d], g.data(), zero.data(), d, eps);
    const auto r1 = rms_ref(&x[size_t(i) * d], g.data(), dl.data(), d, eps);
    for (int j = 0; j < d; ++j) {
      EXPECT_NEAR(y0[size_t(i) * d + j], r0[size_t(j)], 1e-13);
      EXPECT_NEAR(y1[size_t(i) * d + j], r1[size_t(j)], 1e-13);
    }
  }
  // delta is an offset of the input before normalisation: y(x, delta) = y(x + delta, 0).
  std::vector<double> xs = x;
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < d; ++j) xs[size_t(i) * d + j] += dl[size_t(j)];
  EXPECT_LT(max_abs_diff(run(xs, zero), y1), 1e-13);
  // x = -delta gives z = 0 and y = 0 exactly.
  std::vector<double> xneg(static_cast<size_t>(d));
  for (int j = 0; j < d; ++j) xneg[size_t(j)] = -dl[size_t(j)];
  for (double v : run(xneg, dl)) EXPECT_EQ(v, 0.0);
}

TEST(PaperRMSNorm, NoNaN) {
  const int d = 8;
  const double eps = 1e-6;
  {  // double: zero, huge and tiny rows
    auto ops = test_backend<double>();
    std::vector<double> x(size_t(3) * d);
    for (int j = 0; j < d; ++j) {
      x[size_t(j)] = 0.0;
      x[size_t(d + j)] = (j % 2 ? -1.0 : 1.0) * 1e150 * (1 + j);
      x[size_t(2 * d + j)] = (j % 3 ? 1.0 : -1.0) * 1e-150 * (1 + j);
    }
    const std::vector<double> g(size_t(d), 1.5), dl(size_t(d), 0.0);
    auto bx = up(*ops, x), bg = up(*ops, g), bd = up(*ops, dl);
    Buffer<double> by(*ops, x.size()), br(*ops, 3);
    ops->rmsnorm_fwd(bx.data(), bg.data(), bd.data(), 3, d, eps, by.data(), br.data(), nullptr);
    const auto y = down(*ops, by.data(), x.size());
    const auto r = down(*ops, br.data(), 3);
    EXPECT_TRUE(all_finite(y));
    EXPECT_TRUE(all_finite(r));
    for (int j = 0; j < d; ++j) EXPECT_EQ(y[size_t(j)], 0.0);  // x = 0, delta = 0
    EXPECT_NEAR(r[0], 1.0 / std::sqrt(eps), 1e-6);
    double ms = 0;  // huge: unit RMS after normalisation
    for (int j = 0; j < d; ++j) ms += std::pow(y[size_t(d + j)] / 1.5, 2);
    EXPECT_NEAR(ms / d, 1.0, 1e-12);
    for (int j = 0; j < d; ++j)  // tiny: eps dominates, y = g x / sqrt(eps)
      EXPECT_NEAR(y[size_t(2 * d + j)], 1.5 * x[size_t(2 * d + j)] / std::sqrt(eps),
                  1e-9 * std::abs(y[size_t(2 * d + j)]));
  }
  {  // float (the training type)
    auto ops = test_backend<float>();
    std::vector<float> x(size_t(3) * d);
    for (int j = 0; j < d; ++j) {
      x[size_t(j)] = 0.0f;
      x[size_t(d + j)] = (j % 2 ? -1.0f : 1.0f) * 1e30f * float(1 + j);
      x[size_t(2 * d + j)] = (j % 3 ? 1.0f : -1.0f) * 1e-30f * float(1 + j);
    }
    const std::vector<float> g(size_t(d), 1.0f), dl(size_t(d), 0.0f);
    auto bx = up(*ops, x), bg = up(*ops, g), bd = up(*ops, dl);
    Buffer<float> by(*ops, x.size()), br(*ops, 3);
    ops->rmsnorm_fwd(bx.data(), bg.data(), bd.data(), 3, d, eps, by.data(), br.data(), nullptr);
    const auto y = down(*ops, by.data(), x.size());
    EXPECT_TRUE(all_finite(y));
    EXPECT_TRUE(all_finite(down(*ops, br.data(), 3)));
    for (int j = 0; j < d; ++j) EXPECT_EQ(y[size_t(j)], 0.0f);
    double ms = 0;
    for (int j = 0; j < d; ++j) ms += double(y[size_t(d + j)]) * y[size_t(d + j)];
    EXPECT_NEAR(ms / d, 1.0, 1e-5);
    for (int j = 0; j < d; ++j)
      EXPECT_NEAR(y[size_t(2 * d + j)], double(x[size_t(2 * d + j)]) / std::sqrt(eps),
                  1e-5 * std::abs(double(y[size_t(2 * d + j)])));
  }
}

// ===================================================================================
// SRPE (3): Shape; position sensitivity; offset
// ===================================================================================

// docs/model.md §2 formulas for one (p, j).
void srpe_ref(const ModelConfig& c, int p, int j, double& cc, double& ss) {
  const int dh = c.dh();
  const double w = std::pow(c.theta0, -2.0 * j / dh);
  const double th = p * w * (1.0 + 1.0 / c.k_s);
  const double r = 1.0 + c.a_s * std::sin(p * c.f_s * w);
  cc = r * std::cos(th);
  ss = r * std::sin(th);
}

TEST(PaperSRPE, Shape) {
  const ModelConfig cfg = tiny_cfg();  // dh = 16
  const int dh = cfg.dh(), half = dh / 2, npos = 40;
  const auto td = srpe_table<double>(cfg, 0, npos);
  const auto tf = srpe_table<float>(cfg, 0, npos);
  ASSERT_EQ(td.size(), size_t(npos) * half * 2);  // [npos, dh/2, 2]
  ASSERT_EQ(tf.size(), td.size());
  for (int p = 0; p < npos; ++p)
    for (int j = 0; j < half; ++j) {
      double c = 0, s = 0;
      srpe_ref(cfg, p, j, c, s);
      const size_t i = (size_t(p) * half + j) * 2;
      EXPECT_NEAR(td[i], c, 1e-15) << p << "," << j;
      EXPECT_NEAR(td[i + 1], s, 1e-15) << p << "," << j;
      // float table: computed in double, rounded once.
      EXPECT_EQ(tf[i], float(td[i]));
      EXPECT_EQ(tf[i + 1], float(td[i + 1]));
    }
  // srpe_apply on x[B, Tn, nh, dh] rotates (j, j + dh/2) of every head.
  auto ops = test_backend<double>();
  const int B = 2, Tn = 5, nh = 3;
  const auto x = randn(size_t(B) * Tn * nh * dh, 21);
  auto bx = up(*ops, x);
  auto bt = up(*ops, srpe_table<double>(cfg, 0, Tn));
  ops->srpe_apply(bx.data(), B, Tn, nh, dh, bt.data(), false);
  const auto y = down(*ops, bx.data(), x.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int h = 0; h < nh; ++h)
        for (int j = 0; j < half; ++j) {
          double c = 0, s = 0;
          srpe_ref(cfg, t, j, c, s);
          const size_t base = ((size_t(b) * Tn + t) * nh + h) * dh;
          const double a = x[base + j], bb = x[base + j + half];
          EXPECT_NEAR(y[base + j], a * c - bb * s, 1e-14);
          EXPECT_NEAR(y[base + j + half], a * s + bb * c, 1e-14);
        }
}

TEST(PaperSRPE, PositionSensitivity) {
  ModelConfig cfg = tiny_cfg();
  const int dh = cfg.dh(), half = dh / 2;
  auto ops = test_backend<double>();
  const auto q = randn(size_t(dh), 31), k = randn(size_t(dh), 32);
  auto rot = [&](const ModelConfig& c, const std::vector<double>& v, int p) {
    auto bv = up(*ops, v);
    auto bt = up(*ops, srpe_table<double>(c, p, 1));
    ops->srpe_apply(bv.data(), 1, 1, 1, dh, bt.data(), false);
    return down(*ops, bv.data(), size_t(dh));
  };
  auto score = [&](const ModelConfig& c, int pq, int pk) {
    const auto a = rot(c, q, pq), b = rot(c, k, pk);
    double s = 0;
    for (int i = 0; i < dh; ++i) s += a[size_t(i)] * b[size_t(i)];
    return s;
  };
  // Closed form: per pair, r(pq) r(pk) [(qa ka + qb kb) cos D - (qb ka - qa kb) sin D],
  // D = Theta(pq) - Theta(pk).
  auto score_ref = [&](const ModelConfig& c, int pq, int pk) {
    double s = 0;
    for (int j = 0; j < half; ++j) {
      const double w = std::pow(c.theta0, -2.0 * j / dh);
      const double D = (pq - pk) * w * (1.0 + 1.0 / c.k_s);
      const double rq = 1.0 + c.a_s * std::sin(pq * c.f_s * w);
      const double rk = 1.0 + c.a_s * std::sin(pk * c.f_s * w);
      const double qa = q[size_t(j)], qb = q[size_t(j + half)];
      const double ka = k[size_t(j)], kb = k[size_t(j + half)];
      s += rq * rk * ((qa * ka + qb * kb) * std::cos(D) - (qb * ka - qa * kb) * std::sin(D));
    }
    return s;
  };
  for (auto [pq, pk] : {std::pair{0, 0}, {3, 1}, {7, 2}, {12, 2}, {100, 37}, {1500, 1499}})
    EXPECT_NEAR(score(cfg, pq, pk), score_ref(cfg, pq, pk), 1e-12) << pq << "," << pk;
  // Position 0 is the identity (Theta = 0, r = 1).
  EXPECT_EQ(max_abs_diff(rot(cfg, q, 0), q), 0.0);
  // Different positions rotate differently; scores depend on the distance.
  EXPECT_GT(max_abs_diff(rot(cfg, q, 3), rot(cfg, q, 4)), 1e-2);
  EXPECT_GT(std::abs(score(cfg, 7, 2) - score(cfg, 12, 2)), 1e-3);
  // Without the radial term SRPE is relative (shift invariant) ...
  ModelConfig flat = cfg;
  flat.a_s = 0.0;
  EXPECT_NEAR(score(flat, 210, 200), score(flat, 10, 0), 1e-10);
  // ... and the radial factor r(p) makes it depend on absolute position too.
  EXPECT_GT(std::abs(score(cfg, 210, 200) - score(cfg, 10, 0)), 1e-3);
  // The spiral factor (1 + 1/k_s) is there: k_s -> infinity changes the angle.
  ModelConfig nospiral = cfg;
  nospiral.k_s = 1e300;
  EXPECT_GT(max_abs_diff(rot(nospiral, q, 5), rot(cfg, q, 5)), 1e-2);
}

TEST(PaperSRPE, Offset) {
  const ModelConfig cfg = tiny_cfg();
  const int dh = cfg.dh(), half = dh / 2, pos0 = 5, n = 7;
  // table(pos0, n) == rows pos0.. of table(0, pos0 + n), exactly.
  {
    const auto a = srpe_table<double>(cfg, pos0, n);
    const auto full = srpe_table<double>(cfg, 0, pos0 + n);
    ASSERT_EQ(a.size(), size_t(n) * dh);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], full[size_t(pos0) * dh + i]);
    const auto af = srpe_table<float>(cfg, pos0, n);
    const auto ff = srpe_table<float>(cfg, 0, pos0 + n);
    for (size_t i = 0; i < af.size(); ++i) EXPECT_EQ(af[i], ff[size_t(pos0) * dh + i]);
  }
  auto ops = test_backend<double>();
  const int nh = 2;
  // Rotating a chunk with the offset table == rotating those rows of the whole sequence.
  {
    const auto x = randn(size_t(pos0 + n) * nh * dh, 41);
    auto bx = up(*ops, x);
    auto bt = up(*ops, srpe_table<double>(cfg, 0, pos0 + n));
    ops->srpe_apply(bx.data(), 1, pos0 + n, nh, dh, bt.data(), false);
    const auto whole = down(*ops, bx.data(), x.size());
    std::vector<double> tail(x.begin() + long(pos0) * nh * dh, x.end());
    auto bc = up(*ops, tail);
    auto bo = up(*ops, srpe_table<double>(cfg, pos0, n));
    ops->srpe_apply(bc.data(), 1, n, nh, dh, bo.data(), false);
    const auto chunk = down(*ops, bc.data(), tail.size());
    for (size_t i = 0; i < chunk.size(); ++i)
      EXPECT_EQ(chunk[i], whole[size_t(pos0) * nh * dh + i]);
  }
  // inverse = transpose: <R x, y> = <x, R^T y>, and R^T R = r^2 per pair.
  const auto table = srpe_table<double>(cfg, pos0, n);
  auto bt = up(*ops, table);
  const auto x = randn(size_t(n) * nh * dh, 42), y = randn(size_t(n) * nh * dh, 43);
  auto bx = up(*ops, x), by = up(*ops, y);
  ops->srpe_apply(bx.data(), 1, n, nh, dh, bt.data(), false);
  ops->srpe_apply(by.data(), 1, n, nh, dh, bt.data(), true);
  const auto rx = down(*ops, bx.data(), x.size()), ry = down(*ops, by.data(), y.size());
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    lhs += rx[i] * y[i];
    rhs += x[i] * ry[i];
  }
  EXPECT_NEAR(lhs, rhs, 1e-12);
  ops->srpe_apply(bx.data(), 1, n, nh, dh, bt.data(), true);  // fwd then inverse
  const auto back = down(*ops, bx.data(), x.size());
  double max_r2_dev = 0;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < nh; ++h)
      for (int j = 0; j < half; ++j) {
        const double c = table[(size_t(t) * half + j) * 2], s = table[(size_t(t) * half + j) * 2 + 1];
        const double r2 = c * c + s * s;
        max_r2_dev = std::max(max_r2_dev, std::abs(r2 - 1.0));
        const size_t base = (size_t(t) * nh + h) * dh;
        EXPECT_NEAR(back[base + j], r2 * x[base + j], 1e-13);
        EXPECT_NEAR(back[base + j + half], r2 * x[base + j + half], 1e-13);
      }
  EXPECT_GT(max_r2_dev, 1e-3) << "radial factor should make r^2 != 1 at positions 5..11";
}

// ===================================================================================
// GCLA (3): Shape; KV growth; ctx blend change
// ===================================================================================

TEST(PaperGCLA, Shape) {
  LayerHarness h(tiny_cfg(64, 8), 2);
  const int l = 2, nc = h.cfg.n_ctx(l), d = h.cfg.d, Tn = h.Tn;
  ASSERT_EQ(nc, 2);
  const LayerCtx<double> c = h.ctx(h.cfg);
  LayerActs<double> a;
  a.allocate(c, nc);
  const auto x = randn(h.Nd(), 51);
  const std::vector<std::vector<double>> ctx{randn(h.Nd(), 52), randn(h.Nd(), 53)};
  const auto y = run_layer(h, c, l, x, ctx, false, a);
  ASSERT_EQ(y.size(), size_t(h.B) * Tn * d);  // [N, d]
  EXPECT_TRUE(all_finite(y));
  const int hd = h.cfg.H * h.cfg.dh();
  const auto o = down(*h.ops, a.o, size_t(h.B) * Tn * hd);  // [N, H dh]
  EXPECT_TRUE(all_finite(o));
  const auto probs = down(*h.ops, a.probs, size_t(h.B) * Tn * h.cfg.H * nc);  // [N, H, nc]
  for (size_t i = 0; i < probs.size(); i += size_t(nc))
    EXPECT_NEAR(probs[i] + probs[i + 1], 1.0, 1e-12);
  // Causal: changing row 5 of sequence 0 changes rows >= 5 of it only.
  auto x2 = x;
  for (int j = 0; j < d; ++j) x2[size_t(5) * d + j] += 0.5;
  const auto y2 = run_layer(h, c, l, x2, ctx, false, a);
  for (int b = 0; b < h.B; ++b)
    for (int t = 0; t < Tn; ++t) {
      double m = 0;
      for (int j = 0; j < d; ++j) {
        const size_t i = (size_t(b) * Tn + t) * d + j;
        m = std::max(m, std::abs(y2[i] - y[i]));
      }
      if (b == 0 && t >= 5) EXPECT_GT(m, 1e-4) << "row " << t << " ignores row 5";
      else EXPECT_LT(m, 1e-13) << "seq " << b << " row " << t << " sees row 5 of seq 0";
    }
}

TEST(PaperGCLA, KvGrowth) {
  const ModelConfig cfg = tiny_cfg(64, 16);
  auto ops = test_backend<float>();
  const int B = 2, cap = 12, kvd = cfg.Hkv * cfg.dh(), d = cfg.d;
  Model<float> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(3);
  const auto ids = rand_tokens(size_t(B) * 8, cfg.V, 61);  // [B, 8]
  auto chunk = [&](int from, int n) {
    std::vector<int32_t> c;
    for (int b = 0; b < B; ++b)
      for (int t = from; t < from + n; ++t) c.push_back(ids[size_t(b) * 8 + t]);
    return c;
  };
  // Every layer's keys and values: rows < len written, rows >= len still zero.
  auto check_rows = [&](KvCache<float>& kc, int len) {
    for (int l = 0; l < cfg.L; ++l)
      for (const auto* buf : {&kc.k[size_t(l)], &kc.v[size_t(l)]}) {
        const auto h = down(*ops, buf->data(), buf->size());
        for (int b = 0; b < B; ++b)
          for (int r = 0; r < cap; ++r) {
            double mx = 0;
            for (int i = 0; i < kvd; ++i)
              mx = std::max(mx, std::abs(double(h[(size_t(b) * cap + r) * kvd + i])));
            if (r < len) EXPECT_GT(mx, 0.0) << "layer " << l << " row " << r << " empty";
            else EXPECT_EQ(mx, 0.0) << "layer " << l << " row " << r << " written beyond len";
          }
      }
  };
  KvCache<float> kc = m.make_cache(cap);
  EXPECT_EQ(kc.len, 0);
  check_rows(kc, 0);
  m.forward_cached(chunk(0, 3).data(), 3, kc);
  EXPECT_EQ(kc.len, 3);
  check_rows(kc, 3);
  const auto k_after3 = down(*ops, kc.k[2].data(), kc.k[2].size());
  m.forward_cached(chunk(3, 5).data(), 5, kc);
  EXPECT_EQ(kc.len, 8);
  check_rows(kc, 8);
  // Earlier rows are not rewritten (append only).
  const auto k_after8 = down(*ops, kc.k[2].data(), kc.k[2].size());
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < 3; ++r)
      for (int i = 0; i < kvd; ++i) {
        const size_t j = (size_t(b) * cap + r) * kvd + i;
        EXPECT_EQ(k_after8[j], k_after3[j]);
      }
  // The same 8 tokens in one chunk give the same cached keys/values.
  KvCache<float> one = m.make_cache(cap);
  m.forward_cached(chunk(0, 8).data(), 8, one);
  for (int l = 0; l < cfg.L; ++l) {
    EXPECT_LT(max_abs_diff(down(*ops, one.k[size_t(l)].data(), one.k[size_t(l)].size()),
                           down(*ops, kc.k[size_t(l)].data(), kc.k[size_t(l)].size())), 1e-5);
    EXPECT_LT(max_abs_diff(down(*ops, one.v[size_t(l)].data(), one.v[size_t(l)].size()),
                           down(*ops, kc.v[size_t(l)].data(), kc.v[size_t(l)].size())), 1e-5);
  }
  // Running sum of S(-1) = P(X0) holds the sum of the 8 embeddings per sequence.
  const auto E = get_param(m, *ops, "model.embed_tokens.weight");
  const auto carry0 = down(*ops, kc.carry[0].data(), kc.carry[0].size());
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < d; ++j) {
      double s = 0;
      for (int t = 0; t < 8; ++t) s += E[size_t(ids[size_t(b) * 8 + t]) * d + j];
      EXPECT_NEAR(carry0[size_t(b) * d + j], s, 1e-6);
    }
}

TEST(PaperGCLA, CtxBlendChange) {
  LayerHarness h(tiny_cfg(64, 8), 2);
  const int l = 2, nc = 2, d = h.cfg.d, dh = h.cfg.dh(), H = h.cfg.H, Hkv = h.cfg.Hkv;
  const int hd = H * dh, kvd = Hkv * dh, N = h.B * h.Tn;
  const LayerCtx<double> c = h.ctx(h.cfg);
  LayerActs<double> a;
  a.allocate(c, nc);
  Ops<double>& ops = *h.ops;
  const std::string phi_name = layer_param_name(l, "self_attn.ctx_gate_logit");
  EXPECT_EQ(get_param(h.model, ops, phi_name)[0], -3.0);  // phi init
  const auto x = randn(h.Nd(), 71);
  const auto S = randn(h.Nd(), 72), S2 = randn(h.Nd(), 73);

  // Identical context rows: uniform softmax, o_ctx = C W_vc^T of group h mod Hkv.
  const auto y3 = run_layer(h, c, l, x, {S, S}, false, a);
  const auto o_self = down(ops, a.o_self, size_t(N) * hd);
  const auto o_ctx = down(ops, a.o_ctx, size_t(N) * hd);
  const auto o = down(ops, a.o, size_t(N) * hd);
  const auto og = down(ops, a.og, size_t(N) * hd);
  const auto gpre = down(ops, a.gpre, size_t(N) * hd);
  const auto xh = down(ops, a.xh, h.Nd());
  const auto probs = down(ops, a.probs, size_t(N) * H * nc);
  for (double p : probs) EXPECT_NEAR(p, 0.5, 1e-12);
  const auto Wvc = get_param(h.model, ops, layer_param_name(l, "self_attn.ctx_v_proj.weight"));
  const auto vctx = matmul_t(S, Wvc.data(), N, d, kvd, d);  // [N, Hkv dh]
  for (int n = 0; n < N; ++n)
    for (int hh = 0; hh < H; ++hh)
      for (int i = 0; i < dh; ++i)
        EXPECT_NEAR(o_ctx[size_t(n) * hd + size_t(hh) * dh + i],
                    vctx[size_t(n) * kvd + size_t(hh % Hkv) * dh + i], 1e-12)
            << "token " << n << " head " << hh;
  // Blend (1 - beta) o_self + beta o_ctx, beta = sigmoid(phi); gate; W_O; residual.
  const double beta = sigmoid(-3.0);
  for (size_t i = 0; i < o.size(); ++i) {
    EXPECT_NEAR(o[i], (1 - beta) * o_self[i] + beta * o_ctx[i], 1e-13);
    EXPECT_NEAR(og[i], sigmoid(gpre[i]) * o[i], 1e-13);
  }
  const auto Wo = get_param(h.model, ops, layer_param_name(l, "self_attn.o_proj.weight"));
  const auto A = matmul_t(og, Wo.data(), N, hd, d, hd);
  for (size_t i = 0; i < xh.size(); ++i) EXPECT_NEAR(xh[i], x[i] + A[i], 1e-12);

  // phi = -3: the context matters.
  const auto y3b = run_layer(h, c, l, x, {S, S2}, false, a);
  EXPECT_GT(max_abs_diff(y3, y3b), 1e-5);
  // phi = -30: beta ~ 1e-13, the context no longer matters, and the output changed.
  set_param(h.model, ops, phi_name, {-30.0});
  const auto y30 = run_layer(h, c, l, x, {S, S}, false, a);
  const auto y30b = run_layer(h, c, l, x, {S, S2}, false, a);
  EXPECT_LT(max_abs_diff(y30, y30b), 1e-11);
  EXPECT_GT(max_abs_diff(y30, y3), 1e-5) << "phi does not change the layer output";
  EXPECT_LT(max_abs_diff(down(ops, a.o, o.size()), down(ops, a.o_self, o.size())), 1e-12);

  // Whole model: phi = -30 in every layer changes the logits.
  const ModelConfig mc = tiny_cfg(64, 16);
  auto fops = test_backend<float>();
  Model<float> m(*fops, mc, ModelShard{}, nullptr, ModelOptions{1, false, false});
  m.init(5);
  const auto in = rand_tokens(size_t(mc.T), mc.V, 74);
  const auto z3 = m.forward_logits(in.data(), false);
  set_phi_all(m, *fops, -30.0);
  const auto z30 = m.forward_logits(in.data(), false);
  EXPECT_GT(max_abs_diff(z3, z30), 1e-4) << "ctx blend does not reach the logits";
}

// ===================================================================================
// DSFF (2): Shape; stream independence
// ===================================================================================

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

TEST(PaperDSFF, Shape) {
  LayerHarness h(tiny_cfg(64, 8), 2);
  const int l = 0, nc = 1, d = h.cfg.d, dA = h.cfg.dA, dB = h.cfg.dB, N = h.B * h.Tn;
  Ops<double>& ops = *h.ops;
  // Non-trivial post-attention norm (gamma != 1, delta != 0).
  auto g2 = randn(size_t(d), 80, 0.2);
  for (auto& v : g2) v += 1.0;
  set_param(h.model, ops, layer_param_name(l, "post_attention_layernorm.weight"), g2);
  const auto d2 = randn(size_t(d), 81, 0.3);
  set_param(h.model, ops, layer_param_name(l, "post_attention_layernorm.offset"), d2);
  const LayerCtx<double> c = h.ctx(h.cfg);
  LayerActs<double> a;
  a.allocate(c, nc);
  const auto x = randn(h.Nd(), 82);
  const auto y = run_layer(h, c, l, x, {randn(h.Nd(), 83)}, false, a);
  const auto xh = down(ops, a.xh, h.Nd());
  // WRMSNorm' of X-half.
  std::vector<double> xn2(h.Nd());
  for (int n = 0; n < N; ++n) {
    const auto r = rms_ref(&xh[size_t(n) * d], g2.data(), d2.data(), d, h.cfg.eps);
    std::copy(r.begin(), r.end(), xn2.begin() + long(n) * d);
  }
  EXPECT_LT(max_abs_diff(down(ops, a.xn2, h.Nd()), xn2), 1e-12);
  auto P = [&](const char* s) { return get_param(h.model, ops, layer_param_name(l, s)); };
  const auto GA = P("mlp.stream_a_gate.weight"), UA = P("mlp.stream_a_up.weight");
  const auto DA = P("mlp.stream_a_down.weight"), UB = P("mlp.stream_b_up.weight");
  const auto DB = P("mlp.stream_b_down.weight"), WF = P("mlp.fusion.weight");
  ASSERT_EQ(GA.size(), size_t(dA) * d);
  ASSERT_EQ(DA.size(), size_t(d) * dA);
  ASSERT_EQ(UB.size(), size_t(dB) * d);
  ASSERT_EQ(DB.size(), size_t(d) * dB);
  ASSERT_EQ(WF.size(), size_t(d) * 2 * d);
  // a = D_A(SiLU(G_A x) * U_A x)
  const auto ga = matmul_t(xn2, GA.data(), N, d, dA, d);
  const auto ua = matmul_t(xn2, UA.data(), N, d, dA, d);
  std::vector<double> ha(ga.size());
  for (size_t i = 0; i < ga.size(); ++i) ha[i] = ga[i] * sigmoid(ga[i]) * ua[i];
  const auto ra = matmul_t(ha, DA.data(), N, dA, d, dA);
  // b = D_B(GELU(U_B x)), exact erf GELU
  const auto ub = matmul_t(xn2, UB.data(), N, d, dB, d);
  std::vector<double> hb(ub.size());
  for (size_t i = 0; i < ub.size(); ++i) hb[i] = gelu_ref(ub[i]);
  const auto rb = matmul_t(hb, DB.data(), N, dB, d, dB);
  // alpha = sigmoid(W_f [a; b]); out = alpha a + (1 - alpha) b
  std::vector<double> ab(size_t(N) * 2 * d);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < d; ++j) {
      ab[size_t(n) * 2 * d + j] = ra[size_t(n) * d + j];
      ab[size_t(n) * 2 * d + d + j] = rb[size_t(n) * d + j];
    }
  const auto fpre = matmul_t(ab, WF.data(), N, 2 * d, d, 2 * d);
  EXPECT_LT(max_abs_diff(down(ops, a.ha, ha.size()), ha), 1e-12);
  EXPECT_LT(max_abs_diff(down(ops, a.hb, hb.size()), hb), 1e-12);
  EXPECT_LT(max_abs_diff(down(ops, a.a, ra.size()), ra), 1e-12);
  EXPECT_LT(max_abs_diff(down(ops, a.b, rb.size()), rb), 1e-12);
  EXPECT_LT(max_abs_diff(down(ops, a.fpre, fpre.size()), fpre), 1e-12);
  double fmax = 0;
  for (int i = 0; i < N * d; ++i) {
    const double al = sigmoid(fpre[size_t(i)]);
    const double F = al * ra[size_t(i)] + (1 - al) * rb[size_t(i)];
    fmax = std::max(fmax, std::abs(F));
    EXPECT_NEAR(y[size_t(i)], xh[size_t(i)] + F, 1e-12);
  }
  EXPECT_GT(fmax, 1e-4);  // DSFF contributes something
}

TEST(PaperDSFF, StreamIndependence) {
  LayerHarness h(tiny_cfg(64, 8), 2);
  const int l = 1, nc = h.cfg.n_ctx(l), d = h.cfg.d;
  Ops<double>& ops = *h.ops;
  const LayerCtx<double> c = h.ctx(h.cfg);
  LayerActs<double> a;
  a.allocate(c, nc);
  const auto x = randn(h.Nd(), 91);
  const std::vector<std::vector<double>> ctx{randn(h.Nd(), 92), randn(h.Nd(), 93)};
  run_layer(h, c, l, x, ctx, false, a);
  const auto a0 = down(ops, a.a, h.Nd()), b0 = down(ops, a.b, h.Nd());
  EXPECT_GT(max_abs_diff(a0, std::vector<double>(h.Nd(), 0.0)), 1e-4);
  EXPECT_GT(max_abs_diff(b0, std::vector<double>(h.Nd(), 0.0)), 1e-4);
  const auto WF = get_param(h.model, ops, layer_param_name(l, "mlp.fusion.weight"));
  const int N = h.B * h.Tn;
  const std::string nA = layer_param_name(l, "mlp.stream_a_down.weight");
  const std::string nB = layer_param_name(l, "mlp.stream_b_down.weight");
  const auto DA = get_param(h.model, ops, nA), DB = get_param(h.model, ops, nB);

  // Stream B silenced: stream A untouched, b = 0, out = X-half + alpha a.
  set_param(h.model, ops, nB, std::vector<double>(DB.size(), 0.0));
  auto y = run_layer(h, c, l, x, ctx, false, a);
  EXPECT_LT(max_abs_diff(down(ops, a.a, h.Nd()), a0), 1e-15);
  for (double v : down(ops, a.b, h.Nd())) EXPECT_EQ(v, 0.0);
  auto xh = down(ops, a.xh, h.Nd());
  auto pre = matmul_t(a0, WF.data(), N, d, d, 2 * d);  // W_f's a-columns
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], xh[i] + sigmoid(pre[i]) * a0[i], 1e-12);
  set_param(h.model, ops, nB, DB);

  // Stream A silenced: stream B untouched, a = 0, out = X-half + (1 - alpha) b.
  set_param(h.model, ops, nA, std::vector<double>(DA.size(), 0.0));
  y = run_layer(h, c, l, x, ctx, false, a);
  EXPECT_LT(max_abs_diff(down(ops, a.b, h.Nd()), b0), 1e-15);
  for (double v : down(ops, a.a, h.Nd())) EXPECT_EQ(v, 0.0);
  xh = down(ops, a.xh, h.Nd());
  pre = matmul_t(b0, WF.data() + d, N, d, d, 2 * d);  // W_f's b-columns
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], xh[i] + (1 - sigmoid(pre[i])) * b0[i], 1e-12);
}

// ===================================================================================
// ATM (2): merge/unmerge roundtrip; short sequence
// ===================================================================================

TEST(PaperATM, MergeUnmergeRoundtrip) {
  // Algorithm 1: greedy, strict >, a taken t+1 cannot open.
  const int Tn = 7, w = 3;
  const double rho[Tn - 1] = {0.95, 0.99, 0.10, 0.93, 0.97, 0.92};
  const auto open = atm_greedy_open(rho, Tn, 0.92);
  EXPECT_EQ(open, (std::vector<uint8_t>{1, 0, 0, 1, 0, 0, 0}));
  const auto groups = atm_merge_map(open.data(), Tn);
  EXPECT_EQ(groups, (std::vector<std::vector<int>>{{0, 1}, {2}, {3, 4}, {5}, {6}}));
  const auto x = randn(size_t(Tn) * w, 101);
  const auto xm = atm_merge(groups, x.data(), w);
  ASSERT_EQ(xm.size(), groups.size() * w);
  const auto xu = atm_unmerge(groups, xm.data(), Tn, w);
  ASSERT_EQ(xu.size(), size_t(Tn) * w);
  for (int i = 0; i < w; ++i) {
    const double m01 = (x[0 * w + size_t(i)] + x[1 * w + size_t(i)]) / 2;
    const double m34 = (x[3 * w + size_t(i)] + x[4 * w + size_t(i)]) / 2;
    EXPECT_DOUBLE_EQ(xm[0 * w + size_t(i)], m01);
    EXPECT_DOUBLE_EQ(xm[2 * w + size_t(i)], m34);
    EXPECT_DOUBLE_EQ(xu[0 * w + size_t(i)], m01);   // pairs: the group mean at both members
    EXPECT_DOUBLE_EQ(xu[1 * w + size_t(i)], m01);
    EXPECT_DOUBLE_EQ(xu[3 * w + size_t(i)], m34);
    EXPECT_DOUBLE_EQ(xu[4 * w + size_t(i)], m34);
    for (int t : {2, 5, 6}) EXPECT_EQ(xu[size_t(t) * w + i], x[size_t(t) * w + i]);  // singletons exact
  }
  // merge(unmerge(y)) == y exactly.
  const auto y = randn(groups.size() * w, 102);
  EXPECT_EQ(atm_merge(groups, atm_unmerge(groups, y.data(), Tn, w).data(), w), y);

  // The backend's merge on the attention layout agrees (B = 2, second sequence other map).
  std::vector<uint8_t> open2 = open;
  const std::vector<uint8_t> other{0, 1, 0, 0, 0, 1, 0};
  open2.insert(open2.end(), other.begin(), other.end());
  const AtmLayout lay = atm_layout(open2, 2, Tn);
  EXPECT_EQ(lay.n_groups, (std::vector<int32_t>{5, 5}));
  EXPECT_EQ(lay.total_groups(), 10);
  // Visible (query, key) pairs, by hand: complete groups of the prefix plus
  // the query's own raw key where it opens a pair.
  // first map, key_end 1,2,4,5,6:  t = 0..6 -> 0+1, 1, 2, 2+1, 3, 4, 5 = 19
  // second map {0},{1,2},{3},{4},{5,6}, key_end 0,2,3,4,6:
  //                                t = 0..6 -> 1, 1+1, 2, 3, 4, 4+1, 5 = 22
  EXPECT_EQ(lay.visible_pairs(), 19 + 22);
  auto ops = test_backend<double>();
  const auto xb = randn(size_t(2) * Tn * w, 103);
  auto bx = up(*ops, xb);
  auto gf = up_idx(*ops, lay.group_first), ke = up_idx(*ops, lay.key_end);
  auto ng = up_idx(*ops, lay.n_groups);
  Buffer<double> bo(*ops, xb.size());
  ops->atm_merge_rows(bx.data(), 2, Tn, w, gf.data(), ke.data(), ng.data(), bo.data());
  const auto merged = down(*ops, bo.data(), xb.size());
  for (int b = 0; b < 2; ++b) {
    const auto gr = atm_merge_map(open2.data() + size_t(b) * Tn, Tn);
    const auto ref = atm_merge(gr, xb.data() + size_t(b) * Tn * w, w);
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_NEAR(merged[size_t(b) * Tn * w + i], ref[i], 1e-15);
    for (size_t i = ref.size(); i < size_t(Tn) * w; ++i)
      EXPECT_EQ(merged[size_t(b) * Tn * w + i], 0.0) << "rows past n_groups must be zero";
  }
}

TEST(PaperATM, ShortSeq) {
  {  // T = 2
    const double hi[1] = {0.99}, eq[1] = {0.92};
    EXPECT_EQ(atm_greedy_open(hi, 2, 0.92), (std::vector<uint8_t>{1, 0}));
    EXPECT_EQ(atm_greedy_open(eq, 2, 0.92), (std::vector<uint8_t>{0, 0}));  // strictly >
    const std::vector<uint8_t> o{1, 0};
    EXPECT_EQ(atm_merge_map(o.data(), 2), (std::vector<std::vector<int>>{{0, 1}}));
    const AtmLayout lay = atm_layout(o, 1, 2);
    EXPECT_EQ(lay.n_groups[0], 1);
    EXPECT_EQ(lay.group_first[0], 0);
    EXPECT_EQ(lay.key_end[0], 1);
    EXPECT_EQ(lay.key_end[1], 2);  // unused row: never visible
    EXPECT_EQ(lay.visible_pairs(), 2);  // t=0 its own raw key, t=1 the pair
  }
  {  // T = 3
    const double a[2] = {0.99, 0.99}, b[2] = {0.5, 0.99};
    EXPECT_EQ(atm_greedy_open(a, 3, 0.92), (std::vector<uint8_t>{1, 0, 0}));
    EXPECT_EQ(atm_greedy_open(b, 3, 0.92), (std::vector<uint8_t>{0, 1, 0}));
    const std::vector<uint8_t> o1{1, 0, 0}, o2{0, 1, 0};
    EXPECT_EQ(atm_merge_map(o1.data(), 3), (std::vector<std::vector<int>>{{0, 1}, {2}}));
    EXPECT_EQ(atm_merge_map(o2.data(), 3), (std::vector<std::vector<int>>{{0}, {1, 2}}));
    const auto x = randn(6, 111);
    const auto gr = atm_merge_map(o2.data(), 3);
    EXPECT_EQ(atm_merge(gr, atm_unmerge(gr, x.data(), 3, 2).data(), 2),
              std::vector<double>(x.begin(), x.begin() + 4));
  }
  // A whole model with T = 2 and T = 3 in training mode, every pair merging.
  for (int Tn : {2, 3}) {
    ModelConfig cfg = tiny_cfg(64, Tn);
    cfg.tau = -1.0;
    auto ops = test_backend<float>();
    const int B = 2;
    Model<float> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, false});
    m.init(9);
    m.zero_grads();
    const auto tok = rand_tokens(size_t(B) * (Tn + 1), cfg.V, 112);
    const double loss = m.train_micro_step(tok.data(), 1.0 / (B * Tn));
    EXPECT_TRUE(std::isfinite(loss)) << "T=" << Tn;
    EXPECT_NEAR(loss / (B * Tn), std::log(double(cfg.V)), 0.2);
    const auto g = down(*ops, m.grads(), m.n_params());
    EXPECT_TRUE(all_finite(g));
    EXPECT_GT(max_abs_diff(g, std::vector<float>(g.size(), 0.0f)), 0.0);
    std::vector<uint8_t> expect;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tn; ++t) expect.push_back(t == 0 ? 1 : 0);
    for (int l = 0; l < cfg.L; ++l) {
      if (cfg.atm_layer(l)) EXPECT_EQ(m.atm_open(l), expect) << "T=" << Tn << " layer " << l;
      else EXPECT_TRUE(m.atm_open(l).empty());
    }
    EXPECT_TRUE(std::isfinite(m.eval_loss(tok.data())));
  }
}

// ===================================================================================
// WiolaDecoderLayer (2): forward; mid-layer ATM flag
// ===================================================================================

TEST(PaperDecoderLayer, Forward) {
  LayerHarness h(tiny_cfg(64, 8), 2);
  const int l = 1, nc = h.cfg.n_ctx(l), d = h.cfg.d, N = h.B * h.Tn;
  ASSERT_FALSE(h.cfg.atm_layer(l));
  const LayerCtx<double> c = h.ctx(h.cfg);
  LayerActs<double> a;
  a.allocate(c, nc);
  const auto x = randn(h.Nd(), 121);
  const std::vector<std::vector<double>> ctx{randn(h.Nd(), 122), randn(h.Nd(), 123)};
  const auto y = run_layer(h, c, l, x, ctx, false, a);
  EXPECT_TRUE(all_finite(y));
  EXPECT_FALSE(a.atm_active);
  const auto xh = down(*h.ops, a.xh, h.Nd());
  // Both residual branches (A and F) change every token.
  for (int n = 0; n < N; ++n) {
    double dA = 0, dF = 0;
    for (int j = 0; j < d; ++j) {
      const size_t i = size_t(n) * d + j;
      dA = std::max(dA, std::abs(xh[i] - x[i]));
      dF = std::max(dF, std::abs(y[i] - xh[i]));
    }
    EXPECT_GT(dA, 1e-4) << "attention branch is zero at token " << n;
    EXPECT_GT(dF, 1e-4) << "FFN branch is zero at token " << n;
  }
  // The input norm feeds the layer: xn1 = WRMSNorm(x).
  const auto xn1 = down(*h.ops, a.xn1, h.Nd());
  const std::vector<double> ones(size_t(d), 1.0), zeros(size_t(d), 0.0);
  for (int n = 0; n < N; ++n) {
    const auto r = rms_ref(&x[size_t(n) * d], ones.data(), zeros.data(), d, h.cfg.eps);
    for (int j = 0; j < d; ++j) EXPECT_NEAR(xn1[size_t(n) * d + j], r[size_t(j)], 1e-13);
  }
  // Outside the ATM layers training and evaluation are the same computation.
  const auto yt = run_layer(h, c, l, x, ctx, true, a);
  EXPECT_FALSE(a.atm_active);
  EXPECT_EQ(max_abs_diff(yt, y), 0.0);
}

TEST(PaperDecoderLayer, MidLayerAtmFlag) {
  // floor(L/3) <= l < floor(2L/3), written out per depth.
  const std::vector<std::pair<int, std::vector<int>>> expect{
      {6, {2, 3}}, {12, {4, 5, 6, 7}}, {16, {5, 6, 7, 8, 9}},
      {24, {8, 9, 10, 11, 12, 13, 14, 15}}, {28, {9, 10, 11, 12, 13, 14, 15, 16, 17}}};
  for (const auto& [L, layers] : expect) {
    ModelConfig c;
    c.L = L;
    std::vector<int> got;
    for (int l = 0; l < L; ++l)
      if (c.atm_layer(l)) got.push_back(l);
    EXPECT_EQ(got, layers) << "L=" << L;
    c.atm = false;
    for (int l = 0; l < L; ++l) EXPECT_FALSE(c.atm_layer(l)) << "atm=false, L=" << L;
  }
  for (const char* p : {"wiola-120m", "wiola-360m", "wiola-700m", "wiola-1.5b"}) {
    const ModelConfig c = model_preset(p);
    int n = 0;
    for (int l = 0; l < c.L; ++l) n += c.atm_layer(l);
    EXPECT_EQ(n, (2 * c.L) / 3 - c.L / 3) << p;
  }

  // Whole model (L = 6, ATM in layers 2, 3), tau = -1: every pair merges.
  ModelConfig cfg = tiny_cfg(64, 8);
  cfg.tau = -1.0;
  auto ops = test_backend<float>();
  const int B = 2, Tn = cfg.T, V = cfg.V;
  Model<float> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(13);
  const auto in = rand_tokens(size_t(B) * Tn, V, 131);
  const auto zt = m.forward_logits(in.data(), true);
  std::vector<uint8_t> alt;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) alt.push_back(t % 2 == 0 ? 1 : 0);
  for (int l = 0; l < cfg.L; ++l) {
    if (l == 2 || l == 3) EXPECT_EQ(m.atm_open(l), alt) << "layer " << l;
    else EXPECT_TRUE(m.atm_open(l).empty()) << "ATM acted in layer " << l;
  }
  const auto st = m.atm_stats();
  ASSERT_EQ(st.size(), 2u);
  for (const auto& s : st) {
    EXPECT_DOUBLE_EQ(s.mu, 0.5);  // 4 groups of 8 positions
    // per sequence: t=0..7 see 1,1,2,2,3,3,4,4 keys = 20 of T(T+1)/2 = 36
    EXPECT_DOUBLE_EQ(s.visible_fraction, 20.0 / 36.0);
  }
  const auto ze = m.forward_logits(in.data(), false);
  for (int l = 0; l < cfg.L; ++l) EXPECT_TRUE(m.atm_open(l).empty()) << "ATM in eval, layer " << l;
  // Position 0 sees only itself either way; position 1 sees the merged pair in training.
  for (int b = 0; b < B; ++b) {
    double d0 = 0, d1 = 0;
    for (int v = 0; v < V; ++v) {
      d0 = std::max(d0, std::abs(double(zt[(size_t(b) * Tn + 0) * V + v] - ze[(size_t(b) * Tn + 0) * V + v])));
      d1 = std::max(d1, std::abs(double(zt[(size_t(b) * Tn + 1) * V + v] - ze[(size_t(b) * Tn + 1) * V + v])));
    }
    EXPECT_LT(d0, 1e-5) << "seq " << b;
    EXPECT_GT(d1, 1e-6) << "seq " << b << ": ATM did not change position 1";
  }
  // atm = false: no layer merges, training == eval.
  cfg.atm = false;
  Model<float> m2(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m2.init(13);
  const auto z2 = m2.forward_logits(in.data(), true);
  for (int l = 0; l < cfg.L; ++l) EXPECT_TRUE(m2.atm_open(l).empty());
  EXPECT_EQ(max_abs_diff(z2, ze), 0.0);

  // The flag inside layer_forward: layer 2 active in training only, map on X-tilde.
  ModelConfig lc = tiny_cfg(64, 8);
  lc.tau = -1.0;
  LayerHarness h(lc, 2);
  const LayerCtx<double> c = h.ctx(lc);
  LayerActs<double> a;
  a.allocate(c, 2);
  const auto x = randn(h.Nd(), 132);
  const std::vector<std::vector<double>> ctx{randn(h.Nd(), 133), randn(h.Nd(), 134)};
  const auto ye = run_layer(h, c, 2, x, ctx, false, a);
  EXPECT_FALSE(a.atm_active);
  const auto yt = run_layer(h, c, 2, x, ctx, true, a);
  EXPECT_TRUE(a.atm_active);
  std::vector<uint8_t> open(alt.size());
  h.ops->download(open.data(), a.open, open.size());
  EXPECT_EQ(open, alt);
  const int d = lc.d;
  for (int b = 0; b < h.B; ++b) {
    double d0 = 0, d1 = 0;
    for (int j = 0; j < d; ++j) {
      d0 = std::max(d0, std::abs(yt[(size_t(b) * h.Tn + 0) * d + j] - ye[(size_t(b) * h.Tn + 0) * d + j]));
      d1 = std::max(d1, std::abs(yt[(size_t(b) * h.Tn + 1) * d + j] - ye[(size_t(b) * h.Tn + 1) * d + j]));
    }
    EXPECT_LT(d0, 1e-12);
    EXPECT_GT(d1, 1e-8);
  }
  run_layer(h, c, 1, x, ctx, true, a);  // layer 1 is not an ATM layer
  EXPECT_FALSE(a.atm_active);
}

// ===================================================================================
// WiolaModel (3): shape; KV cache; incremental match
// ===================================================================================

TEST(PaperModel, Shape) {
  const ModelConfig cfg = tiny_cfg(64, 16);
  auto ops = test_backend<float>();
  const int B = 2, Tn = cfg.T, V = cfg.V;
  Model<float> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(17);
  EXPECT_EQ(int64_t(m.layout().n_elements()), cfg.param_count());
  auto in = rand_tokens(size_t(B) * Tn, V, 141);
  const auto z = m.forward_logits(in.data(), false);
  ASSERT_EQ(z.size(), size_t(B) * Tn * V);  // [B, T, V]
  EXPECT_TRUE(all_finite(z));
  // Sequences are independent; positions are causal.
  auto in2 = in;
  in2[size_t(1) * Tn + 3] = (in2[size_t(1) * Tn + 3] + 1) % V;  // seq 1, pos 3
  in2[10] = (in2[10] + 7) % V;                                    // seq 0, pos 10
  const auto z2 = m.forward_logits(in2.data(), false);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      double mx = 0;
      for (int v = 0; v < V; ++v)
        mx = std::max(mx, std::abs(double(z2[(size_t(b) * Tn + t) * V + v] - z[(size_t(b) * Tn + t) * V + v])));
      const int changed = b == 0 ? 10 : 3;
      if (t < changed) EXPECT_LT(mx, 1e-6) << "seq " << b << " pos " << t << " sees the future";
      else EXPECT_GT(mx, 1e-7) << "seq " << b << " pos " << t << " ignores its prefix";
    }
  EXPECT_THROW(
      {
        auto bad = in;
        bad[0] = V;
        m.forward_logits(bad.data(), false);
      },
      Error);
}

TEST(PaperModel, KvCache) {
  const ModelConfig cfg = tiny_cfg(64, 16);
  auto ops = test_backend<float>();
  const int B = 2, cap = 20, kvd = cfg.Hkv * cfg.dh();
  Model<float> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(19);
  KvCache<float> kc = m.make_cache(cap);
  EXPECT_EQ(kc.B, B);
  EXPECT_EQ(kc.capacity, cap);
  EXPECT_EQ(kc.len, 0);
  ASSERT_EQ(kc.k.size(), size_t(cfg.L));
  ASSERT_EQ(kc.v.size(), size_t(cfg.L));
  // Running sums of S(-1) .. S(L-2): L summaries.
  ASSERT_EQ(kc.carry.size(), size_t(cfg.L));
  for (int l = 0; l < cfg.L; ++l) {
    EXPECT_EQ(kc.k[size_t(l)].size(), size_t(B) * cap * kvd);
    EXPECT_EQ(kc.v[size_t(l)].size(), size_t(B) * cap * kvd);
    for (float v : down(*ops, kc.k[size_t(l)].data(), kc.k[size_t(l)].size())) ASSERT_EQ(v, 0.0f);
  }
  for (const auto& cs : kc.carry) {
    EXPECT_EQ(cs.size(), size_t(B) * cfg.d);
    for (float v : down(*ops, cs.data(), cs.size())) ASSERT_EQ(v, 0.0f);
  }
  // Fill to capacity (beyond the training window T = 16) in two chunks.
  const auto ids = rand_tokens(size_t(B) * cap, cfg.V, 151);
  std::vector<int32_t> c1, c2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < cap; ++t) (t < 16 ? c1 : c2).push_back(ids[size_t(b) * cap + t]);
  EXPECT_THROW(m.forward_cached(ids.data(), 17, kc), Error);  // n > T
  EXPECT_THROW(m.forward_cached(ids.data(), 0, kc), Error);
  EXPECT_EQ(kc.len, 0);
  const auto z1 = m.forward_cached(c1.data(), 16, kc);
  EXPECT_EQ(z1.size(), size_t(B) * 16 * cfg.V);
  const auto z2 = m.forward_cached(c2.data(), 4, kc);
  EXPECT_EQ(z2.size(), size_t(B) * 4 * cfg.V);
  EXPECT_TRUE(all_finite(z1));
  EXPECT_TRUE(all_finite(z2));
  EXPECT_EQ(kc.len, cap);
  const int32_t one[2] = {1, 2};
  EXPECT_THROW(m.forward_cached(one, 1, kc), Error);  // full
  EXPECT_EQ(kc.len, cap);
  KvCache<float> wrong_b;
  {
    Model<float> m1(*ops, cfg, ModelShard{}, nullptr, ModelOptions{1, false, false});
    wrong_b = m1.make_cache(4);
  }
  EXPECT_EQ(wrong_b.B, 1);
  EXPECT_THROW(m.forward_cached(one, 1, wrong_b), Error);  // cache for another batch
}

TEST(PaperModel, IncrementalMatch) {
  const ModelConfig cfg = tiny_cfg(64, 16);
  auto ops = test_backend<float>();
  const int B = 2, Tn = cfg.T, V = cfg.V;
  Model<float> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(23);
  const auto in = rand_tokens(size_t(B) * Tn, V, 161);
  const auto full = m.forward_logits(in.data(), false);
  auto cached = [&](const std::vector<int>& chunks) {
    KvCache<float> kc = m.make_cache(Tn);
    std::vector<float> out(full.size());
    int pos = 0;
    for (int n : chunks) {
      std::vector<int32_t> ids;
      for (int b = 0; b < B; ++b)
        for (int t = pos; t < pos + n; ++t) ids.push_back(in[size_t(b) * Tn + t]);
      const auto z = m.forward_cached(ids.data(), n, kc);  // [B, n, V]
      for (int b = 0; b < B; ++b)
        std::copy(z.begin() + long(b) * n * V, z.begin() + long(b + 1) * n * V,
                  out.begin() + (long(b) * Tn + pos) * V);
      pos += n;
    }
    EXPECT_EQ(pos, Tn);
    EXPECT_EQ(kc.len, Tn);
    return out;
  };
  const double two = max_abs_diff(cached({5, 11}), full);  // the paper's two-chunk test
  EXPECT_LT(two, 1e-4);
  const double ones = max_abs_diff(cached(std::vector<int>(size_t(Tn), 1)), full);
  EXPECT_LT(ones, 1e-4);
  const double mixed = max_abs_diff(cached({1, 6, 2, 7}), full);
  EXPECT_LT(mixed, 1e-4);
  RecordProperty("max_abs_diff_two_chunks", std::to_string(two));
}

// ===================================================================================
// WiolaForCausalLM (4): loss; logits; generation; param count
// ===================================================================================

TEST(PaperCausalLM, Loss) {
  ModelConfig cfg = tiny_cfg(64, 16);
  cfg.atm = false;
  auto ops = test_backend<float>();
  const int B = 2, Tn = cfg.T;
  Model<float> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(29);
  const auto tok = rand_tokens(size_t(B) * (Tn + 1), cfg.V, 171);
  const double ev = m.eval_loss(tok.data());
  EXPECT_NEAR(ev / (B * Tn), std::log(double(cfg.V)), 0.1) << "init loss is not ~ln V";
  m.zero_grads();
  const double tr = m.train_micro_step(tok.data(), 1.0 / (B * Tn));
  EXPECT_NEAR(tr, ev, 1e-9 * std::abs(ev)) << "training loss != eval loss with ATM off";
  const auto g = down(*ops, m.grads(), m.n_params());
  EXPECT_TRUE(all_finite(g));
  EXPECT_GT(max_abs_diff(g, std::vector<float>(g.size(), 0.0f)), 0.0);
  // The loss reads the targets (inputs shifted by one): changing only the
  // last target of sequence 0 changes it.
  auto tok2 = tok;
  tok2[size_t(Tn)] = (tok2[size_t(Tn)] + 1) % cfg.V;
  EXPECT_NE(m.eval_loss(tok2.data()), ev);
  // A step of plain SGD along -g lowers the loss.
  auto p = down(*ops, m.params(), m.n_params());
  for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.5f * g[i];
  ops->upload(m.params(), p.data(), p.size() * sizeof(float));
  m.refresh_weights();
  EXPECT_LT(m.eval_loss(tok.data()), ev);
}

TEST(PaperCausalLM, Logits) {
  ModelConfig cfg = tiny_cfg(64, 16);
  cfg.atm = false;
  auto ops = test_backend<float>();
  const int B = 2, Tn = cfg.T, V = cfg.V;
  Model<float> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{B, false, true});
  m.init(31);
  const auto tok = rand_tokens(size_t(B) * (Tn + 1), V, 181);
  std::vector<int32_t> in, tg;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t) {
      in.push_back(tok[size_t(b) * (Tn + 1) + t]);
      tg.push_back(tok[size_t(b) * (Tn + 1) + t + 1]);
    }
  const auto z = m.forward_logits(in.data(), false);
  ASSERT_EQ(z.size(), size_t(B) * Tn * V);
  double ce = 0;
  int n_argmax_hits = 0;
  for (int n = 0; n < B * Tn; ++n) {
    const float* row = z.data() + size_t(n) * V;
    double mx = -1e300;
    int arg = 0;
    for (int v = 0; v < V; ++v)
      if (row[v] > mx) { mx = row[v]; arg = v; }
    double se = 0;
    for (int v = 0; v < V; ++v) se += std::exp(double(row[v]) - mx);
    const double tok_ce = std::log(se) + mx - row[tg[size_t(n)]];
    EXPECT_GE(tok_ce, 0.0);
    if (arg == tg[size_t(n)]) {
      ++n_argmax_hits;
      EXPECT_LE(tok_ce, std::log(double(V)) + 1e-9);  // the argmax has CE <= ln V
    }
    ce += tok_ce;
  }
  const double ev = m.eval_loss(tok.data());
  EXPECT_NEAR(ce / (B * Tn), ev / (B * Tn), 1e-5);
  (void)n_argmax_hits;
  // The training forward's logits (keep_logits) are these logits.
  m.zero_grads();
  m.train_micro_step(tok.data(), 1.0);
  EXPECT_LT(max_abs_diff(m.last_logits(), z), 1e-6);
  // Tied head behind the final norm: gamma_final = 0 gives zero logits, CE = ln V.
  set_param(m, *ops, "model.norm.weight", std::vector<float>(size_t(cfg.d), 0.0f));
  for (float v : m.forward_logits(in.data(), false)) ASSERT_EQ(v, 0.0f);
  EXPECT_NEAR(m.eval_loss(tok.data()) / (B * Tn), std::log(double(V)), 1e-6);
  // Tied: scaling the embedding by s with gamma = 1 scales the logits by s
  // (the final norm removes the scale of the input side).
  set_param(m, *ops, "model.norm.weight", std::vector<float>(size_t(cfg.d), 1.0f));
  auto E = get_param(m, *ops, "model.embed_tokens.weight");
  for (auto& v : E) v *= 2.0f;
  set_param(m, *ops, "model.embed_tokens.weight", E);
  const auto z2 = m.forward_logits(in.data(), false);
  // Not exactly 2x (the layers see a scaled residual stream), but the head
  // uses E: logits change.
  EXPECT_GT(max_abs_diff(z2, z), 1e-4);
}

// Greedy generation of n_new tokens after a 4-token prompt, (a) with the KV
// cache (prompt as one chunk, then one token at a time) and (b) by a full
// evaluation forward of the padded window per step (causality makes
// position p independent of the padding after it). Returns the tokens.
template <class T>
std::vector<int32_t> check_greedy(double init_std, double tol) {
  ModelConfig cfg = tiny_cfg(64, 16);
  cfg.init_std = init_std;
  auto ops = test_backend<T>();
  const int Tn = cfg.T, V = cfg.V, n_prompt = 4, n_new = 8;
  Model<T> m(*ops, cfg, ModelShard{}, nullptr, ModelOptions{1, false, false});
  m.init(37);
  const auto prompt = rand_tokens(size_t(n_prompt), V, 191);
  auto argmax = [&](const T* row) {
    return int32_t(std::max_element(row, row + V) - row);
  };
  std::vector<int32_t> gen_cached;
  std::vector<std::vector<T>> rows_cached;
  {
    KvCache<T> kc = m.make_cache(Tn);
    auto z = m.forward_cached(prompt.data(), n_prompt, kc);
    EXPECT_EQ(z.size(), size_t(n_prompt) * V);
    std::vector<T> last(z.end() - V, z.end());
    for (int i = 0; i < n_new; ++i) {
      rows_cached.push_back(last);
      const int32_t tok = argmax(last.data());
      gen_cached.push_back(tok);
      if (i + 1 == n_new) break;
      z = m.forward_cached(&tok, 1, kc);
      EXPECT_EQ(z.size(), size_t(V));
      last = z;
    }
    EXPECT_EQ(kc.len, n_prompt + n_new - 1);
  }
  std::vector<int32_t> seq = prompt, gen_full;
  double max_diff = 0;
  for (int i = 0; i < n_new; ++i) {
    std::vector<int32_t> in(size_t(Tn), 0);
    std::copy(seq.begin(), seq.end(), in.begin());
    const auto z = m.forward_logits(in.data(), false);
    const T* row = z.data() + (seq.size() - 1) * size_t(V);
    max_diff = std::max(max_diff, max_abs_diff(std::vector<T>(row, row + V), rows_cached[size_t(i)]));
    const int32_t tok = argmax(row);
    gen_full.push_back(tok);
    seq.push_back(tok);
  }
  EXPECT_EQ(gen_cached, gen_full) << "init_std " << init_std;
  EXPECT_LT(max_diff, tol) << "init_std " << init_std;
  // Causality behind the padding: another pad token gives the same logits.
  std::vector<int32_t> a(size_t(Tn), 0), b(size_t(Tn), 5);
  std::copy(seq.begin(), seq.end(), a.begin());
  std::copy(seq.begin(), seq.end(), b.begin());
  const auto za = m.forward_logits(a.data(), false), zb = m.forward_logits(b.data(), false);
  const long used = long(seq.size()) * V;
  EXPECT_LT(max_abs_diff(std::vector<T>(za.begin(), za.begin() + used),
                         std::vector<T>(zb.begin(), zb.begin() + used)), tol);
  return gen_full;
}

TEST(PaperCausalLM, Generation) {
  // The docs/model.md model (init std 0.02) in fp32, the training type.
  check_greedy<float>(0.02, 1e-4);
  // At init std 0.02 greedy decoding settles on one token; a model with
  // larger weights (in double: fp32 rounding grows with the weights) makes
  // every step's choice depend on the context.
  const auto gen = check_greedy<double>(0.3, 1e-9);
  std::vector<int32_t> distinct = gen;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_GE(distinct.size(), 4u) << "greedy sequence is degenerate; the check is weak";
}

TEST(PaperCausalLM, ParamCount) {
  const std::vector<std::pair<const char*, int64_t>> presets{
      {"wiola-120m", 147297804}, {"wiola-360m", 318048272},
      {"wiola-700m", 1068518424}, {"wiola-1.5b", 2179698716}};
  for (const auto& [name, n] : presets) {
    const ModelConfig c = model_preset(name);
    EXPECT_EQ(c.param_count(), n) << name;
    // docs/model.md §1 formula, written out independently.
    const int64_t d = c.d, dh = c.d / c.H;
    const int64_t per = 2 * d * c.H * dh + int64_t(c.H) * dh * d + 4 * d * c.Hkv * dh +
                        3 * d * c.dA + 2 * d * c.dB + 2 * d * d + 4 * d + 1;
    EXPECT_EQ(c.L * per + int64_t(c.V) * d + 2 * d, n) << name;
  }
  // The flat parameter layout holds exactly that many values (no allocation
  // here), plus the padding that aligns its tensors: φ's 127 per layer in
  // these presets (every other tensor is a multiple of 128 elements).
  EXPECT_EQ(int64_t(ParamLayout(model_preset("wiola-120m"), ModelShard{}).n_elements()), 147297804);
  EXPECT_EQ(int64_t(ParamLayout(model_preset("wiola-360m"), ModelShard{}).n_elements()), 318048272);
  EXPECT_EQ(int64_t(ParamLayout(model_preset("wiola-360m"), ModelShard{}).total()), 318048272 + 16 * 127);
  // The 360m published file: 318,048,272 fp32 values = 1,272,193,088 bytes of data.
  EXPECT_EQ(int64_t(ParamLayout(model_preset("wiola-360m"), ModelShard{}).n_elements()) * 4, 1272193088);
  // Tensor count: 18 per layer + embedding + final gamma, delta.
  const ModelConfig t = tiny_cfg();
  const ParamLayout lay(t, ModelShard{});
  EXPECT_EQ(lay.entries().size(), size_t(18 * t.L + 3));
  EXPECT_EQ(int64_t(lay.n_elements()), t.param_count());
  EXPECT_EQ(int64_t(ParamLayout(t, ModelShard{}, 1).total()), t.param_count());  // packed: no padding
  EXPECT_EQ(lay.find("model.embed_tokens.weight").size(), size_t(t.V) * t.d);
  EXPECT_EQ(lay.find("model.layers.0.self_attn.ctx_gate_logit").size(), 1u);
}

}  // namespace
}  // namespace wiola
