// The dispatched float kernels (docs/cpu.md) on every compiled SIMD target
// this CPU can run, against double-precision scalar formulas, on awkward
// lengths (tails) and unaligned pointers, with edge values. A compiled target
// the CPU cannot run is a skipped test that names it. Also: bit-identical
// repeats, results independent of the OpenMP thread count, WIOLA_SIMD errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "util/error.h"

namespace wiola::test {
namespace {

using Fv = std::vector<float>;
constexpr float kInf = std::numeric_limits<float>::infinity();
const size_t kLengths[] = {1, 3, 17, 1000, 4099};

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// n floats starting one element past a 64-byte boundary (unaligned for every
// vector width), normal with standard deviation `sd`; a few edge values
// (large |x|) when `edges`.
struct Buf {
  std::vector<float> mem;
  float* p;
  size_t n;
  Buf(size_t n_, float sd, uint64_t seed, bool edges = false) : mem(n_ + 32), n(n_) {
    uintptr_t a = reinterpret_cast<uintptr_t>(mem.data());
    p = mem.data() + ((64 - a % 64) % 64) / sizeof(float) + 1;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, sd);
    for (size_t i = 0; i < n; ++i) p[i] = nd(rng);
    if (edges) {
      const float e[] = {30.0f, -30.0f, 90.0f, -90.0f, 1e4f, -1e4f, 0.0f, -0.0f, 5.0f, -5.0f};
      for (size_t k = 0; k < std::size(e) && k * 7 < n; ++k) p[k * 7] = e[k];
    }
  }
  float& operator[](size_t i) { return p[i]; }
  Fv vec() const { return Fv(p, p + n); }
};

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// |got - want| <= tol: reports the index and values on failure.
#define EXPECT_CLOSE(got, want, tol, what, i)                                              \
  EXPECT_LE(std::abs(double(got) - double(want)), (tol))                                   \
      << what << " at " << (i) << " of n: got " << (got) << ", want " << (want)

class SimdTarget : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto ok = cpu::simd_supported_targets();
    if (!contains(ok, GetParam()))
      GTEST_SKIP() << "compiled SIMD target " << GetParam() << " cannot run on this CPU ("
                   << cpu::cpu_model_name() << "; it runs: " << joined(ok) << ")";
    cpu::simd_use_target(GetParam());
    ASSERT_EQ(std::string(cpu::simd_target_name()), GetParam());
  }
  void TearDown() override { cpu::simd_reset_target(); }
};

TEST(SimdTargets, Report) {
  const auto compiled = cpu::simd_compiled_targets(), ok = cpu::simd_supported_targets();
  std::vector<std::string> cannot;
  for (const auto& t : compiled)
    if (!contains(ok, t)) cannot.push_back(t);
  std::cout << "  CPU " << cpu::cpu_model_name() << "; -march=" << cpu::simd_build_march()
            << "\n  compiled: " << joined(compiled) << "\n  runnable: " << joined(ok)
            << "\n  compiled but NOT runnable here (their tests skip): "
            << (cannot.empty() ? "none" : joined(cannot)) << "\n  in use: " << cpu::simd_target_name()
            << "\n";
  ASSERT_FALSE(ok.empty());
  for (const auto& t : ok) EXPECT_TRUE(contains(compiled, t)) << t;
  EXPECT_TRUE(contains(ok, cpu::simd_target_name()));
  EXPECT_FALSE(cpu::cpu_model_name().empty());
}

TEST(SimdTargets, BadNamesAreErrorsListingUsableTargets) {
  for (const char* bad : {"bogus", "ssse3", "avx512_dl"}) {
    try {
      cpu::simd_use_target(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(bad), std::string::npos) << m;
      EXPECT_NE(m.find("usable on this CPU: "), std::string::npos) << m;
      EXPECT_NE(m.find(cpu::simd_supported_targets().front()), std::string::npos) << m;
    }
  }
  cpu::simd_reset_target();
}

// add, axpy, scale: one float rounding each (two without FMA), so within
// 2^-23 of the sum of the magnitudes of the terms.
TEST_P(SimdTarget, Elementwise) {
  for (size_t n : kLengths) {
    Buf a(n, 1, 1), b(n, 3, 2), y(n, 1, 3), out(n, 0, 4);
    const Fv y0 = y.vec();
    cpu::add(a.p, b.p, out.p, n);
    for (size_t i = 0; i < n; ++i)
      EXPECT_CLOSE(out[i], double(a[i]) + b[i], 0x1p-23 * (std::abs(a[i]) + std::abs(b[i])), "add", i);
    cpu::axpy(0.37f, a.p, y.p, n);
    for (size_t i = 0; i < n; ++i)
      EXPECT_CLOSE(y[i], 0.37 * a[i] + y0[i], 0x1p-23 * (0.37 * std::abs(a[i]) + std::abs(y0[i])),
                   "axpy", i);
    Fv s = a.vec();
    cpu::scale(s.data(), -1.7f, n);
    for (size_t i = 0; i < n; ++i) EXPECT_CLOSE(s[i], -1.7 * a[i], 0x1p-23 * 1.7 * std::abs(a[i]), "scale", i);
  }
}

// sum, sum_squares: double accumulation, so within 1e-13 of sum |term| (far
// below float resolution) on sizes that cross the 8192-element chunks.
TEST_P(SimdTarget, Sums) {
  for (size_t n : {size_t(1), size_t(3), size_t(17), size_t(1000), size_t(4099), size_t(20001)}) {
    Buf x(n, 2, 5);
    long double s = 0, ss = 0, abs = 0;
    for (size_t i = 0; i < n; ++i) {
      s += x[i];
      ss += (long double)x[i] * x[i];
      abs += std::abs(x[i]);
    }
    EXPECT_NEAR(cpu::sum(x.p, n), double(s), 1e-13 * double(abs)) << n;
    EXPECT_NEAR(cpu::sum_squares(x.p, n), double(ss), 1e-13 * double(ss)) << n;
  }
}

// SwiGLU, GELU, fusion, sigmoid gate, blend: exp_poly and erf_poly (a few
// ulp; erf ~1e-7 absolute) and a handful of roundings: within 2e-6 relative
// to the magnitude of the terms, 1e-6 absolute for GELU's erf.
TEST_P(SimdTarget, Activations) {
  for (size_t n : kLengths) {
    Buf g(n, 3, 11, true), u(n, 1, 12), dy(n, 1, 13), a(n, 1, 14), b(n, 1, 15), h(n, 0, 16),
        dg(n, 0, 17), du(n, 0, 18), o(n, 0, 19);
    cpu::swiglu_fwd(g.p, u.p, n, h.p);
    cpu::swiglu_bwd(g.p, u.p, dy.p, n, dg.p, du.p);
    for (size_t i = 0; i < n; ++i) {
      const double x = g[i], s = sig(x);
      const double mag = std::abs(x * u[i]);
      EXPECT_CLOSE(h[i], x * s * u[i], 2e-6 * mag + 1e-30, "swiglu_fwd", i);
      EXPECT_CLOSE(dg[i], dy[i] * u[i] * s * (1 + x * (1 - s)),
                   2e-6 * std::abs(dy[i] * u[i]) * (1 + std::abs(x)) + 1e-30, "swiglu_bwd dg", i);
      EXPECT_CLOSE(du[i], dy[i] * x * s, 2e-6 * std::abs(dy[i] * x) + 1e-30, "swiglu_bwd du", i);
    }
    cpu::gelu_fwd(g.p, n, h.p);
    cpu::gelu_bwd(g.p, dy.p, n, dg.p);
    for (size_t i = 0; i < n; ++i) {
      const double x = g[i], cdf = 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
      const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
      EXPECT_CLOSE(h[i], x * cdf, 1e-6 * (1 + std::abs(x)), "gelu_fwd", i);
      EXPECT_CLOSE(dg[i], dy[i] * (cdf + x * pdf), 1e-6 * std::abs(dy[i]) * (1 + std::abs(x)), "gelu_bwd", i);
    }
    cpu::fusion_fwd(g.p, a.p, b.p, static_cast<const float*>(nullptr), n, o.p);
    for (size_t i = 0; i < n; ++i) {
      const double s = sig(g[i]);
      EXPECT_CLOSE(o[i], s * a[i] + (1 - s) * b[i], 2e-6 * (std::abs(a[i]) + std::abs(b[i])), "fusion_fwd", i);
    }
    // With the residual: exactly the add op after the gate.
    Buf res(n, 1, 23), fused(n, 0, 24), sum(n, 0, 25);
    cpu::fusion_fwd(g.p, a.p, b.p, res.p, n, fused.p);
    cpu::add(res.p, o.p, sum.p, n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(bits(fused[i]), bits(sum[i])) << "fusion_fwd + residual " << i;
    Buf dpre(n, 0, 20), da(n, 0, 21), db(n, 0, 22);
    cpu::fusion_bwd(g.p, a.p, b.p, dy.p, n, dpre.p, da.p, db.p);
    for (size_t i = 0; i < n; ++i) {
      const double s = sig(g[i]), c = sig(-double(g[i]));
      EXPECT_CLOSE(dpre[i], dy[i] * (double(a[i]) - b[i]) * s * c,
                   2e-6 * std::abs(dy[i]) * (std::abs(a[i]) + std::abs(b[i])) * s * c + 1e-37, "fusion_bwd dpre", i);
      EXPECT_CLOSE(da[i], dy[i] * s, 2e-6 * std::abs(dy[i] * s) + 1e-37, "fusion_bwd da", i);
      // 1 - sigma keeps its relative precision for large x (sigmoid2).
      EXPECT_CLOSE(db[i], dy[i] * c, 2e-6 * std::abs(dy[i] * c) + 1e-37, "fusion_bwd db", i);
    }
    cpu::sigmoid_gate_fwd(g.p, a.p, n, o.p);
    cpu::sigmoid_gate_bwd(g.p, a.p, dy.p, n, dpre.p, da.p);
    for (size_t i = 0; i < n; ++i) {
      const double s = sig(g[i]), c = sig(-double(g[i]));
      EXPECT_CLOSE(o[i], s * a[i], 2e-6 * std::abs(s * a[i]) + 1e-37, "sigmoid_gate_fwd", i);
      EXPECT_CLOSE(dpre[i], dy[i] * a[i] * s * c, 2e-6 * std::abs(dy[i] * a[i] * s * c) + 1e-37,
                   "sigmoid_gate_bwd dpre", i);
      EXPECT_CLOSE(da[i], dy[i] * s, 2e-6 * std::abs(dy[i] * s) + 1e-37, "sigmoid_gate_bwd dx", i);
    }
    const double phi = -0.4, beta = sig(phi);
    cpu::blend_fwd(a.p, b.p, phi, n, o.p);
    double want = 0, mag = 0;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_CLOSE(o[i], (1 - beta) * a[i] + beta * b[i], 4e-7 * (std::abs(a[i]) + std::abs(b[i])), "blend_fwd", i);
      want += double(dy[i]) * (double(b[i]) - a[i]);
      mag += std::abs(dy[i]) * (std::abs(a[i]) + std::abs(b[i]));
    }
    const double dphi = cpu::blend_bwd(a.p, b.p, phi, dy.p, n, da.p, db.p);
    EXPECT_NEAR(dphi, want * beta * (1 - beta), 1e-12 * mag) << n;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_CLOSE(da[i], (1 - beta) * dy[i], 2e-7 * std::abs(dy[i]), "blend_bwd d_self", i);
      EXPECT_CLOSE(db[i], beta * dy[i], 2e-7 * std::abs(dy[i]), "blend_bwd d_ctx", i);
    }
  }
}

// WiolaRMSNorm rows of width d (tails inside each row): rstd and y within
// 1e-6 relative, dx, dgamma, ddelta within 1e-5 of the largest term.
TEST_P(SimdTarget, RmsNorm) {
  for (int d : {1, 3, 17, 1000, 4099}) {
    const int N = 5;
    const size_t n = size_t(N) * d;
    Buf x(n, 1, 31), g(d, 0.3f, 32), dl(d, 0.5f, 33), dy(n, 1, 34), y(n, 0, 35), r(N, 0, 36);
    for (int j = 0; j < d; ++j) g[j] += 1.0f;
    cpu::rmsnorm_fwd(x.p, g.p, dl.p, N, d, 1e-6, y.p, r.p);
    Fv dx(n, 0.5f), dgam(d, 0.25f), ddel(d, -0.25f);
    cpu::rmsnorm_bwd(x.p, g.p, dl.p, r.p, dy.p, N, d, dx.data(), dx.data(), dgam.data(), ddel.data());
    std::vector<double> wg(d, 0.25), wd(d, -0.25);
    for (int i = 0; i < N; ++i) {
      const size_t o = size_t(i) * d;
      double ss = 0, c = 0;
      for (int j = 0; j < d; ++j) {
        const double z = double(x[o + j]) + dl[j];
        ss += z * z;
        c += double(g[j]) * dy[o + j] * z;
      }
      const double rs = 1.0 / std::sqrt(ss / d + 1e-6);
      EXPECT_NEAR(r[i], rs, 1e-6 * rs) << "rstd row " << i << " d " << d;
      double big = 0;
      for (int j = 0; j < d; ++j) big = std::max(big, std::abs(double(g[j]) * dy[o + j]) * rs);
      for (int j = 0; j < d; ++j) {
        const double z = double(x[o + j]) + dl[j];
        EXPECT_CLOSE(y[o + j], g[j] * z * rs, 1e-6 * std::abs(g[j] * z * rs) + 1e-30, "rmsnorm_fwd", o + j);
        const double dz = rs * (double(g[j]) * dy[o + j] - z * rs * rs * c / d);
        EXPECT_CLOSE(dx[o + j], 0.5 + dz, 1e-5 * big, "rmsnorm_bwd dx", o + j);
        wg[j] += dy[o + j] * z * rs;
        wd[j] += dz;
      }
    }
    for (int j = 0; j < d; ++j) {
      EXPECT_NEAR(dgam[j], wg[j], 1e-5 * (1 + std::abs(wg[j]))) << "dgamma " << j << " d " << d;
      EXPECT_NEAR(ddel[j], wd[j], 1e-5 * (1 + std::abs(wd[j]))) << "ddelta " << j << " d " << d;
    }
  }
}

// The fused forms are the unfused ops' bits: add_rmsnorm_fwd (in place, as
// the model calls it) = add, then rmsnorm_fwd; rmsnorm_bwd with a separate
// dres = copy, then accumulate; with no dres = zero, then accumulate.
TEST_P(SimdTarget, RmsNormFusedWithResidual) {
  for (int d : {1, 17, 1000, 4099}) {
    const int N = 5;
    const size_t n = size_t(N) * d;
    Buf x(n, 1, 51), br(n, 1, 52), g(d, 0.3f, 53), dl(d, 0.5f, 54), dy(n, 1, 55), dres(n, 1, 56);
    Fv s_ref(n), y_ref(n), r_ref(N), y(n), r(N);
    cpu::add(x.p, br.p, s_ref.data(), n);
    cpu::rmsnorm_fwd(s_ref.data(), g.p, dl.p, N, d, 1e-6, y_ref.data(), r_ref.data());
    Fv s(br.p, br.p + n);
    cpu::add_rmsnorm_fwd(x.p, s.data(), s.data(), g.p, dl.p, N, d, 1e-6, y.data(), r.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(s[i]), bits(s_ref[i])) << "sum " << i << " d " << d;
      ASSERT_EQ(bits(y[i]), bits(y_ref[i])) << "y " << i << " d " << d;
    }
    for (int i = 0; i < N; ++i) ASSERT_EQ(bits(r[i]), bits(r_ref[i])) << "rstd " << i << " d " << d;

    Fv dx_ref(dres.p, dres.p + n), dx(n, 7.0f), dz_ref(n, 0.0f), dz(n, 7.0f);
    Fv dg(d, 0.0f), dd(d, 0.0f);
    cpu::rmsnorm_bwd(s.data(), g.p, dl.p, r.data(), dy.p, N, d, dx_ref.data(), dx_ref.data(), dg.data(), dd.data());
    cpu::rmsnorm_bwd(s.data(), g.p, dl.p, r.data(), dy.p, N, d, dres.p, dx.data(), dg.data(), dd.data());
    cpu::rmsnorm_bwd(s.data(), g.p, dl.p, r.data(), dy.p, N, d, dz_ref.data(), dz_ref.data(), dg.data(), dd.data());
    cpu::rmsnorm_bwd(s.data(), g.p, dl.p, r.data(), dy.p, N, d, static_cast<const float*>(nullptr), dz.data(),
                     dg.data(), dd.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(dx[i]), bits(dx_ref[i])) << "dx = dres + dz, " << i << " d " << d;
      ASSERT_EQ(dz[i], dz_ref[i]) << "dx = dz, " << i << " d " << d;  // 0 + (-0) aside
    }
  }
}

// Cross-entropy rows: row max exact, sum-exp within 1e-6 relative, loss
// within 1e-5, the gradient within 1e-6 of scale.
TEST_P(SimdTarget, CrossEntropy) {
  for (int V : {1, 3, 17, 1000, 4099}) {
    const int N = 4;
    Buf z(size_t(N) * V, 3, 41);
    if (V > 3) z[1] = -200.0f;  // exp underflows to 0
    std::vector<int32_t> tg(N);
    for (int i = 0; i < N; ++i) tg[i] = (i * 7919) % V;
    Fv mx(N), se(N), tt(N), loss(N);
    cpu::ce_row_max(z.p, N, V, mx.data());
    cpu::ce_sumexp_target(z.p, tg.data(), N, V, 0, mx.data(), se.data(), tt.data());
    const Fv z0 = z.vec();
    const double scale = 0.25;
    cpu::ce_loss_grad(z.p, tg.data(), N, V, 0, mx.data(), se.data(), tt.data(), scale, loss.data());
    for (int i = 0; i < N; ++i) {
      const float* l = z0.data() + size_t(i) * V;
      const float m = *std::max_element(l, l + V);
      EXPECT_EQ(mx[i], m) << "row max, V " << V;
      double s = 0;
      for (int j = 0; j < V; ++j) s += std::exp(double(l[j]) - m);
      EXPECT_NEAR(se[i], s, 1e-6 * s) << "sumexp, V " << V;
      EXPECT_EQ(tt[i], l[tg[i]]);
      EXPECT_NEAR(loss[i], std::log(s) + m - l[tg[i]], 1e-5) << "loss, V " << V;
      for (int j = 0; j < V; ++j) {
        const double p = std::exp(double(l[j]) - m) / s;
        EXPECT_CLOSE(z[size_t(i) * V + j], scale * (p - (j == tg[i])), 1e-6 * scale, "ce grad", j);
      }
    }
  }
}

// AdamW in double per element, the same operations in the same order as the
// formula: bit-identical to it.
TEST_P(SimdTarget, AdamW) {
  for (size_t n : kLengths) {
    Buf p(n, 1, 51), g(n, 0.1f, 52), m(n, 0.01f, 53), v(n, 0.001f, 54);
    for (size_t i = 0; i < n; ++i) v[i] = std::abs(v[i]);
    const Fv p0 = p.vec(), m0 = m.vec(), v0 = v.vec();
    const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, bc1 = 1 - std::pow(b1, 3),
                 bc2 = 1 - std::pow(b2, 3);
    // Fused with the weight copy and the gradient's zeroing, on copies: the
    // same p, m, v bits, w = p, g = 0.
    Fv pf = p.vec(), gf = g.vec(), mf = m.vec(), vf = v.vec(), w(n, 7.0f);
    cpu::adamw(p.p, g.p, m.p, v.p, n, lr, b1, b2, eps, wd, bc1, bc2, static_cast<float*>(nullptr), false);
    cpu::adamw(pf.data(), gf.data(), mf.data(), vf.data(), n, lr, b1, b2, eps, wd, bc1, bc2, w.data(), true);
    EXPECT_EQ(pf, p.vec());
    EXPECT_EQ(mf, m.vec());
    EXPECT_EQ(vf, v.vec());
    EXPECT_EQ(w, p.vec());
    EXPECT_EQ(gf, Fv(n, 0.0f));
    const double decay = 1.0 - lr * wd, step = lr / bc1, rsbc2 = 1.0 / std::sqrt(bc2);
    for (size_t i = 0; i < n; ++i) {
      const double gi = g[i];
      const double mi = b1 * double(m0[i]) + (1.0 - b1) * gi;
      const double vi = b2 * double(v0[i]) + (1.0 - b2) * gi * gi;
      EXPECT_EQ(m[i], float(mi)) << i;
      EXPECT_EQ(v[i], float(vi)) << i;
      EXPECT_EQ(p[i], float(double(p0[i]) * decay - step * mi / (std::sqrt(vi) * rsbc2 + eps))) << i;
    }
  }
}

// The attention primitives: max exact (-inf for n = 0 and for all -inf), exp
// of the float difference within 4e-7 relative (exp_poly: a few ulp; 0 for
// -inf and below -87), the float sum within the recursive-summation bound.
TEST_P(SimdTarget, AttentionPrimitives) {
  EXPECT_EQ(cpu::simd_row_max(nullptr, 0), -kInf);
  EXPECT_EQ(cpu::simd_exp_sub_sum(nullptr, 0, 1.0f), 0.0f);
  for (size_t n : kLengths) {
    Buf x(n, 4, 61);
    for (size_t i = 4; i < n; i += 5) x[i] = -kInf;  // masked keys
    if (n > 3) x[2] = -120.0f;
    const Fv x0 = x.vec();
    float m = -kInf;
    for (float e : x0) m = std::max(m, e);
    EXPECT_EQ(cpu::simd_row_max(x.p, int(n)), m) << n;
    const float s = cpu::simd_exp_sub_sum(x.p, int(n), m);
    double want = 0;
    for (size_t i = 0; i < n; ++i) {
      const double e = std::exp(double(x0[i] - m));  // the op subtracts in float
      want += e;
      if (x0[i] - m < -87.0f)
        EXPECT_EQ(x[i], 0.0f) << i;
      else
        EXPECT_CLOSE(x[i], e, 4e-7 * e, "exp", i);
    }
    // Float lanes (at least 4) of positive terms: each lane a chain of n/4
    // additions, then the lanes: the recursive-summation bound.
    EXPECT_NEAR(s, want, (double(n) / 4 + 8) * 0x1p-24 * want) << n;

    Fv allmasked(n, -kInf);
    EXPECT_EQ(cpu::simd_row_max(allmasked.data(), int(n)), -kInf);
    EXPECT_EQ(cpu::simd_exp_sub_sum(allmasked.data(), int(n), -kInf), 0.0f);
    for (float e : allmasked) EXPECT_EQ(e, 0.0f);

    Buf p(n, 2, 62), ds(n, 1, 63);
    const Fv p0 = p.vec(), ds0 = ds.vec();
    const float L = 1.5f, D = 0.25f;
    cpu::simd_softmax_bwd_row(p.p, ds.p, int(n), L, D);
    for (size_t i = 0; i < n; ++i) {
      const double e = std::exp(double(p0[i] - L));
      EXPECT_CLOSE(p[i], e, 4e-7 * e, "softmax_bwd p", i);
      EXPECT_CLOSE(ds[i], e * (double(ds0[i]) - D), 6e-7 * e * (std::abs(ds0[i]) + D), "softmax_bwd ds", i);
    }

    // Exact products summed in double: within n ulp(double) of the double
    // dot; exactly 0 for n = 0 (the padded lanes add nothing).
    Buf a(n, 3, 64), b(n, 2, 65);
    double dot = 0, mag = 0;
    for (size_t i = 0; i < n; ++i) {
      dot += double(a[i]) * double(b[i]);
      mag += std::abs(double(a[i]) * double(b[i]));
    }
    EXPECT_NEAR(cpu::simd_dot_wide(a.p, b.p, int(n)), dot, (double(n) + 2) * 0x1p-52 * mag) << n;
  }
  EXPECT_EQ(cpu::simd_dot_wide(nullptr, nullptr, 0), 0.0);
}

// The padded forms (rows with room to the next multiple of kRowRoom): the
// unpadded forms' bits, lanes past n ignored (max: NaN and +inf there change
// nothing) or set to 0, nothing written past the room.
TEST_P(SimdTarget, AttentionPrimitivesPadded) {
  for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(15), size_t(16), size_t(17), size_t(1000), size_t(4099)}) {
    const size_t room = (n + cpu::kRowRoom - 1) / cpu::kRowRoom * cpu::kRowRoom;
    Buf x(room + 4, 4, 71), p(room + 4, 2, 72), ds(room + 4, 1, 73);
    for (size_t i = 4; i < n; i += 5) x[i] = -kInf;
    for (size_t i = n; i < room; ++i) x[i] = (i % 2) ? kInf : std::nanf("");  // garbage past n
    const Fv x0 = x.vec(), p0 = p.vec(), ds0 = ds.vec();
    Fv xu(x0.begin(), x0.begin() + long(n)), pu(p0.begin(), p0.begin() + long(n)), du(ds0.begin(), ds0.begin() + long(n));
    const float m = cpu::simd_row_max(xu.data(), int(n));
    EXPECT_EQ(bits(cpu::simd_row_max_padded(x.p, int(n))), bits(m)) << n;
    const float su = cpu::simd_exp_sub_sum(xu.data(), int(n), m);
    EXPECT_EQ(bits(cpu::simd_exp_sub_sum_padded(x.p, int(n), m)), bits(su)) << n;
    cpu::simd_softmax_bwd_row(pu.data(), du.data(), int(n), 1.5f, 0.25f);
    cpu::simd_softmax_bwd_row_padded(p.p, ds.p, int(n), 1.5f, 0.25f);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(x[i]), bits(xu[i])) << "exp " << i << " of " << n;
      ASSERT_EQ(bits(p[i]), bits(pu[i])) << "softmax_bwd p " << i << " of " << n;
      ASSERT_EQ(bits(ds[i]), bits(du[i])) << "softmax_bwd ds " << i << " of " << n;
    }
    for (size_t i = n; i < room + 4; ++i) {
      const bool in_room = i < room;
      // Past n: 0 within the written vector, untouched beyond it.
      if (x[i] != 0.0f) {
        ASSERT_EQ(bits(x[i]), bits(x0[i])) << "exp wrote past its vector, " << i << " of " << n;
      }
      if (p[i] != 0.0f) {
        ASSERT_EQ(bits(p[i]), bits(p0[i])) << "softmax_bwd p past its vector, " << i;
      }
      if (ds[i] != 0.0f) {
        ASSERT_EQ(bits(ds[i]), bits(ds0[i])) << "softmax_bwd ds past its vector, " << i;
      }
      if (!in_room) {
        ASSERT_EQ(bits(x[i]), bits(x0[i])) << "exp wrote past the room, " << i << " of " << n;
        ASSERT_EQ(bits(p[i]), bits(p0[i])) << "softmax_bwd wrote past the room, " << i;
      }
    }
  }
}

// exp_poly's edges: 0 below -87 and at -inf, +inf above 88, NaN stays NaN.
TEST_P(SimdTarget, ExpEdges) {
  Fv x = {-kInf, -1000.0f, -87.5f, -86.9f, 0.0f, 88.5f, kInf, std::nanf(""), 1.0f};
  const float s = cpu::simd_exp_sub_sum(x.data(), int(x.size()), 0.0f);
  EXPECT_EQ(x[0], 0.0f);
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_NEAR(x[3], std::exp(double(-86.9f)), 4e-7 * std::exp(double(-86.9f)));
  EXPECT_NEAR(x[4], 1.0f, 1e-7);
  EXPECT_EQ(x[5], kInf);
  EXPECT_EQ(x[6], kInf);
  EXPECT_TRUE(std::isnan(x[7]));
  EXPECT_NEAR(x[8], std::exp(1.0), 4e-7 * std::exp(1.0));
  EXPECT_TRUE(std::isnan(s));
  // A NaN logit makes the loss NaN (the trainer skips such steps).
  Fv l = {0.5f, std::nanf(""), 1.0f};
  float mx, se, tt;
  int32_t tg = 0;
  cpu::ce_row_max(l.data(), 1, 3, &mx);
  cpu::ce_sumexp_target(l.data(), &tg, 1, 3, 0, &mx, &se, &tt);
  EXPECT_TRUE(std::isnan(se));
}

// Everything the kernels write, for one fixed input; on n = 100003 elements
// (several threads, partial vectors at range ends) and rows.
struct Outputs {
  std::vector<Fv> f;
  std::vector<double> d;
  bool operator==(const Outputs& o) const {
    if (f != o.f || d.size() != o.d.size()) return false;
    return std::memcmp(d.data(), o.d.data(), d.size() * sizeof(double)) == 0;
  }
};

Outputs run_all() {
  const size_t n = 100003;
  const int N = 96, d = 1031, V = 1031;  // N*d, N*V <= n
  Buf a(n, 1, 71, true), b(n, 1, 72), c(n, 1, 73), g(d, 0.3f, 74), dl(d, 0.5f, 75);
  Outputs o;
  auto out = [&] { return Fv(n, 0.0f); };
  Fv r = out();
  cpu::add(a.p, b.p, r.data(), n);
  o.f.push_back(r);
  r = b.vec();
  cpu::axpy(0.3f, a.p, r.data(), n);
  o.f.push_back(r);
  cpu::scale(r.data(), 1.3f, n);
  o.f.push_back(r);
  o.d.push_back(cpu::sum(a.p, n));
  o.d.push_back(cpu::sum_squares(a.p, n));
  Fv r2 = out(), r3 = out();
  cpu::swiglu_fwd(a.p, b.p, n, r.data());
  o.f.push_back(r);
  cpu::swiglu_bwd(a.p, b.p, c.p, n, r2.data(), r3.data());
  o.f.push_back(r2), o.f.push_back(r3);
  cpu::gelu_fwd(a.p, n, r.data());
  o.f.push_back(r);
  cpu::gelu_bwd(a.p, c.p, n, r.data());
  o.f.push_back(r);
  cpu::fusion_fwd(a.p, b.p, c.p, static_cast<const float*>(nullptr), n, r.data());
  o.f.push_back(r);
  Fv r4 = out();
  cpu::fusion_bwd(a.p, b.p, c.p, b.p, n, r2.data(), r3.data(), r4.data());
  o.f.push_back(r2), o.f.push_back(r3), o.f.push_back(r4);
  cpu::sigmoid_gate_fwd(a.p, b.p, n, r.data());
  o.f.push_back(r);
  cpu::sigmoid_gate_bwd(a.p, b.p, c.p, n, r2.data(), r3.data());
  o.f.push_back(r2), o.f.push_back(r3);
  cpu::blend_fwd(a.p, b.p, 0.3, n, r.data());
  o.f.push_back(r);
  o.d.push_back(cpu::blend_bwd(a.p, b.p, 0.3, c.p, n, r2.data(), r3.data()));
  o.f.push_back(r2), o.f.push_back(r3);
  Fv y(size_t(N) * d), rs(N), dx(size_t(N) * d, 0.0f), dg(d, 0.0f), dd(d, 0.0f);
  cpu::rmsnorm_fwd(a.p, g.p, dl.p, N, d, 1e-6, y.data(), rs.data());
  o.f.push_back(y), o.f.push_back(rs);
  cpu::rmsnorm_bwd(a.p, g.p, dl.p, rs.data(), b.p, N, d, dx.data(), dx.data(), dg.data(), dd.data());
  o.f.push_back(dx);  // dgamma, ddelta: partials per thread (compared apart)
  std::vector<int32_t> tg(N);
  for (int i = 0; i < N; ++i) tg[i] = (i * 31) % V;
  Fv mx(N), se(N), tt(N), loss(N), lg(a.p, a.p + size_t(N) * V);
  cpu::ce_row_max(lg.data(), N, V, mx.data());
  cpu::ce_sumexp_target(lg.data(), tg.data(), N, V, 0, mx.data(), se.data(), tt.data());
  cpu::ce_loss_grad(lg.data(), tg.data(), N, V, 0, mx.data(), se.data(), tt.data(), 0.1, loss.data());
  o.f.push_back(mx), o.f.push_back(se), o.f.push_back(loss), o.f.push_back(lg);
  Fv p = a.vec(), m = b.vec(), v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::abs(c[i]);
  cpu::adamw(p.data(), b.p, m.data(), v.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.5, 0.3, static_cast<float*>(nullptr),
             false);
  o.f.push_back(p), o.f.push_back(m), o.f.push_back(v);
  Fv row(a.p, a.p + 4099);
  o.f.push_back({cpu::simd_row_max(row.data(), 4099), cpu::simd_exp_sub_sum(row.data(), 4099, 2.0f),
                 float(cpu::simd_dot_wide(a.p, b.p, 4099))});
  o.f.push_back(row);
  o.f.push_back(dg), o.f.push_back(dd);  // last two: see RepeatsAndThreadCounts
  return o;
}

TEST_P(SimdTarget, RepeatsAndThreadCounts) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const Outputs two = run_all(), again = run_all();
  EXPECT_TRUE(two == again) << "same target, same threads: not bit-identical";
  for (int t : {1, 3}) {
    omp_set_num_threads(t);
    Outputs other = run_all();
    // rmsnorm's dgamma/ddelta add per-thread partials (deterministic for a
    // fixed thread count, by design): close, not identical.
    ASSERT_EQ(other.f.size(), two.f.size());
    for (size_t k = other.f.size() - 2; k < other.f.size(); ++k) {
      for (size_t j = 0; j < other.f[k].size(); ++j)
        EXPECT_NEAR(other.f[k][j], two.f[k][j], 1e-5 * (1 + std::abs(two.f[k][j])));
      other.f[k] = two.f[k];
    }
    for (size_t k = 0; k < other.f.size(); ++k)
      EXPECT_TRUE(other.f[k] == two.f[k]) << "output " << k << " differs with " << t << " threads";
    EXPECT_TRUE(other == two) << t << " threads vs 2";
  }
  omp_set_num_threads(saved);
}

INSTANTIATE_TEST_SUITE_P(Targets, SimdTarget, ::testing::ValuesIn(cpu::simd_compiled_targets()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace wiola::test
