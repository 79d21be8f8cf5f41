// CpuOps basics: memory, GEMM, vector ops and reductions, AdamW, the
// attention forwarding, the parallel paths against serial calls, and
// run-to-run determinism. Layer pieces: test_ops_layers.cpp; embedding and
// cross-entropy: test_ops_vocab.cpp.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/backend.h"
#include "tests/ops/test_util.h"
#include "util/error.h"

namespace wiola::test {
namespace {

CpuOps<double> D;
CpuOps<float> F;

// Prints the largest error of every named check once the run ends.
class Report : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("max relative errors:\n");
    for (const auto& [name, err] : report_table()) std::printf("  %-32s %.3g\n", name.c_str(), err);
  }
};
[[maybe_unused]] auto* const kReport = ::testing::AddGlobalTestEnvironment(new Report);

// A new buffer's contents are undefined (kernels/ops.h): fresh pages from
// the kernel happen to be zero, but reused heap memory is not, and the
// AddressSanitizer build fills it with 0xbe.
TEST(Memory, AlignedCopiesAndZero) {
  auto ops = make_cpu_ops<float>();
  EXPECT_STREQ(ops->name(), "cpu-f32");
  EXPECT_STREQ(make_cpu_ops<double>()->name(), "cpu-f64");
  Buffer<float> a(*ops, 1000), b(*ops, 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  std::vector<float> h(1000), back(1000);
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(i) * 0.5f;
  ops->upload(a.data(), h.data(), a.bytes());
  ops->copy(b.data(), a.data(), a.bytes());
  ops->download(back.data(), b.data(), b.bytes());
  EXPECT_EQ(back, h);
  ops->zero(b.data(), b.bytes());
  ops->download(back.data(), b.data(), b.bytes());
  for (float v : back) ASSERT_EQ(v, 0.0f);
  Buffer<float, int32_t> ids(*ops, 3);
  EXPECT_EQ(ids.bytes(), 12u);
}

// A column block between matrices of different row lengths, nothing else
// touched (the fused Q|K|V|gate projection's split and join).
TEST(Memory, CopyBlockMovesOnlyTheBlock) {
  auto ops = make_cpu_ops<float>();
  const int rows = 37, ld_src = 23, ld_dst = 11, cols = 7, off = 5;
  std::vector<float> src(size_t(rows) * ld_src), dst(size_t(rows) * ld_dst, -1.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  Buffer<float> s(*ops, src.size()), d(*ops, dst.size());
  ops->upload(s.data(), src.data(), s.bytes());
  ops->upload(d.data(), dst.data(), d.bytes());
  ops->copy_block(Ptr(d.data()) + 2, ld_dst, CPtr(s.data()) + off, ld_src, rows, cols);
  ops->download(dst.data(), d.data(), d.bytes());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < ld_dst; ++c) {
      const bool in = c >= 2 && c < 2 + cols;
      ASSERT_EQ(dst[size_t(r) * ld_dst + c], in ? src[size_t(r) * ld_src + off + c - 2] : -1.0f) << r << "," << c;
    }
  EXPECT_THROW(ops->copy_block(d.data(), 3, s.data(), ld_src, rows, cols), Error);  // rows shorter than the block
}

// Naive C = alpha op(A) op(B) + beta C with leading dimensions.
void gemm_ref(Trans ta, Trans tb, int m, int n, int k, double alpha, const Vec& A, int lda, const Vec& B, int ldb,
              double beta, Vec& C, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p) {
        const double a = ta == Trans::N ? A[size_t(i) * lda + p] : A[size_t(p) * lda + i];
        const double b = tb == Trans::N ? B[size_t(p) * ldb + j] : B[size_t(j) * ldb + p];
        s += a * b;
      }
      C[size_t(i) * ldc + j] = alpha * s + beta * C[size_t(i) * ldc + j];
    }
}

TEST(Gemm, AllTransposesAndBatched) {
  const int m = 7, n = 5, k = 9, batch = 3;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      const int lda = (ta == Trans::N ? k : m) + 2;
      const int ldb = (tb == Trans::N ? n : k) + 1;
      const int ldc = n + 3;
      const long sA = long(lda) * (ta == Trans::N ? m : k) + 4;
      const long sB = long(ldb) * (tb == Trans::N ? k : n) + 1;
      const long sC = long(ldc) * m + 2;
      const Vec A = randn(size_t(sA) * batch), B = randn(size_t(sB) * batch);
      const Vec C0 = randn(size_t(sC) * batch);
      Vec C = C0, want = C0;
      D.gemm(ta, tb, m, n, k, 0.7, A.data(), lda, B.data(), ldb, -0.3, C.data(), ldc);
      gemm_ref(ta, tb, m, n, k, 0.7, A, lda, B, ldb, -0.3, want, ldc);
      EXPECT_LT(rel_err(C, want), 1e-14);

      C = C0;
      D.gemm_strided_batched(ta, tb, m, n, k, 1.5, A.data(), lda, sA, B.data(), ldb, sB, 0.5, C.data(), ldc, sC, batch);
      want = C0;
      for (int i = 0; i < batch; ++i) {
        Vec Ai(A.begin() + i * sA, A.begin() + (i + 1) * sA);
        Vec Bi(B.begin() + i * sB, B.begin() + (i + 1) * sB);
        Vec Ci(want.begin() + i * sC, want.begin() + (i + 1) * sC);
        gemm_ref(ta, tb, m, n, k, 1.5, Ai, lda, Bi, ldb, 0.5, Ci, ldc);
        std::copy(Ci.begin(), Ci.end(), want.begin() + i * sC);
      }
      EXPECT_LT(rel_err(C, want), 1e-14);

      Fvec Af = to_float(A), Bf = to_float(B), Cf = to_float(C0);
      F.gemm(ta, tb, m, n, k, 0.7f, Af.data(), lda, Bf.data(), ldb, -0.3f, Cf.data(), ldc);
      want = C0;
      gemm_ref(ta, tb, m, n, k, 0.7, A, lda, B, ldb, -0.3, want, ldc);
      EXPECT_LT(rel_err(Vec(Cf.begin(), Cf.end()), want), 1e-5);
    }
}

TEST(Elementwise, AddAxpyScaleSums) {
  const size_t n = 100003;  // above the parallel threshold, odd
  const Vec a = randn(n), b = randn(n);
  Vec out(n);
  D.add(a.data(), b.data(), out.data(), n);
  for (size_t i = 0; i < n; i += 997) EXPECT_EQ(out[i], a[i] + b[i]);
  Vec y = b;
  D.axpy(-2.5, a.data(), y.data(), n);
  for (size_t i = 0; i < n; i += 997) EXPECT_EQ(y[i], b[i] - 2.5 * a[i]);
  y = a;
  D.scale(y.data(), 3.0, n);
  for (size_t i = 0; i < n; i += 997) EXPECT_EQ(y[i], 3.0 * a[i]);

  long double ss = 0, s = 0;
  for (double v : a) {
    ss += (long double)v * v;
    s += v;
  }
  EXPECT_NEAR(sum_squares_of(D, a.data(), n), double(ss), 1e-12 * double(ss));
  EXPECT_NEAR(sum_of(D, a.data(), n), double(s), 1e-10);
  const Fvec af = to_float(a);
  long double ssf = 0;
  for (float v : af) ssf += (long double)v * v;
  const double got = sum_squares_of(F, af.data(), n);
  report("sum_squares f32 (double accumulate)", std::abs(got - double(ssf)) / double(ssf));
  EXPECT_NEAR(got, double(ssf), 1e-12 * double(ssf));
  EXPECT_EQ(sum_squares_of(D, a.data(), 0), 0.0);
  EXPECT_EQ(sum_of(D, a.data(), 5), a[0] + a[1] + a[2] + a[3] + a[4]);
}

// ---- AdamW ----------------------------------------------------------------------

TEST(AdamW, ThreeStepsMatchPyTorchFormula) {
  const size_t n = 37;
  const double lr = 3e-4, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  Vec p = randn(n), m(n, 0), v(n, 0);
  const Vec p0 = p;
  Vec pr = p, mr = m, vr = v;
  Fvec pf = to_float(p), mf(n, 0), vf(n, 0);
  for (int t = 1; t <= 3; ++t) {
    Vec g = randn(n, 0.1);
    Fvec gf = to_float(g);
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    D.adamw(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, bc1, bc2, nullptr, false);
    F.adamw(pf.data(), gf.data(), mf.data(), vf.data(), n, lr, b1, b2, eps, wd, bc1, bc2, nullptr, false);
    for (size_t i = 0; i < n; ++i) {  // scalar PyTorch AdamW
      pr[i] *= 1 - lr * wd;
      mr[i] = b1 * mr[i] + (1 - b1) * g[i];
      vr[i] = b2 * vr[i] + (1 - b2) * g[i] * g[i];
      pr[i] -= lr * (mr[i] / bc1) / (std::sqrt(vr[i] / bc2) + eps);
    }
  }
  const double err = rel_err(p, pr), errm = rel_err(m, mr), errv = rel_err(v, vr);
  // The update alone (p - p0: weight decay plus the Adam step).
  const double errd = rel_err(minus(p, p0), minus(pr, p0));
  report("adamw p", err);
  report("adamw p - p0", errd);
  EXPECT_LT(err, 1e-14);
  EXPECT_LT(errd, 1e-10);
  EXPECT_LT(errm, 1e-14);
  EXPECT_LT(errv, 1e-14);
  // The update itself (p - p0 is ~lr) agrees in float to float precision.
  const double ef = rel_err(Vec(pf.begin(), pf.end()), pr);
  report("f32 vs f64 adamw p", ef);
  EXPECT_LT(ef, 1e-6);
}

// AdamW fused with the weight copy and the gradient's zeroing: the same p,
// m, v bits as alone, the copy = p, the gradient zero (float and double).
template <class T>
void check_fused_adamw(CpuOps<T>& ops) {
  const size_t n = 1031;  // a vector tail and, in float, several threads' ranges
  const auto fill = [&](double sd) {
    const Vec x = randn(n, sd);
    return std::vector<T>(x.begin(), x.end());
  };
  std::vector<T> p = fill(1), g = fill(0.1), m = fill(0.01), v = fill(0.001);
  for (T& x : v) x = std::abs(x);
  std::vector<T> pf = p, gf = g, mf = m, vf = v, w(n, T(7));
  ops.adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.3, 0.2, nullptr, false);
  ops.adamw(pf.data(), gf.data(), mf.data(), vf.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.3, 0.2, w.data(), true);
  EXPECT_EQ(pf, p);
  EXPECT_EQ(mf, m);
  EXPECT_EQ(vf, v);
  EXPECT_EQ(w, p);
  EXPECT_EQ(gf, std::vector<T>(n, T(0)));
}
TEST(AdamW, FusedWeightCopyAndGradientZeroing) {
  check_fused_adamw(F);
  check_fused_adamw(D);
}

// ---- attention forwarding ------------------------------------------------------------

TEST(Attention, ForwardsToCpuKernel) {
  AttnShape s;
  s.B = 1;
  s.Tq = s.Tk = 5;
  s.H = 2;
  s.Hkv = 1;
  s.dh = 4;
  const AttnKeys keys;
  Vec q = randn(size_t(s.Tq) * s.H * s.dh), k = randn(size_t(s.Tk) * s.dh), v = randn(k.size());
  Vec o(q.size()), lse(size_t(s.H) * s.Tq);
  D.attention_fwd(s, keys, q.data(), k.data(), v.data(), nullptr, nullptr, o.data(), lse.data());
  // Naive causal softmax attention.
  const double sc = 1 / std::sqrt(double(s.dh));
  for (int h = 0; h < s.H; ++h)
    for (int i = 0; i < s.Tq; ++i) {
      double z = 0, acc[4] = {0, 0, 0, 0};
      for (int j = 0; j <= i; ++j) {
        double sd = 0;
        for (int c = 0; c < 4; ++c) sd += q[(size_t(i) * s.H + h) * 4 + c] * k[size_t(j) * 4 + c];
        const double e = std::exp(sc * sd);
        z += e;
        for (int c = 0; c < 4; ++c) acc[c] += e * v[size_t(j) * 4 + c];
      }
      EXPECT_NEAR(lse[size_t(h) * s.Tq + i], std::log(z), 1e-13);
      for (int c = 0; c < 4; ++c) EXPECT_NEAR(o[(size_t(i) * s.H + h) * 4 + c], acc[c] / z, 1e-13);
    }
  const Vec w = randn(o.size());
  auto L = [&] {
    Vec oo(o.size()), ll(lse.size());
    D.attention_fwd(s, keys, q.data(), k.data(), v.data(), nullptr, nullptr, oo.data(), ll.data());
    return dot(w, oo);
  };
  Vec dq(q.size()), dk(k.size()), dv(v.size());
  D.attention_bwd(s, keys, q.data(), k.data(), v.data(), nullptr, nullptr, o.data(), lse.data(), w.data(), dq.data(),
                  dk.data(), dv.data(), nullptr, nullptr);
  fd_check("attention dq", q, dq, L);
  fd_check("attention dk", k, dk, L);
  fd_check("attention dv", v, dv, L);
}

// ---- parallel paths and determinism -------------------------------------------------

// Runs with 3 threads (uneven partitions) and restores the thread count.
class ThreeThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = omp_get_max_threads();
    omp_set_num_threads(3);
  }
  void TearDown() override { omp_set_num_threads(saved_); }
  int saved_ = 1;
};

// Row ops on many rows (threaded) equal the same ops called row by row.
TEST_F(ThreeThreads, RowOpsMatchRowByRowCalls) {
  const int N = 601, d = 64;
  const Vec x = randn(size_t(N) * d), g = randn(d, 0.3, 1), dl = randn(d, 0.5), dy = randn(x.size());
  Vec y(x.size()), r(N), dx(x.size(), 0), dg(d, 0), dd(d, 0);
  D.rmsnorm_fwd(x.data(), g.data(), dl.data(), N, d, 1e-6, y.data(), r.data(), nullptr);
  D.rmsnorm_bwd(x.data(), g.data(), dl.data(), r.data(), dy.data(), N, d, dx.data(), dx.data(), dg.data(), dd.data());
  Vec y1(x.size()), r1(N), dx1(x.size(), 0), dg1(d, 0), dd1(d, 0);
  for (int i = 0; i < N; ++i) {
    const size_t o = size_t(i) * d;
    D.rmsnorm_fwd(x.data() + o, g.data(), dl.data(), 1, d, 1e-6, y1.data() + o, r1.data() + i, nullptr);
    D.rmsnorm_bwd(x.data() + o, g.data(), dl.data(), r1.data() + i, dy.data() + o, 1, d, dx1.data() + o, dx1.data() + o,
                  dg1.data(), dd1.data());
  }
  EXPECT_EQ(y, y1);
  EXPECT_EQ(dx, dx1);
  EXPECT_LT(rel_err(dg, dg1), 1e-13);
  EXPECT_LT(rel_err(dd, dd1), 1e-13);

  // The residual add fused with the norm: the sum and the norm of the
  // unfused ops; the backward with a separate residual gradient (and with
  // none) = copy (zero), then accumulate.
  const Vec br = randn(x.size());
  Vec s(x.size()), ys(x.size()), rs(N), s2 = br, y2(x.size()), r2(N);
  D.add(x.data(), br.data(), s.data(), x.size());
  D.rmsnorm_fwd(s.data(), g.data(), dl.data(), N, d, 1e-6, ys.data(), rs.data(), nullptr);
  D.add_rmsnorm_fwd(x.data(), s2.data(), s2.data(), g.data(), dl.data(), N, d, 1e-6, y2.data(), r2.data(), nullptr);
  EXPECT_EQ(s2, s);
  EXPECT_EQ(y2, ys);
  EXPECT_EQ(r2, rs);
  // With the GEMM operand copy (storage T here: y itself), the same y too.
  Vec s3 = br, y3(x.size()), r3(N), op3(x.size()), y4(x.size()), r4(N), op4(x.size());
  D.add_rmsnorm_fwd(x.data(), s3.data(), s3.data(), g.data(), dl.data(), N, d, 1e-6, y3.data(), r3.data(), op3.data());
  D.rmsnorm_fwd(s.data(), g.data(), dl.data(), N, d, 1e-6, y4.data(), r4.data(), op4.data());
  EXPECT_EQ(y3, ys);
  EXPECT_EQ(op3, ys);
  EXPECT_EQ(y4, ys);
  EXPECT_EQ(op4, ys);
  Vec dxa = dy, dxb(x.size(), 3.0), dz(x.size(), 3.0), dza(x.size(), 0.0);
  D.rmsnorm_bwd(s.data(), g.data(), dl.data(), rs.data(), x.data(), N, d, dxa.data(), dxa.data(), dg.data(), dd.data());
  D.rmsnorm_bwd(s.data(), g.data(), dl.data(), rs.data(), x.data(), N, d, dy.data(), dxb.data(), dg.data(), dd.data());
  D.rmsnorm_bwd(s.data(), g.data(), dl.data(), rs.data(), x.data(), N, d, dza.data(), dza.data(), dg.data(), dd.data());
  D.rmsnorm_bwd(s.data(), g.data(), dl.data(), rs.data(), x.data(), N, d, nullptr, dz.data(), dg.data(), dd.data());
  EXPECT_EQ(dxb, dxa);
  EXPECT_EQ(dz, dza);

  // Embedding backward with many repeated ids.
  const int V = 37;
  std::vector<int32_t> ids(N);
  for (auto& id : ids) id = randint(0, V + 3);  // some outside the slice
  Vec dE(size_t(V) * d, 0), dE1(dE.size(), 0);
  D.embedding_bwd(ids.data(), N, dy.data(), 0, V, d, dE.data());
  for (int i = 0; i < N; ++i) D.embedding_bwd(ids.data() + i, 1, dy.data() + size_t(i) * d, 0, V, d, dE1.data());
  EXPECT_EQ(dE, dE1);

  // Cross-entropy rows.
  const int Vc = 300, Nc = 80;
  const Vec z = randn(size_t(Nc) * Vc, 2.0);
  std::vector<int32_t> tg(Nc);
  for (auto& t : tg) t = randint(0, Vc - 1);
  Vec mx(Nc), se(Nc), tt(Nc), loss(Nc), gz = z;
  D.ce_row_max(z.data(), Nc, Vc, mx.data());
  D.ce_sumexp_target(z.data(), tg.data(), Nc, Vc, 0, mx.data(), se.data(), tt.data());
  D.ce_loss_grad(gz.data(), tg.data(), Nc, Vc, 0, mx.data(), se.data(), tt.data(), 0.5, loss.data());
  for (int i = 0; i < Nc; ++i) {
    Vec zi(z.begin() + size_t(i) * Vc, z.begin() + size_t(i + 1) * Vc);
    double m1, s1, t1, l1;
    D.ce_row_max(zi.data(), 1, Vc, &m1);
    D.ce_sumexp_target(zi.data(), &tg[i], 1, Vc, 0, &m1, &s1, &t1);
    D.ce_loss_grad(zi.data(), &tg[i], 1, Vc, 0, &m1, &s1, &t1, 0.5, &l1);
    ASSERT_EQ(l1, loss[i]);
    for (int j = 0; j < Vc; ++j) ASSERT_EQ(zi[j], gz[size_t(i) * Vc + j]);
  }

  // Context attention rows.
  const int H = 4, Hkv = 2, dh = 16, nc = 2, Na = 200;
  const Vec q = randn(size_t(Na) * H * dh), kc = randn(size_t(Na) * nc * Hkv * dh), vc = randn(kc.size()),
            dout = randn(q.size());
  Vec out(q.size()), pr(size_t(Na) * H * nc), dq(q.size(), 0), dkc(kc.size()), dvc(vc.size());
  D.ctx_attention_fwd(q.data(), kc.data(), vc.data(), Na, nc, H, Hkv, dh, Hkv * dh, out.data(), pr.data());
  D.ctx_attention_bwd(q.data(), kc.data(), vc.data(), pr.data(), dout.data(), Na, nc, H, Hkv, dh, Hkv * dh, dq.data(),
                      dkc.data(), dvc.data());
  for (int n = 0; n < Na; n += 7) {
    const size_t qo = size_t(n) * H * dh, ko = size_t(n) * nc * Hkv * dh;
    Vec o1(size_t(H) * dh), p1(size_t(H) * nc), dq1(o1.size(), 0), dk1(size_t(nc) * Hkv * dh), dv1(dk1.size());
    D.ctx_attention_fwd(q.data() + qo, kc.data() + ko, vc.data() + ko, 1, nc, H, Hkv, dh, Hkv * dh, o1.data(),
                        p1.data());
    D.ctx_attention_bwd(q.data() + qo, kc.data() + ko, vc.data() + ko, p1.data(), dout.data() + qo, 1, nc, H, Hkv, dh,
                        Hkv * dh, dq1.data(), dk1.data(), dv1.data());
    for (size_t c = 0; c < o1.size(); ++c) {
      ASSERT_EQ(o1[c], out[qo + c]);
      ASSERT_EQ(dq1[c], dq[qo + c]);
    }
    for (size_t c = 0; c < dk1.size(); ++c) {
      ASSERT_EQ(dk1[c], dkc[ko + c]);
      ASSERT_EQ(dv1[c], dvc[ko + c]);
    }
  }
}

TEST_F(ThreeThreads, SequenceOpsMatchNarrowCalls) {
  // Prefix mean over many columns equals column-block-wise calls.
  const int B = 3, Tn = 50, d = 600;
  const Vec x = randn(size_t(B) * Tn * d);
  Vec out(x.size()), dx(x.size(), 1.0);
  D.prefix_mean_fwd(x.data(), B, Tn, d, nullptr, out.data(), nullptr);
  D.prefix_mean_bwd(x.data(), B, Tn, d, nullptr, dx.data());
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < d; c += 37) {
      double s = 0, rs = 0;
      for (int t = 0; t < Tn; ++t) {
        s += x[(size_t(b) * Tn + t) * d + c];
        ASSERT_NEAR(out[(size_t(b) * Tn + t) * d + c], s / (t + 1), 1e-13);
      }
      for (int t = Tn - 1; t >= 0; --t) {
        rs += x[(size_t(b) * Tn + t) * d + c] / (t + 1);
        ASSERT_NEAR(dx[(size_t(b) * Tn + t) * d + c], 1.0 + rs, 1e-13);
      }
    }
  // ATM merge over many rows: groups of alternating size 1, 2.
  std::vector<int32_t> first(size_t(B) * Tn, 0), end(first.size(), 0), ng(B);
  for (int b = 0; b < B; ++b) {
    int t = 0, j = 0;
    while (t < Tn) {
      const int len = (j % 2 == 0 && t + 1 < Tn) ? 2 : 1;
      first[size_t(b) * Tn + j] = t;
      end[size_t(b) * Tn + j] = t + len - 1;
      t += len;
      ++j;
    }
    ng[b] = j;
  }
  Vec mo(x.size()), mdx(x.size(), 0);
  D.atm_merge_rows(x.data(), B, Tn, d, first.data(), end.data(), ng.data(), mo.data());
  D.atm_merge_rows_bwd(x.data(), B, Tn, d, first.data(), end.data(), ng.data(), mdx.data());
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < Tn; ++j) {
      const size_t r = (size_t(b) * Tn + j) * d;
      if (j >= ng[b]) {
        ASSERT_EQ(mo[r], 0.0);
        continue;
      }
      const int f = first[size_t(b) * Tn + j], e = end[size_t(b) * Tn + j];
      double s = 0;
      for (int t = f; t <= e; ++t) s += x[(size_t(b) * Tn + t) * d + 5];
      ASSERT_NEAR(mo[r + 5], s / (e - f + 1), 1e-15);
      for (int t = f; t <= e; ++t) ASSERT_NEAR(mdx[(size_t(b) * Tn + t) * d + 5], x[r + 5] / (e - f + 1), 1e-15);
    }
}

// The same call twice gives bit-identical results (training type, large
// sizes so every threaded reduction runs).
TEST(Determinism, RepeatedCallsAreBitIdentical) {
  const int N = 1024, d = 256;
  const size_t n = size_t(N) * d;
  const Fvec x = to_float(randn(n)), y = to_float(randn(n)), g = to_float(randn(d, 0.3, 1)),
             dl = to_float(randn(d, 0.5));
  std::vector<int32_t> ids(N);
  for (auto& id : ids) id = randint(0, 99);
  struct Run {
    double ss, s, dphi;
    Fvec dg, dd, dx, dE;
  };
  auto run = [&] {
    Run r;
    r.ss = sum_squares_of(F, x.data(), n);
    r.s = sum_of(F, x.data(), n);
    Fvec a(n), b(n), rs(N), yy(n);
    r.dphi = blend_bwd_dphi(F, x.data(), y.data(), -3.0f, y.data(), n, a.data(), b.data());
    F.rmsnorm_fwd(x.data(), g.data(), dl.data(), N, d, 1e-6, yy.data(), rs.data(), nullptr);
    r.dg.assign(d, 0);
    r.dd.assign(d, 0);
    r.dx.assign(n, 0);
    F.rmsnorm_bwd(x.data(), g.data(), dl.data(), rs.data(), y.data(), N, d, r.dx.data(), r.dx.data(), r.dg.data(),
                  r.dd.data());
    r.dE.assign(size_t(100) * d, 0);
    F.embedding_bwd(ids.data(), N, y.data(), 0, 100, d, r.dE.data());
    return r;
  };
  const Run a = run(), b = run();
  EXPECT_EQ(std::memcmp(&a.ss, &b.ss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.s, &b.s, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.dphi, &b.dphi, sizeof(double)), 0);
  EXPECT_EQ(a.dg, b.dg);
  EXPECT_EQ(a.dd, b.dd);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dE, b.dE);
  // blend_bwd's dphi against a serial double sum.
  double want = 0;
  const double beta = 1 / (1 + std::exp(3.0));
  for (size_t i = 0; i < n; ++i) want += double(y[i]) * (double(y[i]) - double(x[i]));
  EXPECT_NEAR(a.dphi, want * beta * (1 - beta), 1e-9 * std::abs(want * beta));
}

}  // namespace
}  // namespace wiola::test
