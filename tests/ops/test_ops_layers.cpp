// CpuOps layer pieces: forward against straightforward reference formulas and
// backward against central finite differences in double (L = sum w * out).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "tests/ops/test_util.h"
#include "util/error.h"

namespace wiola::test {
namespace {

CpuOps<double> D;
CpuOps<float> F;

// ---- WiolaRMSNorm ------------------------------------------------------------

Vec rmsnorm_ref(const Vec& x, const Vec& g, const Vec& dl, int N, int d, double eps) {
  Vec y(x.size());
  for (int i = 0; i < N; ++i) {
    double ms = 0;
    for (int j = 0; j < d; ++j) {
      const double z = x[size_t(i) * d + j] + dl[j];
      ms += z * z;
    }
    ms /= d;
    for (int j = 0; j < d; ++j) y[size_t(i) * d + j] = g[j] * (x[size_t(i) * d + j] + dl[j]) / std::sqrt(ms + eps);
  }
  return y;
}

TEST(RmsNorm, ForwardMatchesFormula) {
  const int N = 7, d = 33;
  const double eps = 1e-6;
  Vec x = randn(size_t(N) * d), g = randn(d, 0.3, 1.0), dl = randn(d, 0.5);
  Vec y(x.size()), rstd(N);
  D.rmsnorm_fwd(x.data(), g.data(), dl.data(), N, d, eps, y.data(), rstd.data(), nullptr);
  const double err = rel_err(y, rmsnorm_ref(x, g, dl, N, d, eps));
  report("fwd rmsnorm", err);
  EXPECT_LT(err, 1e-14);
  // rstd is 1/sqrt(mean(z^2)+eps) of row 0.
  double ms = 0;
  for (int j = 0; j < d; ++j) ms += (x[j] + dl[j]) * (x[j] + dl[j]);
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(ms / d + eps), 1e-14);
}

TEST(RmsNorm, BackwardFiniteDifferences) {
  for (int d : {16, 7}) {
    const int N = 5;
    const double eps = 1e-6;
    Vec x = randn(size_t(N) * d), g = randn(d, 0.3, 1.0), dl = randn(d, 0.5);
    const Vec w = randn(x.size());
    auto L = [&] {
      Vec y(x.size()), r(N);
      D.rmsnorm_fwd(x.data(), g.data(), dl.data(), N, d, eps, y.data(), r.data(), nullptr);
      return dot(w, y);
    };
    Vec y(x.size()), rstd(N);
    D.rmsnorm_fwd(x.data(), g.data(), dl.data(), N, d, eps, y.data(), rstd.data(), nullptr);
    // All three gradients accumulate: start from random values.
    const Vec dx0 = randn(x.size()), dg0 = randn(d), dd0 = randn(d);
    Vec dx = dx0, dg = dg0, dd = dd0;
    D.rmsnorm_bwd(x.data(), g.data(), dl.data(), rstd.data(), w.data(), N, d, dx.data(), dx.data(), dg.data(),
                  dd.data());
    fd_check("rmsnorm dx", x, minus(dx, dx0), L);
    fd_check("rmsnorm dgamma", g, minus(dg, dg0), L);
    fd_check("rmsnorm ddelta", dl, minus(dd, dd0), L);
  }
}

TEST(RmsNorm, FloatMatchesDouble) {
  const int N = 9, d = 64;
  Vec x = randn(size_t(N) * d), g = randn(d, 0.3, 1.0), dl = randn(d, 0.5);
  Vec y(x.size()), r(N);
  D.rmsnorm_fwd(x.data(), g.data(), dl.data(), N, d, 1e-6, y.data(), r.data(), nullptr);
  Fvec xf = to_float(x), gf = to_float(g), df = to_float(dl), yf(x.size()), rf(N);
  F.rmsnorm_fwd(xf.data(), gf.data(), df.data(), N, d, 1e-6, yf.data(), rf.data(), nullptr);
  const double err = rel_err(Vec(yf.begin(), yf.end()), y);
  report("f32 vs f64 rmsnorm", err);
  EXPECT_LT(err, 1e-5);
}

// ---- SRPE ----------------------------------------------------------------------

// The docs/model.md §2 table for positions 0..Tn-1 (theta0 = 1e4, k_s = 8, a_s = 0.1,
// f_s = 0.01).
Vec srpe_table(int Tn, int dh) {
  Vec t(size_t(Tn) * dh);
  for (int p = 0; p < Tn; ++p)
    for (int j = 0; j < dh / 2; ++j) {
      const double om = std::pow(1e4, -2.0 * j / dh);
      const double th = p * om * (1 + 1.0 / 8), r = 1 + 0.1 * std::sin(p * 0.01 * om);
      t[size_t(p) * dh + 2 * j] = r * std::cos(th);
      t[size_t(p) * dh + 2 * j + 1] = r * std::sin(th);
    }
  return t;
}

TEST(Srpe, HandComputedRotation) {
  // One head, dh = 4: pairs (x0, x2) and (x1, x3).
  Vec x = {1, 2, 3, 4};
  const Vec table = {0.6, 0.8, 0.0, 1.0};
  D.srpe_apply(x.data(), 1, 1, 1, 4, table.data(), false);
  const Vec want = {1 * 0.6 - 3 * 0.8, 2 * 0.0 - 4 * 1.0, 1 * 0.8 + 3 * 0.6, 2 * 1.0 + 4 * 0.0};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], want[i], 1e-15) << i;
  D.srpe_apply(x.data(), 1, 1, 1, 4, table.data(), true);
  const Vec back = {1, 2, 3, 4};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], back[i], 1e-15) << i;
}

TEST(Srpe, InverseUndoesForward) {
  const int B = 2, Tn = 9, nh = 3, dh = 8;
  // Unit radius: inverse o forward = identity. The SRPE table scales by r,
  // so there inverse o forward = r^2 per pair.
  Vec unit = srpe_table(Tn, dh), scaled = unit;
  for (size_t i = 0; i < unit.size(); i += 2) {
    const double r = std::hypot(unit[i], unit[i + 1]);
    unit[i] /= r;
    unit[i + 1] /= r;
  }
  const Vec x0 = randn(size_t(B) * Tn * nh * dh);
  Vec x = x0;
  D.srpe_apply(x.data(), B, Tn, nh, dh, unit.data(), false);
  EXPECT_GT(rel_err(x, x0), 1e-3);
  D.srpe_apply(x.data(), B, Tn, nh, dh, unit.data(), true);
  double err = rel_err(x, x0);
  report("srpe inverse o forward", err);
  EXPECT_LT(err, 1e-14);

  x = x0;
  D.srpe_apply(x.data(), B, Tn, nh, dh, scaled.data(), false);
  D.srpe_apply(x.data(), B, Tn, nh, dh, scaled.data(), true);
  Vec want = x0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int h = 0; h < nh; ++h)
        for (int j = 0; j < dh; ++j) {
          const int pj = j % (dh / 2);
          const double r2 = scaled[size_t(t) * dh + 2 * pj] * scaled[size_t(t) * dh + 2 * pj] +
                            scaled[size_t(t) * dh + 2 * pj + 1] * scaled[size_t(t) * dh + 2 * pj + 1];
          want[((size_t(b) * Tn + t) * nh + h) * dh + j] *= r2;
        }
  EXPECT_LT(rel_err(x, want), 1e-14);
}

TEST(Srpe, BackwardIsTranspose) {
  const int B = 2, Tn = 5, nh = 2, dh = 6;
  const Vec table = srpe_table(Tn, dh);
  Vec x = randn(size_t(B) * Tn * nh * dh);
  const Vec w = randn(x.size());
  auto L = [&] {
    Vec y = x;
    D.srpe_apply(y.data(), B, Tn, nh, dh, table.data(), false);
    return dot(w, y);
  };
  Vec dx = w;
  D.srpe_apply(dx.data(), B, Tn, nh, dh, table.data(), true);
  fd_check("srpe dx", x, dx, L);
}

// SRPE fused with the Q|K|V|gate split (forward) and with the join of the
// gradients (backward): the bits of copy_block of each block with
// srpe_apply on q and k, and of srpe_apply(inverse) on dq and dk with
// copy_block into the fused rows; dq and dk themselves left unchanged. On the
// host backend and on cpu-opaque, in float and double, for a head dim the
// inner loop vectorises over and an odd half head dim.
template <class T>
void check_srpe_split(Ops<T>& ops, int B, int Tn, int H, int Hkv, int dh) {
  SCOPED_TRACE(testing::Message() << ops.name() << " " << sizeof(T) << "-byte, B " << B << " T " << Tn << " H " << H
                                  << " Hkv " << Hkv << " dh " << dh);
  const int N = B * Tn, hd = H * dh, kvd = Hkv * dh, width = 2 * hd + 2 * kvd;
  const int widths[4] = {hd, kvd, kvd, hd};
  auto up = [&](const Vec& v) {
    Buffer<T> b(ops, v.size());
    const std::vector<T> h(v.begin(), v.end());
    ops.upload(b.data(), h.data(), b.bytes());
    return b;
  };
  auto bytes = [&](const Buffer<T>& b) {
    std::vector<unsigned char> h(b.bytes());
    ops.download(h.data(), b.data(), b.bytes());
    return h;
  };
  const Buffer<T> proj = up(randn(size_t(N) * width)), table = up(srpe_table(Tn, dh));
  std::vector<Buffer<T>> one, two;  // q, k, v, gate: unfused, fused
  for (int i = 0; i < 4; ++i) {
    one.push_back(up(Vec(size_t(N) * widths[i], 7.0)));
    two.push_back(up(Vec(size_t(N) * widths[i], -3.0)));
  }
  size_t col = 0;
  for (int i = 0; i < 4; ++i) {
    ops.copy_block(one[size_t(i)].data(), widths[i], proj.data() + col, width, N, widths[i]);
    col += size_t(widths[i]);
  }
  ops.srpe_apply(one[0].data(), B, Tn, H, dh, table.data(), false);
  ops.srpe_apply(one[1].data(), B, Tn, Hkv, dh, table.data(), false);
  ops.srpe_split_fwd(proj.data(), B, Tn, H, Hkv, dh, table.data(), nullptr, two[0].data(), two[1].data(), two[2].data(),
                     two[3].data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bytes(two[size_t(i)]), bytes(one[size_t(i)])) << "block " << i;
  // SRPE did rotate: q differs from its block of proj.
  Buffer<T> plain_q(ops, size_t(N) * hd);
  ops.copy_block(plain_q.data(), hd, proj.data(), width, N, hd);
  EXPECT_NE(bytes(two[0]), bytes(plain_q));

  std::vector<Buffer<T>> grads;  // dq, dk, dv, dgate
  for (int i = 0; i < 4; ++i) grads.push_back(up(randn(size_t(N) * widths[i])));
  const auto dq0 = bytes(grads[0]), dk0 = bytes(grads[1]);
  Buffer<T> dproj1 = up(Vec(size_t(N) * width, 5.0)), dproj2 = up(Vec(size_t(N) * width, -1.0));
  ops.srpe_split_bwd(grads[0].data(), grads[1].data(), grads[2].data(), grads[3].data(), B, Tn, H, Hkv, dh,
                     table.data(), nullptr, dproj2.data());
  EXPECT_EQ(bytes(grads[0]), dq0);
  EXPECT_EQ(bytes(grads[1]), dk0);
  ops.srpe_apply(grads[0].data(), B, Tn, H, dh, table.data(), true);
  ops.srpe_apply(grads[1].data(), B, Tn, Hkv, dh, table.data(), true);
  col = 0;
  for (int i = 0; i < 4; ++i) {
    ops.copy_block(dproj1.data() + col, width, grads[size_t(i)].data(), widths[i], N, widths[i]);
    col += size_t(widths[i]);
  }
  EXPECT_EQ(bytes(dproj2), bytes(dproj1));
}
TEST(Srpe, SplitFusedMatchesCopyThenRotate) {
  for (const char* backend : {"cpu", "cpu-opaque"}) {
    for (const auto& [B, Tn, H, Hkv, dh] : {std::tuple{2, 5, 3, 1, 6}, std::tuple{1, 9, 4, 2, 16}}) {
      check_srpe_split(*make_backend<float>(backend), B, Tn, H, Hkv, dh);
      check_srpe_split(*make_backend<double>(backend), B, Tn, H, Hkv, dh);
    }
  }
}

// ---- ATM ---------------------------------------------------------------------------

TEST(Atm, SimilarityMatchesFormula) {
  const int B = 2, Tn = 6, d = 10;
  Vec x = randn(size_t(B) * Tn * d);
  // Row (0, 4) equals row (0, 3) scaled (rho = 1); row (1, 2) is zero.
  for (int j = 0; j < d; ++j) {
    x[size_t(4) * d + j] = 2.5 * x[size_t(3) * d + j];
    x[size_t(Tn + 2) * d + j] = 0;
  }
  Vec rho(size_t(B) * (Tn - 1), -7);
  D.atm_similarity(x.data(), B, Tn, d, rho.data());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t + 1 < Tn; ++t) {
      const double* a = &x[(size_t(b) * Tn + t) * d];
      const double* c = a + d;
      double ab = 0, aa = 0, cc = 0;
      for (int j = 0; j < d; ++j) {
        ab += a[j] * c[j];
        aa += a[j] * a[j];
        cc += c[j] * c[j];
      }
      const double want = (aa > 0 && cc > 0) ? ab / std::sqrt(aa * cc) : 0.0;
      EXPECT_NEAR(rho[size_t(b) * (Tn - 1) + t], want, 1e-14) << b << " " << t;
    }
  EXPECT_NEAR(rho[3], 1.0, 1e-14);
  EXPECT_EQ(rho[Tn - 1 + 1], 0.0);
  EXPECT_EQ(rho[Tn - 1 + 2], 0.0);
  // Float input, double accumulation.
  Fvec xf = to_float(x);
  Vec rf(rho.size());
  F.atm_similarity(xf.data(), B, Tn, d, rf.data());
  EXPECT_LT(rel_err(rf, rho), 1e-6);
}

// Two sequences of 6 rows: {0} {1,2} {3} {4,5} and {0,1} {2,3} {4} {5}, the
// second with only 3 groups used (row 5 then belongs to no group).
struct Groups {
  int B = 2, Tn = 6;
  std::vector<int32_t> first = {0, 1, 3, 4, 0, 0, 0, 2, 4, 0, 0, 0};
  std::vector<int32_t> end = {0, 2, 3, 5, 0, 0, 1, 3, 4, 0, 0, 0};
  std::vector<int32_t> n = {4, 3};
};

TEST(Atm, MergeRowsForwardAndBackward) {
  const Groups g;
  const int w = 5;
  Vec x = randn(size_t(g.B) * g.Tn * w);
  Vec out(x.size(), 99);
  D.atm_merge_rows(x.data(), g.B, g.Tn, w, g.first.data(), g.end.data(), g.n.data(), out.data());
  for (int b = 0; b < g.B; ++b)
    for (int j = 0; j < g.Tn; ++j)
      for (int c = 0; c < w; ++c) {
        double want = 0;
        if (j < g.n[b]) {
          const int f = g.first[b * g.Tn + j], e = g.end[b * g.Tn + j];
          for (int t = f; t <= e; ++t) want += x[(size_t(b) * g.Tn + t) * w + c];
          want /= (e - f + 1);
        }
        EXPECT_NEAR(out[(size_t(b) * g.Tn + j) * w + c], want, 1e-15);
      }
  const Vec wt = randn(x.size());
  auto L = [&] {
    Vec o(x.size());
    D.atm_merge_rows(x.data(), g.B, g.Tn, w, g.first.data(), g.end.data(), g.n.data(), o.data());
    return dot(wt, o);
  };
  const Vec dx0 = randn(x.size());
  Vec dx = dx0;
  D.atm_merge_rows_bwd(wt.data(), g.B, g.Tn, w, g.first.data(), g.end.data(), g.n.data(), dx.data());
  fd_check("atm_merge_rows dx", x, minus(dx, dx0), L);
}

TEST(Atm, MergeRowsRejectsBadLayout) {
  Groups g;
  g.first[2] = 2;  // overlaps group 1 (rows 1..2)
  Vec x(size_t(g.B) * g.Tn * 3), out(x.size());
  EXPECT_THROW(D.atm_merge_rows(x.data(), g.B, g.Tn, 3, g.first.data(), g.end.data(), g.n.data(), out.data()), Error);
}

// Documents (docs/model.md §2): a pair never crosses a document's start.
TEST(Atm, PlanNeverCrossesADocument) {
  const int Tn = 8;
  const std::vector<double> rho(Tn - 1, 1.0);
  const std::vector<int32_t> ds = {0, 0, 0, 3, 3, 5, 5, 5};
  std::vector<uint8_t> open(Tn);
  std::vector<int32_t> first(Tn), end(Tn), n(1);
  D.atm_plan(rho.data(), 1, Tn, 0.5, ds.data(), open.data(), first.data(), end.data(), n.data());
  EXPECT_EQ(open, (std::vector<uint8_t>{1, 0, 0, 1, 0, 1, 0, 0}));
  EXPECT_EQ(n[0], 5);
  D.atm_plan(rho.data(), 1, Tn, 0.5, nullptr, open.data(), first.data(), end.data(), n.data());
  EXPECT_EQ(open, (std::vector<uint8_t>{1, 0, 1, 0, 1, 0, 1, 0}));
}

// ---- prefix mean -------------------------------------------------------------------

TEST(PrefixMean, ForwardBackwardAndCarry) {
  const int B = 2, Tn = 7, d = 300;  // d > one 256-column block
  Vec x = randn(size_t(B) * Tn * d);
  Vec out(x.size()), out_op(x.size(), -1.0);
  D.prefix_mean_fwd(x.data(), B, Tn, d, nullptr, out.data(), out_op.data());
  EXPECT_EQ(out_op, out);  // the GEMM operand copy (storage T here: the values)
  Vec want(x.size());
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < d; ++c) {
      double s = 0;
      for (int t = 0; t < Tn; ++t) {
        s += x[(size_t(b) * Tn + t) * d + c];
        want[(size_t(b) * Tn + t) * d + c] = s / (t + 1);
      }
    }
  const double err = rel_err(out, want);
  report("fwd prefix_mean", err);
  EXPECT_LT(err, 1e-14);

  // Cached decoding in chunks 3 + 4 gives the same rows.
  Vec carry(size_t(B) * d, 0.0), o1(size_t(B) * 3 * d), o2(size_t(B) * 4 * d);
  Vec x1(o1.size()), x2(o2.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int c = 0; c < d; ++c) {
        const double v = x[(size_t(b) * Tn + t) * d + c];
        if (t < 3) x1[(size_t(b) * 3 + t) * d + c] = v;
        else x2[(size_t(b) * 4 + t - 3) * d + c] = v;
      }
  D.prefix_mean_carry_fwd(x1.data(), B, 3, d, 0, carry.data(), o1.data(), nullptr);
  D.prefix_mean_carry_fwd(x2.data(), B, 4, d, 3, carry.data(), o2.data(), nullptr);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int c = 0; c < d; ++c) {
        const double got = t < 3 ? o1[(size_t(b) * 3 + t) * d + c] : o2[(size_t(b) * 4 + t - 3) * d + c];
        EXPECT_NEAR(got, want[(size_t(b) * Tn + t) * d + c], 1e-14);
      }

  // Backward: FD on a narrower problem.
  const int d2 = 4;
  Vec xs = randn(size_t(B) * Tn * d2);
  const Vec w = randn(xs.size());
  auto L = [&] {
    Vec o(xs.size());
    D.prefix_mean_fwd(xs.data(), B, Tn, d2, nullptr, o.data(), nullptr);
    return dot(w, o);
  };
  const Vec dx0 = randn(xs.size());
  Vec dx = dx0;
  D.prefix_mean_bwd(w.data(), B, Tn, d2, nullptr, dx.data());
  fd_check("prefix_mean dx", xs, minus(dx, dx0), L);
}

// Documents (docs/model.md §2 "Documents"): the means restart at each
// document's first row, forward and backward, the other rows untouched.
TEST(PrefixMean, Documents) {
  const int B = 2, Tn = 9, d = 5;
  const std::vector<int32_t> ds = {0, 0, 0, 3, 4, 4, 4, 4, 8,  //
                                   0, 1, 1, 1, 1, 1, 1, 1, 1};
  const Vec x = randn(size_t(B) * Tn * d);
  Vec out(x.size()), want(x.size());
  D.prefix_mean_fwd(x.data(), B, Tn, d, ds.data(), out.data(), nullptr);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tn; ++t)
      for (int c = 0; c < d; ++c) {
        const int s0 = ds[size_t(b) * Tn + t];
        double sum = 0;
        for (int u = s0; u <= t; ++u) sum += x[(size_t(b) * Tn + u) * d + c];
        want[(size_t(b) * Tn + t) * d + c] = sum / (t - s0 + 1);
      }
  EXPECT_LT(rel_err(out, want), 1e-14);
  Vec xs = x;
  const Vec w = randn(xs.size());
  auto L = [&] {
    Vec o(xs.size());
    D.prefix_mean_fwd(xs.data(), B, Tn, d, ds.data(), o.data(), nullptr);
    return dot(w, o);
  };
  const Vec dx0 = randn(xs.size());
  Vec dx = dx0;
  D.prefix_mean_bwd(w.data(), B, Tn, d, ds.data(), dx.data());
  fd_check("prefix_mean documents dx", xs, minus(dx, dx0), L);
}

// SRPE with documents: row t of a document rotates by position t - start,
// the bits of the fused split of that row alone at its position's table row.
TEST(Srpe, DocumentPositions) {
  const int B = 2, Tn = 6, H = 2, Hkv = 1, dh = 4, width = 2 * H * dh + 2 * Hkv * dh;
  const std::vector<int32_t> ds = {0, 0, 2, 2, 2, 5, 0, 1, 2, 2, 2, 2};
  const Vec proj = randn(size_t(B) * Tn * width), table = srpe_table(Tn, dh);
  Vec q(size_t(B) * Tn * H * dh), k(size_t(B) * Tn * Hkv * dh), v(k.size()), g(q.size());
  D.srpe_split_fwd(proj.data(), B, Tn, H, Hkv, dh, table.data(), ds.data(), q.data(), k.data(), v.data(), g.data());
  Vec dproj(proj.size());
  D.srpe_split_bwd(q.data(), k.data(), v.data(), g.data(), B, Tn, H, Hkv, dh, table.data(), ds.data(), dproj.data());
  for (int r = 0; r < B * Tn; ++r) {
    const size_t pos = size_t(r % Tn - ds[size_t(r)]);
    Vec q1(size_t(H) * dh), k1(size_t(Hkv) * dh), v1(k1.size()), g1(q1.size()), d1(static_cast<size_t>(width));
    D.srpe_split_fwd(proj.data() + size_t(r) * width, 1, 1, H, Hkv, dh, table.data() + pos * dh, nullptr, q1.data(),
                     k1.data(), v1.data(), g1.data());
    for (size_t i = 0; i < q1.size(); ++i) EXPECT_EQ(q[size_t(r) * q1.size() + i], q1[i]) << "row " << r;
    for (size_t i = 0; i < k1.size(); ++i) EXPECT_EQ(k[size_t(r) * k1.size() + i], k1[i]) << "row " << r;
    D.srpe_split_bwd(q1.data(), k1.data(), v1.data(), g1.data(), 1, 1, H, Hkv, dh, table.data() + pos * dh, nullptr,
                     d1.data());
    for (int i = 0; i < width; ++i) EXPECT_EQ(dproj[size_t(r) * width + size_t(i)], d1[size_t(i)]) << "row " << r;
  }
}

// ---- context attention -----------------------------------------------------------

TEST(CtxAttention, ForwardMatchesFormula) {
  const int N = 3, nc = 2, H = 4, Hkv = 2, dh = 8;
  const Vec q = randn(size_t(N) * H * dh), kc = randn(size_t(N) * nc * Hkv * dh), vc = randn(kc.size());
  Vec out(q.size()), probs(size_t(N) * H * nc);
  D.ctx_attention_fwd(q.data(), kc.data(), vc.data(), N, nc, H, Hkv, dh, Hkv * dh, out.data(), probs.data());
  Vec want(q.size()), wantp(probs.size());
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      const int g = h % Hkv;
      double s[nc], z = 0;
      for (int i = 0; i < nc; ++i) {
        s[i] = 0;
        for (int c = 0; c < dh; ++c)
          s[i] += q[(size_t(n) * H + h) * dh + c] * kc[((size_t(n) * nc + i) * Hkv + g) * dh + c];
        s[i] = std::exp(s[i] / std::sqrt(double(dh)));
        z += s[i];
      }
      for (int i = 0; i < nc; ++i) {
        wantp[(size_t(n) * H + h) * nc + i] = s[i] / z;
        for (int c = 0; c < dh; ++c)
          want[(size_t(n) * H + h) * dh + c] += s[i] / z * vc[((size_t(n) * nc + i) * Hkv + g) * dh + c];
      }
    }
  EXPECT_LT(rel_err(out, want), 1e-14);
  EXPECT_LT(rel_err(probs, wantp), 1e-14);
  report("fwd ctx_attention", rel_err(out, want));

  Fvec qf = to_float(q), kf = to_float(kc), vf = to_float(vc), of(q.size()), pf(probs.size());
  F.ctx_attention_fwd(qf.data(), kf.data(), vf.data(), N, nc, H, Hkv, dh, Hkv * dh, of.data(), pf.data());
  const double ef = rel_err(Vec(of.begin(), of.end()), out);
  report("f32 vs f64 ctx_attention", ef);
  EXPECT_LT(ef, 1e-5);
}

TEST(CtxAttention, BackwardFiniteDifferences) {
  for (int nc : {1, 2, 3}) {
    const int N = 3, H = 4, Hkv = 2, dh = 6;
    Vec q = randn(size_t(N) * H * dh), kc = randn(size_t(N) * nc * Hkv * dh), vc = randn(kc.size());
    const Vec w = randn(q.size());
    auto L = [&] {
      Vec o(q.size()), p(size_t(N) * H * nc);
      D.ctx_attention_fwd(q.data(), kc.data(), vc.data(), N, nc, H, Hkv, dh, Hkv * dh, o.data(), p.data());
      return dot(w, o);
    };
    Vec out(q.size()), probs(size_t(N) * H * nc);
    D.ctx_attention_fwd(q.data(), kc.data(), vc.data(), N, nc, H, Hkv, dh, Hkv * dh, out.data(), probs.data());
    const Vec dq0 = randn(q.size());
    Vec dq = dq0, dkc(kc.size(), 5.0), dvc(vc.size(), 5.0);  // overwritten
    D.ctx_attention_bwd(q.data(), kc.data(), vc.data(), probs.data(), w.data(), N, nc, H, Hkv, dh, Hkv * dh, dq.data(),
                        dkc.data(), dvc.data());
    fd_check("ctx_attention dq", q, minus(dq, dq0), L);
    if (nc > 1) {
      fd_check("ctx_attention dkc", kc, dkc, L);
    } else {
      for (double v : dkc) EXPECT_EQ(v, 0.0);  // one row: softmax is 1
    }
    fd_check("ctx_attention dvc", vc, dvc, L);
  }
}

// The merged context projection's layout (model/layer.cpp): keys and values
// interleaved per context row, [N, nc, 2, Hkv dh], read and written with the
// row stride 2 Hkv dh. Every output has the bits of the separate [N, nc, Hkv
// dh] tensors, and the backward writes only its own rows of the shared
// gradient buffer (the other half keeps what was there).
TEST(CtxAttention, InterleavedKeysValuesGiveTheSeparateLayoutsBits) {
  for (int nc : {1, 3}) {
    const int N = 5, H = 4, Hkv = 2, dh = 6, kvd = Hkv * dh;
    const Vec q = randn(size_t(N) * H * dh), kc = randn(size_t(N) * nc * kvd), vc = randn(kc.size()),
              dout = randn(q.size());
    Vec kv(2 * kc.size());
    for (size_t r = 0; r < size_t(N) * nc; ++r)
      for (int c = 0; c < kvd; ++c) {
        kv[2 * r * kvd + c] = kc[r * kvd + c];
        kv[(2 * r + 1) * kvd + c] = vc[r * kvd + c];
      }
    Vec out(q.size()), probs(size_t(N) * H * nc), dq(q.size(), 0.5), dkc(kc.size()), dvc(vc.size());
    D.ctx_attention_fwd(q.data(), kc.data(), vc.data(), N, nc, H, Hkv, dh, kvd, out.data(), probs.data());
    D.ctx_attention_bwd(q.data(), kc.data(), vc.data(), probs.data(), dout.data(), N, nc, H, Hkv, dh, kvd, dq.data(),
                        dkc.data(), dvc.data());
    Vec out2(q.size()), probs2(probs.size()), dq2(q.size(), 0.5), dkv(kv.size(), 7.0);
    D.ctx_attention_fwd(q.data(), kv.data(), kv.data() + kvd, N, nc, H, Hkv, dh, 2 * kvd, out2.data(), probs2.data());
    // dkc and dvc as the two halves of one buffer, as the layer passes them.
    D.ctx_attention_bwd(q.data(), kv.data(), kv.data() + kvd, probs2.data(), dout.data(), N, nc, H, Hkv, dh, 2 * kvd,
                        dq2.data(), dkv.data(), dkv.data() + kvd);
    EXPECT_EQ(out2, out);
    EXPECT_EQ(probs2, probs);
    EXPECT_EQ(dq2, dq);
    for (size_t r = 0; r < size_t(N) * nc; ++r)
      for (int c = 0; c < kvd; ++c) {
        ASSERT_EQ(dkv[2 * r * kvd + c], dkc[r * kvd + c]) << "row " << r;
        ASSERT_EQ(dkv[(2 * r + 1) * kvd + c], dvc[r * kvd + c]) << "row " << r;
      }
    // Strided rows with a gap: the elements between rows are left alone.
    const int ld = 2 * kvd + 3;
    Vec kg(size_t(N) * nc * ld, 0.0), vg(kg.size(), 0.0), dkg(kg.size(), 9.0), dvg(kg.size(), 9.0);
    for (size_t r = 0; r < size_t(N) * nc; ++r)
      for (int c = 0; c < kvd; ++c) {
        kg[r * ld + c] = kc[r * kvd + c];
        vg[r * ld + c] = vc[r * kvd + c];
      }
    Vec out3(q.size()), probs3(probs.size()), dq3(q.size(), 0.5);
    D.ctx_attention_fwd(q.data(), kg.data(), vg.data(), N, nc, H, Hkv, dh, ld, out3.data(), probs3.data());
    D.ctx_attention_bwd(q.data(), kg.data(), vg.data(), probs3.data(), dout.data(), N, nc, H, Hkv, dh, ld, dq3.data(),
                        dkg.data(), dvg.data());
    EXPECT_EQ(out3, out);
    EXPECT_EQ(dq3, dq);
    for (size_t r = 0; r < size_t(N) * nc; ++r)
      for (int c = 0; c < ld; ++c) {
        ASSERT_EQ(dkg[r * ld + c], c < kvd ? dkc[r * kvd + c] : 9.0) << "row " << r << " col " << c;
        ASSERT_EQ(dvg[r * ld + c], c < kvd ? dvc[r * kvd + c] : 9.0) << "row " << r << " col " << c;
      }
  }
}

// ---- blend, gate --------------------------------------------------------------------

TEST(Blend, ForwardAndFiniteDifferences) {
  const size_t n = 40;
  Vec a = randn(n), c = randn(n), phi = {-0.7};
  Vec out(n);
  D.blend_fwd(a.data(), c.data(), phi.data(), n, out.data());
  const double beta = 1 / (1 + std::exp(-phi[0]));
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], (1 - beta) * a[i] + beta * c[i], 1e-15);
  const Vec w = randn(n);
  auto L = [&] {
    Vec o(n);
    D.blend_fwd(a.data(), c.data(), phi.data(), n, o.data());
    return dot(w, o);
  };
  Vec da(n, 3.0), dc(n, 3.0);
  const double dphi = blend_bwd_dphi(D, a.data(), c.data(), phi[0], w.data(), n, da.data(), dc.data());
  fd_check("blend d_self", a, da, L);
  fd_check("blend d_ctx", c, dc, L);
  fd_check("blend dphi", phi, Vec{dphi}, L);
}

TEST(SigmoidGate, ForwardAndFiniteDifferences) {
  const size_t n = 50;
  Vec pre = randn(n, 3.0), x = randn(n);
  pre[0] = 40;  // saturated both ways: no overflow
  pre[1] = -40;
  Vec out(n);
  D.sigmoid_gate_fwd(pre.data(), x.data(), n, out.data());
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], x[i] / (1 + std::exp(-pre[i])), 1e-15);
  const Vec w = randn(n);
  auto L = [&] {
    Vec o(n);
    D.sigmoid_gate_fwd(pre.data(), x.data(), n, o.data());
    return dot(w, o);
  };
  Vec dpre(n), dx(n);
  D.sigmoid_gate_bwd(pre.data(), x.data(), w.data(), n, dpre.data(), dx.data());
  fd_check("sigmoid_gate dpre", pre, dpre, L);
  fd_check("sigmoid_gate dx", x, dx, L);
}

// The blend and the gate in one op: the bits of the two ops one after the
// other, forward and backward (dL/dφ too), in float and double.
template <class T>
void check_blend_gate(CpuOps<T>& ops) {
  const size_t n = 1037;
  const auto fill = [&](double sd) {
    const Vec x = randn(n, sd);
    return std::vector<T>(x.begin(), x.end());
  };
  const std::vector<T> os = fill(1), oc = fill(1), pre = fill(3), dog = fill(1), phi = {T(-0.7)};
  std::vector<T> o(n), og(n), o2(n), og2(n);
  ops.blend_fwd(os.data(), oc.data(), phi.data(), n, o.data());
  ops.sigmoid_gate_fwd(pre.data(), o.data(), n, og.data());
  ops.blend_gate_fwd(os.data(), oc.data(), phi.data(), pre.data(), n, o2.data(), og2.data());
  EXPECT_EQ(o2, o);
  EXPECT_EQ(og2, og);
  std::vector<T> dpre(n), d_o(n), ds(n), dc(n), dpre2(n), ds2(n), dc2(n);
  double dphi = 0, dphi2 = 0;
  ops.sigmoid_gate_bwd(pre.data(), o.data(), dog.data(), n, dpre.data(), d_o.data());
  ops.blend_bwd(os.data(), oc.data(), phi.data(), d_o.data(), n, ds.data(), dc.data(), &dphi);
  ops.blend_gate_bwd(os.data(), oc.data(), phi.data(), pre.data(), o.data(), dog.data(), n, dpre2.data(), ds2.data(),
                     dc2.data(), &dphi2);
  EXPECT_EQ(dpre2, dpre);
  EXPECT_EQ(ds2, ds);
  EXPECT_EQ(dc2, dc);
  EXPECT_EQ(dphi2, dphi);
}
TEST(BlendGate, FusedMatchesBlendThenGate) {
  check_blend_gate(F);
  check_blend_gate(D);
}

// ---- DSFF -------------------------------------------------------------------------

TEST(Swiglu, ForwardAndFiniteDifferences) {
  const size_t n = 50;
  Vec g = randn(n, 3.0), u = randn(n);
  g[0] = 50;
  g[1] = -50;
  Vec h(n);
  D.swiglu_fwd(g.data(), u.data(), n, h.data());
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(h[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-14);
  const Vec w = randn(n);
  auto L = [&] {
    Vec o(n);
    D.swiglu_fwd(g.data(), u.data(), n, o.data());
    return dot(w, o);
  };
  Vec dg(n), du(n);
  D.swiglu_bwd(g.data(), u.data(), w.data(), n, dg.data(), du.data());
  fd_check("swiglu dg", g, dg, L);
  fd_check("swiglu du", u, du, L);
}

TEST(Gelu, ForwardAndFiniteDifferences) {
  const size_t n = 60;
  Vec x = randn(n, 2.5);
  Vec y(n);
  D.gelu_fwd(x.data(), n, y.data());
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], 0.5 * x[i] * std::erfc(-x[i] / std::sqrt(2.0)), 1e-14);
  const Vec w = randn(n);
  auto L = [&] {
    Vec o(n);
    D.gelu_fwd(x.data(), n, o.data());
    return dot(w, o);
  };
  Vec dx(n);
  D.gelu_bwd(x.data(), w.data(), n, dx.data());
  fd_check("gelu dx", x, dx, L);
}

TEST(Fusion, ForwardAndFiniteDifferences) {
  const size_t n = 50;
  Vec pre = randn(n, 3.0), a = randn(n), b = randn(n);
  Vec out(n);
  D.fusion_fwd(pre.data(), a.data(), b.data(), nullptr, n, out.data());
  for (size_t i = 0; i < n; ++i) {
    const double al = 1 / (1 + std::exp(-pre[i]));
    EXPECT_NEAR(out[i], al * a[i] + (1 - al) * b[i], 1e-15);
  }
  const Vec w = randn(n);
  auto L = [&] {
    Vec o(n);
    D.fusion_fwd(pre.data(), a.data(), b.data(), nullptr, n, o.data());
    return dot(w, o);
  };
  Vec dpre(n), da(n), db(n);
  D.fusion_bwd(pre.data(), a.data(), b.data(), w.data(), n, dpre.data(), da.data(), db.data());
  fd_check("fusion dpre", pre, dpre, L);
  fd_check("fusion da", a, da, L);
  fd_check("fusion db", b, db, L);
}

// Float and double agree on the elementwise activations (float uses a
// polynomial exp).
TEST(Activations, FloatMatchesDouble) {
  const size_t n = 3000;
  const Vec x = randn(n, 4.0), y = randn(n), dy = randn(n);
  const Fvec xf = to_float(x), yf = to_float(y), dyf = to_float(dy);
  auto cmp = [](const char* name, const Fvec& f, const Vec& d) {
    const double e = rel_err(Vec(f.begin(), f.end()), d);
    report(std::string("f32 vs f64 ") + name, e);
    EXPECT_LT(e, 2e-6) << name;
  };
  Vec od(n), o2(n);
  Fvec of(n), o2f(n);
  D.gelu_fwd(x.data(), n, od.data());
  F.gelu_fwd(xf.data(), n, of.data());
  cmp("gelu", of, od);
  D.gelu_bwd(x.data(), dy.data(), n, od.data());
  F.gelu_bwd(xf.data(), dyf.data(), n, of.data());
  cmp("gelu_bwd", of, od);
  D.swiglu_fwd(x.data(), y.data(), n, od.data());
  F.swiglu_fwd(xf.data(), yf.data(), n, of.data());
  cmp("swiglu", of, od);
  D.swiglu_bwd(x.data(), y.data(), dy.data(), n, od.data(), o2.data());
  F.swiglu_bwd(xf.data(), yf.data(), dyf.data(), n, of.data(), o2f.data());
  cmp("swiglu_bwd dg", of, od);
  cmp("swiglu_bwd du", o2f, o2);
  D.sigmoid_gate_fwd(x.data(), y.data(), n, od.data());
  F.sigmoid_gate_fwd(xf.data(), yf.data(), n, of.data());
  cmp("sigmoid_gate", of, od);
}

}  // namespace
}  // namespace wiola::test
