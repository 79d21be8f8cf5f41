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

}  // namespace
}  // namespace wiola::test
