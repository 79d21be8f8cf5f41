// The CUDA backend's norms, embedding and cross-entropy (kernels/cuda/norm.cu,
// vocab.cu) against the CPU backend, forward and backward in the fp32 mode.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tests/gpu/cuda_test_util.h"

namespace wiola {
namespace {

using namespace cuda_test;

TEST(CudaOps, NormEmbeddingCrossEntropy) {
  REQUIRE_GPU();
  const int N = 300, d = 96, V = 517, v0 = 40;
  const Vec x = randn(size_t(N) * d, 5), gam = randn(d, 6, 0.3f), del = randn(d, 7, 0.1f), dy = randn(size_t(N) * d, 8);
  const Vec E = randn(size_t(V) * d, 9), logits = randn(size_t(N) * V, 10, 3.f);
  std::mt19937_64 rg(11);
  std::vector<int32_t> ids(N), tg(N);
  for (auto& t : ids) t = int32_t(rg() % 600);  // some outside [v0, v0 + V)
  for (auto& t : tg) t = int32_t(rg() % 600);
  same_on_gpu("rmsnorm", 2e-5, [&](Ops<float>& o) {
    OnBackend r(o);
    float *bx = r.in(x), *g = r.in(gam), *de = r.in(del), *bdy = r.in(dy), *y = r.in(Vec(x.size()));
    float *rs = r.in(Vec(N)), *dx = r.in(Vec(x.size(), 0.5f)), *dg = r.in(Vec(d)), *dd = r.in(Vec(d));
    float* yop = r.in(Vec(x.size()));  // the GEMM operand copy
    o.rmsnorm_fwd(bx, g, de, N, d, 1e-6, y, rs, yop);
    o.rmsnorm_bwd(bx, g, de, rs, bdy, N, d, dx, dx, dg, dd);
    return std::vector<Vec>{r.out(y, x.size()), r.out(rs, N), r.out(dx, x.size()),
                            r.out(dg, d),       r.out(dd, d), r.out(yop, x.size())};
  });
  // The residual add fused with the norm (in place, as the model calls it),
  // and the backward with a separate residual gradient and with none.
  same_on_gpu("add_rmsnorm", 2e-5, [&](Ops<float>& o) {
    OnBackend r(o);
    float *bx = r.in(x), *s = r.in(dy), *g = r.in(gam), *de = r.in(del), *bdy = r.in(x), *y = r.in(Vec(x.size()));
    float *rs = r.in(Vec(N)), *dres = r.in(dy), *dx = r.in(Vec(x.size(), 0.5f)), *dz = r.in(Vec(x.size(), 0.5f));
    float *dg = r.in(Vec(d)), *dd = r.in(Vec(d));
    o.add_rmsnorm_fwd(bx, s, s, g, de, N, d, 1e-6, y, rs, nullptr);
    o.rmsnorm_bwd(s, g, de, rs, bdy, N, d, dres, dx, dg, dd);
    o.rmsnorm_bwd(s, g, de, rs, bdy, N, d, nullptr, dz, dg, dd);
    return std::vector<Vec>{r.out(s, x.size()),  r.out(y, x.size()), r.out(rs, N), r.out(dx, x.size()),
                            r.out(dz, x.size()), r.out(dg, d),       r.out(dd, d)};
  });
  same_on_gpu("embedding", 1e-6, [&](Ops<float>& o) {
    OnBackend r(o);
    Buffer<float, int32_t> bid(o, N);
    o.upload(bid.data(), ids.data(), N * 4);
    float *be = r.in(E), *out = r.in(Vec(size_t(N) * d)), *dE = r.in(Vec(E.size(), 0.25f)), *bdy = r.in(dy);
    o.embedding_fwd(bid.data(), N, be, v0, V, d, out);
    o.embedding_bwd(bid.data(), N, bdy, v0, V, d, dE);
    return std::vector<Vec>{r.out(out, size_t(N) * d), r.out(dE, E.size())};
  });
  same_on_gpu("cross-entropy (3 phases)", 2e-5, [&](Ops<float>& o) {
    OnBackend r(o);
    Buffer<float, int32_t> bt(o, N);
    o.upload(bt.data(), tg.data(), N * 4);
    float *lg = r.in(logits), *mx = r.in(Vec(N)), *se = r.in(Vec(N)), *t = r.in(Vec(N)), *loss = r.in(Vec(N));
    float* l2 = r.in(Vec(N));
    o.ce_row_max(lg, N, V, mx);
    o.ce_sumexp_target(lg, bt.data(), N, V, v0, mx, se, t);
    o.ce_loss(lg, bt.data(), N, V, v0, mx, se, t, l2);
    o.ce_loss_grad(lg, bt.data(), N, V, v0, mx, se, t, 0.01, loss);
    return std::vector<Vec>{r.out(mx, N),   r.out(se, N), r.out(t, N),
                            r.out(loss, N), r.out(l2, N), r.out(lg, logits.size())};
  });
  // With z-loss (train.z_loss): the term and the gradient of CE + z lse^2,
  // masked targets (negative) included.
  std::vector<int32_t> tgm = tg;
  for (int i = 0; i < N; i += 7) tgm[size_t(i)] = -1;
  same_on_gpu("cross-entropy with z-loss", 2e-5, [&](Ops<float>& o) {
    OnBackend r(o);
    Buffer<float, int32_t> bt(o, N);
    o.upload(bt.data(), tgm.data(), N * 4);
    float *lg = r.in(logits), *mx = r.in(Vec(N)), *se = r.in(Vec(N)), *t = r.in(Vec(N)), *loss = r.in(Vec(N));
    float* zl = r.in(Vec(N, 3.f));
    o.ce_row_max(lg, N, V, mx);
    o.ce_sumexp_target(lg, bt.data(), N, V, v0, mx, se, t);
    o.ce_loss_grad_z(lg, bt.data(), N, V, v0, mx, se, t, 0.01, 0.02, loss, zl);
    return std::vector<Vec>{r.out(loss, N), r.out(zl, N), r.out(lg, logits.size())};
  });
}

}  // namespace
}  // namespace wiola
