// The CUDA backend's fused ops against the ops they replace, bit for bit, in
// both precisions (kernels/cuda/optimizer.cu, norm.cu, gcla.cu, dsff.cu,
// srpe.cu).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "tests/gpu/cuda_test_util.h"

namespace wiola {
namespace {

using namespace cuda_test;

// The fused ops against the ops they replace, on the GPU in both precisions,
// bit for bit: AdamW with the weight copy and the gradient's zeroing against
// adamw, convert and zero; the norms' GEMM operand copy against convert; the
// blend and gate (forward and backward) against the four ops with their
// intermediate stored in the activation type; SRPE fused with the Q|K|V|gate
// split and join against copy_block and srpe_apply.
TEST(CudaOps, FusedOpsMatchUnfusedBitForBit) {
  REQUIRE_GPU();
  for (CudaPrecision prec : {CudaPrecision::FP32, CudaPrecision::BF16}) {
    SCOPED_TRACE(prec == CudaPrecision::FP32 ? "cuda-fp32" : "cuda (bf16)");
    auto ops = make_cuda_ops(prec);
    Ops<float>& o = *ops;
    const Precision pr = o.precision();
    std::vector<DynBuffer<float>> bufs;
    // A buffer of type t holding v (rounded once), and one of n elements of garbage.
    auto make = [&](DType t, const Vec& v) {
      Buffer<float> tmp(o, v.size());
      o.upload(tmp.data(), v.data(), v.size() * sizeof(float));
      bufs.emplace_back(o, t, v.size());
      o.convert(tmp.data(), bufs.back().data(), v.size());
      return bufs.back().data();
    };
    auto fresh = [&](DType t, size_t n) { return make(t, Vec(n, 3.5f)); };
    auto bytes = [&](CPtr p, size_t n) {
      std::vector<unsigned char> b(n * dtype_bytes(p.dtype()));
      o.download(b.data(), p.raw(), b.size());
      return b;
    };
    const DType F = DType::F32, act = pr.act;

    // AdamW: n odd, so the fused kernel runs a vector tail too.
    const size_t n = 10007;
    const Vec p0 = randn(n, 21), g0 = randn(n, 22, 0.1f), m0 = randn(n, 23, 0.01f);
    Vec v0 = randn(n, 24, 0.001f);
    for (float& x : v0) x = std::abs(x);
    const Ptr p1 = make(F, p0), g1 = make(F, g0), m1 = make(F, m0), v1 = make(F, v0), w1 = fresh(pr.weight, n);
    const Ptr p2 = make(F, p0), g2 = make(F, g0), m2 = make(F, m0), v2 = make(F, v0), w2 = fresh(pr.weight, n);
    o.adamw(p1, g1, m1, v1, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, nullptr, false);
    o.convert(p1, w1, n);
    o.zero(g1.raw(), n * sizeof(float));
    o.adamw(p2, g2, m2, v2, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, w2, true);
    EXPECT_EQ(bytes(p2, n), bytes(p1, n));
    EXPECT_EQ(bytes(m2, n), bytes(m1, n));
    EXPECT_EQ(bytes(v2, n), bytes(v1, n));
    EXPECT_EQ(bytes(w2, n), bytes(w1, n));
    EXPECT_EQ(bytes(g2, n), bytes(g1, n));

    // The norms with the operand copy (X-tilde: residual type, copy: act).
    const int N = 300, d = 96;
    const size_t nd = size_t(N) * d;
    const Ptr x = make(pr.residual, randn(nd, 25, 3.f)), b = make(pr.residual, randn(nd, 26));
    const Ptr gam = make(F, randn(d, 27, 0.3f)), del = make(F, randn(d, 28, 0.1f));
    const Ptr y1 = fresh(pr.residual, nd), r1 = fresh(F, N), c1 = fresh(act, nd);
    const Ptr y2 = fresh(pr.residual, nd), r2 = fresh(F, N), c2 = fresh(act, nd);
    o.rmsnorm_fwd(x, gam, del, N, d, 1e-6, y1, r1, nullptr);
    o.convert(y1, c1, nd);
    o.rmsnorm_fwd(x, gam, del, N, d, 1e-6, y2, r2, c2);
    EXPECT_EQ(bytes(y2, nd), bytes(y1, nd));
    EXPECT_EQ(bytes(r2, N), bytes(r1, N));
    EXPECT_EQ(bytes(c2, nd), bytes(c1, nd));
    const Ptr s1 = make(pr.residual, Vec(nd)), s2 = make(pr.residual, Vec(nd));
    o.add_rmsnorm_fwd(x, b, s1, gam, del, N, d, 1e-6, y1, r1, nullptr);
    o.convert(y1, c1, nd);
    o.add_rmsnorm_fwd(x, b, s2, gam, del, N, d, 1e-6, y2, r2, c2);
    EXPECT_EQ(bytes(s2, nd), bytes(s1, nd));
    EXPECT_EQ(bytes(y2, nd), bytes(y1, nd));
    EXPECT_EQ(bytes(c2, nd), bytes(c1, nd));

    // The prefix means (GCLA summaries, residual type) with their operand
    // copy, plain and with a carry (ragged column block and position
    // chunks); then the context projection's GEMM reads the same bits from
    // the copy as it converts from the summary itself.
    for (const bool carried : {false, true}) {
      const int sB = 2, sT = 150, kvd = 24;
      const size_t sn = size_t(sB) * sT * d;
      const Vec cv = randn(size_t(sB) * d, 33);
      const Ptr k1 = make(pr.residual, cv), k2 = make(pr.residual, cv);
      const Ptr pm1 = fresh(pr.residual, sn), pm2 = fresh(pr.residual, sn), q1 = fresh(act, sn), q2 = fresh(act, sn);
      if (carried) {
        o.prefix_mean_carry_fwd(x, sB, sT, d, 7, k1, pm1, nullptr);
        o.prefix_mean_carry_fwd(x, sB, sT, d, 7, k2, pm2, q2);
      } else {
        o.prefix_mean_fwd(x, sB, sT, d, nullptr, pm1, nullptr);
        o.prefix_mean_fwd(x, sB, sT, d, nullptr, pm2, q2);
      }
      o.convert(pm1, q1, sn);
      EXPECT_EQ(bytes(pm2, sn), bytes(pm1, sn));
      EXPECT_EQ(bytes(q2, sn), bytes(q1, sn));
      EXPECT_EQ(bytes(k2, size_t(sB) * d), bytes(k1, size_t(sB) * d));
      const Ptr wk = make(pr.weight, randn(size_t(kvd) * d, 34)), dk = make(act, randn(size_t(sB) * sT * kvd, 35));
      const Ptr f1 = fresh(act, size_t(sB) * sT * kvd), f2 = fresh(act, size_t(sB) * sT * kvd);
      const Ptr g1w = make(F, Vec(size_t(kvd) * d, 0.5f)), g2w = make(F, Vec(size_t(kvd) * d, 0.5f));
      const int sN = sB * sT;
      o.gemm(Trans::N, Trans::T, sN, kvd, d, 1.f, pm1, d, wk, d, 0.f, f1, kvd);
      o.gemm(Trans::N, Trans::T, sN, kvd, d, 1.f, q2, d, wk, d, 0.f, f2, kvd);
      o.gemm(Trans::T, Trans::N, kvd, d, sN, 1.f, dk, kvd, pm1, d, 1.f, g1w, d);
      o.gemm(Trans::T, Trans::N, kvd, d, sN, 1.f, dk, kvd, q2, d, 1.f, g2w, d);
      EXPECT_EQ(bytes(f2, size_t(sN) * kvd), bytes(f1, size_t(sN) * kvd));
      EXPECT_EQ(bytes(g2w, size_t(kvd) * d), bytes(g1w, size_t(kvd) * d));
    }

    // The blend and the gate, in the activation type.
    const Ptr os = make(act, randn(n, 29)), oc = make(act, randn(n, 30)), pre = make(act, randn(n, 31, 3.f));
    const Ptr dog = make(act, randn(n, 32)), phi = make(F, Vec{-0.7f});
    const Ptr o1 = fresh(act, n), og1 = fresh(act, n), dp1 = fresh(act, n), d_o = fresh(act, n);
    const Ptr ds1 = fresh(act, n), dc1 = fresh(act, n);
    const Ptr o2 = fresh(act, n), og2 = fresh(act, n), dp2 = fresh(act, n), ds2 = fresh(act, n), dc2 = fresh(act, n);
    Buffer<float, double> dphi(o, 2);
    o.blend_fwd(os, oc, phi, n, o1);
    o.sigmoid_gate_fwd(pre, o1, n, og1);
    o.sigmoid_gate_bwd(pre, o1, dog, n, dp1, d_o);
    o.blend_bwd(os, oc, phi, d_o, n, ds1, dc1, dphi.data());
    o.blend_gate_fwd(os, oc, phi, pre, n, o2, og2);
    o.blend_gate_bwd(os, oc, phi, pre, o2, dog, n, dp2, ds2, dc2, dphi.data() + 1);
    EXPECT_EQ(bytes(o2, n), bytes(o1, n));
    EXPECT_EQ(bytes(og2, n), bytes(og1, n));
    EXPECT_EQ(bytes(dp2, n), bytes(dp1, n));
    EXPECT_EQ(bytes(ds2, n), bytes(ds1, n));
    EXPECT_EQ(bytes(dc2, n), bytes(dc1, n));
    double h[2];
    o.download(h, dphi.data(), sizeof h);
    EXPECT_EQ(h[1], h[0]);

    // SRPE fused with the Q|K|V|gate split and with the join of the
    // gradients, in the activation type, against copy_block and srpe_apply:
    // 16 bytes a thread (dh 16 and 64) and element by element (dh 6: heads
    // off 16-byte boundaries; every operand one element into its buffer).
    for (const auto& [sB, sT, H, Hkv, dh, off] : {std::tuple{2, 37, 3, 1, 16, 0}, std::tuple{1, 33, 4, 2, 64, 0},
                                                  std::tuple{2, 9, 3, 1, 6, 0}, std::tuple{1, 9, 2, 1, 16, 1}}) {
      SCOPED_TRACE(testing::Message() << "dh " << dh << " offset " << off);
      const int sN = sB * sT, hd = H * dh, kvd = Hkv * dh, width = 2 * hd + 2 * kvd;
      const size_t sizes[4] = {size_t(sN) * hd, size_t(sN) * kvd, size_t(sN) * kvd, size_t(sN) * hd};
      const size_t nw = size_t(sN) * width;
      const size_t shift = size_t(off);  // a copy: older compilers capture no structured binding
      auto at = [&](DType t, const Vec& v) { return make(t, v) + shift; };
      const Ptr proj = at(act, randn(nw + size_t(off), 40)), tab = make(F, randn(size_t(sT) * dh, 41));
      Ptr one[4], two[4], g[4];
      std::vector<unsigned char> gb[4];
      for (int i = 0; i < 4; ++i) {
        one[i] = at(act, Vec(sizes[i] + size_t(off), 3.5f));
        two[i] = at(act, Vec(sizes[i] + size_t(off), -2.5f));
        g[i] = at(act, randn(sizes[i] + size_t(off), 42 + uint64_t(i)));
        gb[i] = bytes(g[i], sizes[i]);
      }
      size_t col = 0;
      for (int i = 0; i < 4; ++i) {
        o.copy_block(one[i], int(sizes[i] / size_t(sN)), proj + col, width, sN, int(sizes[i] / size_t(sN)));
        col += sizes[i] / size_t(sN);
      }
      o.srpe_apply(one[0], sB, sT, H, dh, tab, false);
      o.srpe_apply(one[1], sB, sT, Hkv, dh, tab, false);
      o.srpe_split_fwd(proj, sB, sT, H, Hkv, dh, tab, nullptr, two[0], two[1], two[2], two[3]);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(bytes(two[i], sizes[i]), bytes(one[i], sizes[i])) << "block " << i;
      const Ptr dj1 = at(act, Vec(nw + size_t(off), 1.5f)), dj2 = at(act, Vec(nw + size_t(off), -0.5f));
      o.srpe_split_bwd(g[0], g[1], g[2], g[3], sB, sT, H, Hkv, dh, tab, nullptr, dj2);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(bytes(g[i], sizes[i]), gb[i]) << "gradient " << i << " changed";
      o.srpe_apply(g[0], sB, sT, H, dh, tab, true);
      o.srpe_apply(g[1], sB, sT, Hkv, dh, tab, true);
      EXPECT_NE(bytes(g[0], sizes[0]), gb[0]);  // the rotation did something
      col = 0;
      for (int i = 0; i < 4; ++i) {
        o.copy_block(dj1 + col, width, g[i], int(sizes[i] / size_t(sN)), sN, int(sizes[i] / size_t(sN)));
        col += sizes[i] / size_t(sN);
      }
      EXPECT_EQ(bytes(dj2, nw), bytes(dj1, nw));
    }
  }
}

}  // namespace
}  // namespace wiola
