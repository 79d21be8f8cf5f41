// The CPU kernels against the scalar reference formulas of kernels/scalar.h
// (the same WIOLA_HD functions the CUDA kernels compute with), so both
// backends answer to one definition of SwiGLU, GELU, the fusion gate,
// WiolaRMSNorm, SRPE and the AdamW update.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/scalar.h"
#include "tests/ops/test_util.h"

namespace wiola::test {
namespace {

TEST(ScalarReference, ActivationsAndGates) {
  CpuOps<double> D;
  const size_t n = 2000;
  const Vec g = randn(n, 2.0), u = randn(n), pre = randn(n, 3.0), a = randn(n), b = randn(n), dy = randn(n);
  Vec h(n), dg(n), du(n), y(n), dx(n), f(n);
  D.swiglu_fwd(g.data(), u.data(), n, h.data());
  D.swiglu_bwd(g.data(), u.data(), dy.data(), n, dg.data(), du.data());
  D.gelu_fwd(g.data(), n, y.data());
  D.gelu_bwd(g.data(), dy.data(), n, dx.data());
  D.fusion_fwd(pre.data(), a.data(), b.data(), nullptr, n, f.data());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(h[i], ref::swiglu(g[i], u[i]), 1e-13 * (1 + std::abs(h[i])));
    EXPECT_NEAR(dg[i], dy[i] * ref::swiglu_dg(g[i], u[i]), 1e-12 * (1 + std::abs(dg[i])));
    EXPECT_NEAR(du[i], dy[i] * ref::swiglu_du(g[i]), 1e-12 * (1 + std::abs(du[i])));
    EXPECT_NEAR(y[i], ref::gelu(g[i]), 1e-13 * (1 + std::abs(y[i])));
    EXPECT_NEAR(dx[i], dy[i] * ref::gelu_dx(g[i]), 1e-12 * (1 + std::abs(dx[i])));
    EXPECT_NEAR(f[i], ref::fusion(pre[i], a[i], b[i]), 1e-13 * (1 + std::abs(f[i])));
  }
}

TEST(ScalarReference, NormSrpeAdamw) {
  CpuOps<double> D;
  const int N = 7, d = 24;
  const Vec x = randn(size_t(N) * d), gam = randn(d, 0.5, 1.0), del = randn(d, 0.1);
  Vec y(x.size()), rstd(N);
  D.rmsnorm_fwd(x.data(), gam.data(), del.data(), N, d, 1e-6, y.data(), rstd.data(), nullptr);
  for (int r = 0; r < N; ++r) {
    double ms = 0;
    for (int j = 0; j < d; ++j) ms += (x[size_t(r) * d + j] + del[j]) * (x[size_t(r) * d + j] + del[j]);
    const double rs = 1.0 / std::sqrt(ms / d + 1e-6);
    EXPECT_NEAR(rstd[r], rs, 1e-13 * rs);
    for (int j = 0; j < d; ++j)
      EXPECT_NEAR(y[size_t(r) * d + j], ref::rmsnorm(x[size_t(r) * d + j], gam[j], del[j], rs), 1e-12);
  }
  // SRPE: one head, one position, a pair table (c, s).
  const int dh = 8;
  Vec q = randn(dh), table(dh);
  for (int j = 0; j < dh / 2; ++j) {
    table[size_t(2 * j)] = std::cos(0.3 * (j + 1)) * 1.05;
    table[size_t(2 * j + 1)] = std::sin(0.3 * (j + 1)) * 1.05;
  }
  Vec qf = q, qi = q;
  D.srpe_apply(qf.data(), 1, 1, 1, dh, table.data(), false);
  D.srpe_apply(qi.data(), 1, 1, 1, dh, table.data(), true);
  for (int j = 0; j < dh / 2; ++j) {
    double a = q[size_t(j)], b = q[size_t(j + dh / 2)], ai = a, bi = b;
    ref::srpe_pair(a, b, table[size_t(2 * j)], table[size_t(2 * j + 1)], false);
    ref::srpe_pair(ai, bi, table[size_t(2 * j)], table[size_t(2 * j + 1)], true);
    EXPECT_NEAR(qf[size_t(j)], a, 1e-14);
    EXPECT_NEAR(qf[size_t(j + dh / 2)], b, 1e-14);
    EXPECT_NEAR(qi[size_t(j)], ai, 1e-14);
    EXPECT_NEAR(qi[size_t(j + dh / 2)], bi, 1e-14);
  }
  // AdamW, a few steps with bias correction.
  const size_t n = 100;
  Vec p = randn(n), m(n, 0.0), v(n, 0.0);
  Vec rp = p, rm = m, rv = v;
  for (int t = 1; t <= 3; ++t) {
    Vec g = randn(n);
    const double bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.95, t);
    D.adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, bc1, bc2, nullptr, false);
    for (size_t i = 0; i < n; ++i) ref::adamw(rp[i], g[i], rm[i], rv[i], 1e-3, 0.9, 0.95, 1e-8, 0.1, bc1, bc2);
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], rp[i], 1e-14);
    EXPECT_NEAR(m[i], rm[i], 1e-15);
    EXPECT_NEAR(v[i], rv[i], 1e-15);
  }
}

}  // namespace
}  // namespace wiola::test
