// The paper's "Unit Test Coverage" table (wiola-paper.tex, Table tab:tests:
// 22 tests over eight components), rewritten against this implementation's
// API (ops, layer_forward, Model) with assertions that fail on a wrong
// implementation: hand computations of the docs/model.md §2 formulas, exact
// invariances, and the cached-decoding and parameter-count contracts. The
// first four components here, the rest in test_paper_model.cpp; shared
// helpers in paper_helpers.h.
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
#include "model/atm.h"
#include "model/config.h"
#include "model/layer.h"
#include "model/model.h"
#include "model/params.h"
#include "model/srpe.h"
#include "tests/model/paper_helpers.h"
#include "util/error.h"

namespace wiola {
namespace {

using namespace paper;

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
    for (int j = 0; j < d; ++j) EXPECT_NEAR(y[size_t(i) * d + j], ref[size_t(j)], 1e-13) << i << "," << j;
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
    ops->rmsnorm_fwd(bx.data(), bg.data(), bd.data(), int(xin.size() / d), d, eps, by.data(), br.data(), nullptr);
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
    for (size_t i = 0; i < chunk.size(); ++i) EXPECT_EQ(chunk[i], whole[size_t(pos0) * nh * dh + i]);
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
  for (size_t i = 0; i < probs.size(); i += size_t(nc)) EXPECT_NEAR(probs[i] + probs[i + 1], 1.0, 1e-12);
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
            for (int i = 0; i < kvd; ++i) mx = std::max(mx, std::abs(double(h[(size_t(b) * cap + r) * kvd + i])));
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
                           down(*ops, kc.k[size_t(l)].data(), kc.k[size_t(l)].size())),
              1e-5);
    EXPECT_LT(max_abs_diff(down(*ops, one.v[size_t(l)].data(), one.v[size_t(l)].size()),
                           down(*ops, kc.v[size_t(l)].data(), kc.v[size_t(l)].size())),
              1e-5);
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
        EXPECT_NEAR(o_ctx[size_t(n) * hd + size_t(hh) * dh + i], vctx[size_t(n) * kvd + size_t(hh % Hkv) * dh + i],
                    1e-12)
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
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], xh[i] + sigmoid(pre[i]) * a0[i], 1e-12);
  set_param(h.model, ops, nB, DB);

  // Stream A silenced: stream B untouched, a = 0, out = X-half + (1 - alpha) b.
  set_param(h.model, ops, nA, std::vector<double>(DA.size(), 0.0));
  y = run_layer(h, c, l, x, ctx, false, a);
  EXPECT_LT(max_abs_diff(down(ops, a.b, h.Nd()), b0), 1e-15);
  for (double v : down(ops, a.a, h.Nd())) EXPECT_EQ(v, 0.0);
  xh = down(ops, a.xh, h.Nd());
  pre = matmul_t(b0, WF.data() + d, N, d, d, 2 * d);  // W_f's b-columns
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], xh[i] + (1 - sigmoid(pre[i])) * b0[i], 1e-12);
}

}  // namespace
}  // namespace wiola
