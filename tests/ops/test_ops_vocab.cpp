// CpuOps vocab-parallel ops: embedding and the three-phase cross-entropy,
// unsplit and split over two vocabulary slices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tests/ops/test_util.h"

namespace wiola::test {
namespace {

CpuOps<double> D;
CpuOps<float> F;

TEST(Embedding, ForwardAndBackwardWithVocabSlice) {
  const int N = 8, d = 5, V = 10, v0 = 3, Vl = 4;  // this slice: ids 3..6
  const std::vector<int32_t> ids = {0, 3, 4, 6, 7, 4, 9, 4};
  Vec E = randn(size_t(Vl) * d);
  Vec out(size_t(N) * d, 9);
  D.embedding_fwd(ids.data(), N, E.data(), v0, Vl, d, out.data());
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < d; ++j) {
      const int r = ids[i] - v0;
      const double want = (r >= 0 && r < Vl) ? E[size_t(r) * d + j] : 0.0;
      EXPECT_EQ(out[size_t(i) * d + j], want);
    }
  (void)V;
  const Vec w = randn(out.size());
  auto L = [&] {
    Vec o(out.size());
    D.embedding_fwd(ids.data(), N, E.data(), v0, Vl, d, o.data());
    return dot(w, o);
  };
  const Vec dE0 = randn(E.size());
  Vec dE = dE0;
  D.embedding_bwd(ids.data(), N, w.data(), v0, Vl, d, dE.data());
  fd_check("embedding dE", E, minus(dE, dE0), L);
}

// Naive log-softmax loss and gradient of one row set.
void ce_ref(const Vec& z, const std::vector<int32_t>& tg, int N, int V, double scale, Vec& loss, Vec& grad) {
  loss.assign(N, 0);
  grad.assign(z.size(), 0);
  for (int i = 0; i < N; ++i) {
    double s = 0;
    for (int j = 0; j < V; ++j) s += std::exp(z[size_t(i) * V + j]);
    loss[i] = std::log(s) - z[size_t(i) * V + tg[i]];
    for (int j = 0; j < V; ++j) grad[size_t(i) * V + j] = scale * (std::exp(z[size_t(i) * V + j]) / s - (j == tg[i]));
  }
}

// The three phases on one slice [v0, v0+Vl) (no communication: one rank).
template <class T>
void ce_unsplit(Ops<T>& ops, std::vector<T>& z, const std::vector<int32_t>& tg, int N, int V, double scale,
                std::vector<T>& loss) {
  std::vector<T> mx(N), se(N), tt(N);
  loss.assign(N, 0);
  ops.ce_row_max(z.data(), N, V, mx.data());
  ops.ce_sumexp_target(z.data(), tg.data(), N, V, 0, mx.data(), se.data(), tt.data());
  ops.ce_loss_grad(z.data(), tg.data(), N, V, 0, mx.data(), se.data(), tt.data(), scale, loss.data());
}

TEST(CrossEntropy, MatchesNaiveLogSoftmax) {
  const int N = 6, V = 11;
  const double scale = 1.0 / N;
  Vec z = randn(size_t(N) * V, 3.0);
  z[5] = 60;  // a large logit: the max shift keeps exp finite
  const std::vector<int32_t> tg = {0, 10, 5, 3, 3, 7};
  Vec lref, gref;
  ce_ref(z, tg, N, V, scale, lref, gref);
  Vec g = z, loss;
  ce_unsplit(D, g, tg, N, V, scale, loss);
  EXPECT_LT(rel_err(loss, lref), 1e-13);
  EXPECT_LT(rel_err(g, gref), 1e-13);
  report("fwd ce loss", rel_err(loss, lref));
  report("fwd ce grad", rel_err(g, gref));

  // ce_loss (evaluation) gives the same loss.
  Vec mx(N), se(N), tt(N), l2(N);
  D.ce_row_max(z.data(), N, V, mx.data());
  D.ce_sumexp_target(z.data(), tg.data(), N, V, 0, mx.data(), se.data(), tt.data());
  D.ce_loss(z.data(), tg.data(), N, V, 0, mx.data(), se.data(), tt.data(), l2.data());
  EXPECT_LT(rel_err(l2, lref), 1e-13);

  // Finite differences of L = scale * sum loss.
  z[5] = 0.3;
  auto L = [&] {
    Vec zz = z, l;
    ce_unsplit(D, zz, tg, N, V, scale, l);
    double s = 0;
    for (double v : l) s += v;
    return scale * s;
  };
  Vec gz = z, l;
  ce_unsplit(D, gz, tg, N, V, scale, l);
  fd_check("cross_entropy dlogits", z, gz, L);

  // Float agrees with double.
  std::vector<float> zf = to_float(z), lf;
  ce_unsplit(F, zf, tg, N, V, scale, lf);
  const double el = rel_err(Vec(lf.begin(), lf.end()), l);
  const double eg = rel_err(Vec(zf.begin(), zf.end()), gz);
  report("f32 vs f64 ce loss", el);
  report("f32 vs f64 ce grad", eg);
  EXPECT_LT(el, 1e-5);
  EXPECT_LT(eg, 1e-5);
}

// A negative target is masked (documents, docs/model.md §2): loss 0 and a
// zero gradient row, in float and double, for training and evaluation; the
// other rows are untouched.
TEST(CrossEntropy, MaskedTargets) {
  const int N = 4, V = 9;
  const Vec z = randn(size_t(N) * V, 2.0);
  const std::vector<int32_t> tg = {3, -1, 8, -1};
  Vec g = z, loss, gref, lref;
  ce_unsplit(D, g, tg, N, V, 0.5, loss);
  ce_ref(z, {3, 0, 8, 0}, N, V, 0.5, lref, gref);
  std::vector<float> zf = to_float(z), lf;
  ce_unsplit(F, zf, tg, N, V, 0.5, lf);
  Vec mx(N), se(N), tt(N), le(N, 7.0);
  D.ce_row_max(z.data(), N, V, mx.data());
  D.ce_sumexp_target(z.data(), tg.data(), N, V, 0, mx.data(), se.data(), tt.data());
  D.ce_loss(z.data(), tg.data(), N, V, 0, mx.data(), se.data(), tt.data(), le.data());
  for (int i = 0; i < N; ++i) {
    const bool masked = tg[size_t(i)] < 0;
    EXPECT_EQ(loss[size_t(i)], masked ? 0.0 : loss[size_t(i)]);
    EXPECT_EQ(lf[size_t(i)], masked ? 0.0f : lf[size_t(i)]);
    EXPECT_EQ(le[size_t(i)], masked ? 0.0 : le[size_t(i)]);
    if (!masked) {
      EXPECT_NEAR(loss[size_t(i)], lref[size_t(i)], 1e-12);
    }
    for (int j = 0; j < V; ++j) {
      const size_t k = size_t(i) * V + size_t(j);
      EXPECT_NEAR(g[k], masked ? 0.0 : gref[k], 1e-12) << i << " " << j;
      EXPECT_NEAR(zf[k], masked ? 0.0 : gref[k], 1e-6) << i << " " << j;
    }
  }
}

TEST(CrossEntropy, VocabSplitMatchesUnsplit) {
  const int N = 5, V = 13, V1 = 6, V2 = V - V1;  // slices [0,6) and [6,13)
  const double scale = 0.37;
  const Vec z = randn(size_t(N) * V, 2.0);
  const std::vector<int32_t> tg = {0, 5, 6, 12, 9};
  Vec lref, gref;
  ce_ref(z, tg, N, V, scale, lref, gref);

  Vec z1(size_t(N) * V1), z2(size_t(N) * V2);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < V; ++j) (j < V1 ? z1[size_t(i) * V1 + j] : z2[size_t(i) * V2 + j - V1]) = z[size_t(i) * V + j];
  // Phase 1 per slice, combined by max (the TP all-reduce).
  Vec m1(N), m2(N), mx(N);
  D.ce_row_max(z1.data(), N, V1, m1.data());
  D.ce_row_max(z2.data(), N, V2, m2.data());
  for (int i = 0; i < N; ++i) mx[i] = std::max(m1[i], m2[i]);
  // Phase 2 per slice with the global max, combined by sum.
  Vec s1(N), s2(N), t1(N), t2(N), se(N), tt(N);
  D.ce_sumexp_target(z1.data(), tg.data(), N, V1, 0, mx.data(), s1.data(), t1.data());
  D.ce_sumexp_target(z2.data(), tg.data(), N, V2, V1, mx.data(), s2.data(), t2.data());
  for (int i = 0; i < N; ++i) {
    // The target lives in exactly one slice; the other contributes 0.
    EXPECT_EQ(tg[i] < V1 ? t2[i] : t1[i], 0.0);
    se[i] = s1[i] + s2[i];
    tt[i] = t1[i] + t2[i];
  }
  // Phase 3 per slice.
  Vec l1(N), l2(N);
  D.ce_loss_grad(z1.data(), tg.data(), N, V1, 0, mx.data(), se.data(), tt.data(), scale, l1.data());
  D.ce_loss_grad(z2.data(), tg.data(), N, V2, V1, mx.data(), se.data(), tt.data(), scale, l2.data());
  EXPECT_LT(rel_err(l1, lref), 1e-13);
  EXPECT_LT(rel_err(l2, lref), 1e-13);
  Vec g(z.size());
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < V; ++j) g[size_t(i) * V + j] = j < V1 ? z1[size_t(i) * V1 + j] : z2[size_t(i) * V2 + j - V1];
  const double err = rel_err(g, gref);
  report("ce vocab split grad", err);
  EXPECT_LT(err, 1e-13);
}

// z-loss (train.z_loss, docs/model.md §4) over vocabulary slices [v0 of
// each, ...) of z[N, V] (one slice: unsplit), the phases combined as TP's
// all-reduces would: loss and zloss per row, z's slices made the gradient of
// scale * sum(loss + zloss).
template <class T>
void ce_z_sliced(Ops<T>& ops, std::vector<T>& z, const std::vector<int32_t>& tg, int N, int V,
                 const std::vector<int>& cuts, double scale, double zc, std::vector<T>& loss, std::vector<T>& zl) {
  const size_t ns = cuts.size() + 1;
  std::vector<std::vector<T>> part(ns);
  std::vector<int> v0(ns + 1, 0);
  for (size_t k = 0; k < cuts.size(); ++k) v0[k + 1] = cuts[k];
  v0[ns] = V;
  for (size_t k = 0; k < ns; ++k)
    for (int i = 0; i < N; ++i) part[k].insert(part[k].end(), z.begin() + i * V + v0[k], z.begin() + i * V + v0[k + 1]);
  std::vector<T> mx(N, -INFINITY), se(N, 0), tt(N, 0), m1(N), s1(N), t1(N);
  for (size_t k = 0; k < ns; ++k) {
    ops.ce_row_max(part[k].data(), N, v0[k + 1] - v0[k], m1.data());
    for (int i = 0; i < N; ++i) mx[i] = std::max(mx[i], m1[i]);
  }
  for (size_t k = 0; k < ns; ++k) {
    ops.ce_sumexp_target(part[k].data(), tg.data(), N, v0[k + 1] - v0[k], v0[k], mx.data(), s1.data(), t1.data());
    for (int i = 0; i < N; ++i) se[i] += s1[i], tt[i] += t1[i];
  }
  loss.assign(N, 0);
  zl.assign(N, 0);
  for (size_t k = 0; k < ns; ++k) {  // every slice computes the same rows' loss and zloss
    ops.ce_loss_grad_z(part[k].data(), tg.data(), N, v0[k + 1] - v0[k], v0[k], mx.data(), se.data(), tt.data(), scale,
                       zc, loss.data(), zl.data());
    for (int i = 0; i < N; ++i)
      std::copy(part[k].begin() + (v0[k + 1] - v0[k]) * i, part[k].begin() + (v0[k + 1] - v0[k]) * (i + 1),
                z.begin() + i * V + v0[k]);
  }
}

// z-loss: the term z lse^2 per row against a naive sum, its gradient
// against finite differences of scale * sum(CE + z lse^2) (double), masked
// rows zero, two vocabulary slices equal to one, float equal to double.
TEST(CrossEntropy, ZLoss) {
  const int N = 6, V = 11;
  const double scale = 0.4, zc = 0.05;
  Vec z = randn(size_t(N) * V, 3.0);
  const std::vector<int32_t> tg = {0, 10, -1, 3, 3, 7};
  Vec g = z, loss, zl;
  ce_z_sliced(D, g, tg, N, V, {}, scale, zc, loss, zl);
  Vec lref, gref;
  ce_ref(z, {0, 10, 0, 3, 3, 7}, N, V, scale, lref, gref);
  for (int i = 0; i < N; ++i) {
    double s = 0;
    for (int j = 0; j < V; ++j) s += std::exp(z[size_t(i) * V + j]);
    const bool masked = tg[size_t(i)] < 0;
    EXPECT_NEAR(zl[size_t(i)], masked ? 0.0 : zc * std::log(s) * std::log(s), 1e-12) << i;
    EXPECT_NEAR(loss[size_t(i)], masked ? 0.0 : lref[size_t(i)], 1e-12) << i;
    for (int j = 0; j < V; ++j) {
      const double sm = std::exp(z[size_t(i) * V + j]) / s;
      const double want = masked ? 0.0 : gref[size_t(i) * V + j] + scale * 2 * zc * std::log(s) * sm;
      EXPECT_NEAR(g[size_t(i) * V + j], want, 1e-12) << i << " " << j;
    }
  }
  auto L = [&] {
    Vec zz = z, l, q;
    ce_z_sliced(D, zz, tg, N, V, {}, scale, zc, l, q);
    double s = 0;
    for (int i = 0; i < N; ++i) s += l[size_t(i)] + q[size_t(i)];
    return scale * s;
  };
  fd_check("cross_entropy + z-loss dlogits", z, g, L);

  Vec g2 = z, loss2, zl2;  // vocab-parallel: slices [0,4), [4,9), [9,11)
  ce_z_sliced(D, g2, tg, N, V, {4, 9}, scale, zc, loss2, zl2);
  report("ce z-loss vocab split grad", rel_err(g2, g));
  EXPECT_LT(rel_err(g2, g), 1e-13);
  EXPECT_LT(rel_err(zl2, zl), 1e-13);
  EXPECT_LT(rel_err(loss2, loss), 1e-13);

  std::vector<float> zf = to_float(z), lf, qf;
  ce_z_sliced(F, zf, tg, N, V, {4, 9}, scale, zc, lf, qf);
  report("f32 vs f64 ce z-loss grad", rel_err(Vec(zf.begin(), zf.end()), g));
  EXPECT_LT(rel_err(Vec(zf.begin(), zf.end()), g), 1e-5);
  EXPECT_LT(rel_err(Vec(qf.begin(), qf.end()), zl), 1e-5);
}

}  // namespace
}  // namespace wiola::test
