// The CUDA backend against the CPU backend (ctest label "gpu"). Every op's
// forward and backward on random inputs in the fp32 mode (TF32 off), the
// whole model step (loss, every gradient, parameters after AdamW, ATM
// decisions), cached decoding against the full forward, and a short bf16
// training run against fp32. Without a usable GPU every test is SKIPPED with
// the reason, never passed.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <tuple>
#include <vector>

#include "dist/optimizer.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/gemm_tuning.h"
#include "kernels/ops.h"
#include "kernels/scalar.h"
#include "util/error.h"
#include "model/model.h"
#include "tests/model/precision_checks.h"

#ifdef WIOLA_CUDA_EMU
#include "tools/cuda_emu/launch_record.h"
#endif

namespace wiola {
namespace {

#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_status();        \
  } while (0)

using Vec = std::vector<float>;

Vec randn(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

using checks::segments;

// Uploads host inputs into backend buffers, runs `op` on the backend,
// downloads the buffers named as outputs.
struct OnBackend {
  Ops<float>& ops;
  std::vector<Buffer<float>> bufs;
  explicit OnBackend(Ops<float>& o) : ops(o) {}
  float* in(const Vec& h) {
    bufs.emplace_back(ops, h.size());
    ops.upload(bufs.back().data(), h.data(), h.size() * sizeof(float));
    return bufs.back().data();
  }
  Vec out(const float* p, size_t n) {
    Vec h(n);
    ops.download(h.data(), p, n * sizeof(float));
    return h;
  }
};

// max |a - b| / max(max |a|, floor)
double rel(const Vec& a, const Vec& b, double floor = 1e-20) {
  double d = 0, m = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    m = std::max(m, std::abs(double(a[i])));
  }
  return d / m;
}

// Runs f on the CPU backend and on cuda-fp32; every output within tol.
void same_on_gpu(const char* name, double tol, const std::function<std::vector<Vec>(Ops<float>&)>& f) {
  auto cpu = make_backend<float>("cpu");
  auto gpu = make_cuda_ops(CudaPrecision::FP32);
  const auto a = f(*cpu), b = f(*gpu);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << name << " output " << i;
    const double e = rel(a[i], b[i]);
    std::printf("  %-28s output %zu: max rel diff %.2e (tol %.0e)\n", name, i, e, tol);
    EXPECT_LT(e, tol) << name << " output " << i;
  }
}

TEST(CudaOps, ElementwiseForwardBackward) {
  REQUIRE_GPU();
  const size_t n = 10007;
  const Vec a = randn(n, 1), b = randn(n, 2), c = randn(n, 3), d = randn(n, 4);
  same_on_gpu("swiglu", 2e-6, [&](Ops<float>& o) {
    OnBackend r(o);
    float *g = r.in(a), *u = r.in(b), *dh = r.in(c), *h = r.in(Vec(n)), *dg = r.in(Vec(n)), *du = r.in(Vec(n));
    o.swiglu_fwd(g, u, n, h);
    o.swiglu_bwd(g, u, dh, n, dg, du);
    return std::vector<Vec>{r.out(h, n), r.out(dg, n), r.out(du, n)};
  });
  same_on_gpu("gelu", 2e-6, [&](Ops<float>& o) {
    OnBackend r(o);
    float *x = r.in(a), *dy = r.in(b), *y = r.in(Vec(n)), *dx = r.in(Vec(n));
    o.gelu_fwd(x, n, y);
    o.gelu_bwd(x, dy, n, dx);
    return std::vector<Vec>{r.out(y, n), r.out(dx, n)};
  });
  same_on_gpu("fusion + gate + blend", 2e-6, [&](Ops<float>& o) {
    OnBackend r(o);
    float *pre = r.in(a), *x = r.in(b), *y = r.in(c), *dout = r.in(d), *phi = r.in(Vec{-0.7f});
    float *f = r.in(Vec(n)), *fr = r.in(Vec(n)), *dp = r.in(Vec(n)), *da = r.in(Vec(n)), *db = r.in(Vec(n));
    float *g = r.in(Vec(n)), *gp = r.in(Vec(n)), *gx = r.in(Vec(n));
    float *bl = r.in(Vec(n)), *bs = r.in(Vec(n)), *bc = r.in(Vec(n));
    Buffer<float, double> dphi(o, 1);
    o.fusion_fwd(pre, x, y, nullptr, n, f);
    o.fusion_fwd(pre, x, y, dout, n, fr);  // with the residual add
    o.fusion_bwd(pre, x, y, dout, n, dp, da, db);
    o.sigmoid_gate_fwd(pre, x, n, g);
    o.sigmoid_gate_bwd(pre, x, dout, n, gp, gx);
    o.blend_fwd(x, y, phi, n, bl);
    o.blend_bwd(x, y, phi, dout, n, bs, bc, dphi.data());
    // The blend and the gate in one op, forward and backward.
    float *fo = r.in(Vec(n)), *fog = r.in(Vec(n)), *fdp = r.in(Vec(n)), *fds = r.in(Vec(n)), *fdc = r.in(Vec(n));
    Buffer<float, double> fdphi(o, 1);
    o.blend_gate_fwd(x, y, phi, pre, n, fo, fog);
    o.blend_gate_bwd(x, y, phi, pre, fo, dout, n, fdp, fds, fdc, fdphi.data());
    double dph = 0, fdph = 0;
    o.download(&dph, dphi.data(), sizeof dph);
    o.download(&fdph, fdphi.data(), sizeof fdph);
    return std::vector<Vec>{r.out(f, n),   r.out(fr, n),   r.out(dp, n),  r.out(da, n),  r.out(db, n),
                            r.out(g, n),   r.out(gp, n),   r.out(gx, n),  r.out(bl, n),  r.out(bs, n),
                            r.out(bc, n),  Vec{float(dph)}, r.out(fo, n), r.out(fog, n), r.out(fdp, n),
                            r.out(fds, n), r.out(fdc, n),  Vec{float(fdph)}};
  });
  same_on_gpu("reductions + adamw", 1e-6, [&](Ops<float>& o) {
    OnBackend r(o);
    float *p = r.in(a), *g = r.in(b), *m = r.in(Vec(n)), *v = r.in(Vec(n));
    Buffer<float, double> acc(o, 2);
    o.zero(acc.data(), acc.bytes());
    o.sum_squares(g, n, acc.data());
    o.sum(g, n, acc.data() + 1);
    o.adamw(p, g, m, v, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, nullptr, false);
    // Once more fused with the weight copy and the gradient's zeroing.
    float* w = r.in(Vec(n));
    o.adamw(p, g, m, v, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.19, 0.0975, w, true);
    double h[2];
    o.download(h, acc.data(), sizeof h);
    return std::vector<Vec>{r.out(p, n), r.out(m, n), r.out(v, n), Vec{float(h[0]), float(h[1])}, r.out(w, n),
                            r.out(g, n)};
  });
}

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
    return std::vector<Vec>{r.out(y, x.size()), r.out(rs, N), r.out(dx, x.size()), r.out(dg, d), r.out(dd, d),
                            r.out(yop, x.size())};
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
    return std::vector<Vec>{r.out(s, x.size()), r.out(y, x.size()), r.out(rs, N), r.out(dx, x.size()),
                            r.out(dz, x.size()), r.out(dg, d), r.out(dd, d)};
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
    return std::vector<Vec>{r.out(mx, N), r.out(se, N), r.out(t, N), r.out(loss, N), r.out(l2, N),
                            r.out(lg, logits.size())};
  });
}

TEST(CudaOps, GcladPiecesAndAtm) {
  REQUIRE_GPU();
  const int B = 3, Tn = 37, d = 64, H = 4, Hkv = 2, dh = 16, nc = 2, N = B * Tn;
  const Vec x = randn(size_t(N) * d, 12), dout = randn(size_t(N) * d, 13);
  // The scans split positions into 32 chunks and columns into blocks of 32:
  // fewer positions than chunks, and a ragged last chunk and column block.
  for (const auto& shape : {std::tuple{B, Tn, d}, std::tuple{2, 301, 40}}) {
    // Plain names, not structured bindings: clang before 16 cannot capture
    // those in the lambda below (scripts/sanitize.sh builds with clang).
    const int sB = std::get<0>(shape), sTn = std::get<1>(shape), sd = std::get<2>(shape);
    const Vec sx = randn(size_t(sB) * sTn * sd, 12), sdout = randn(size_t(sB) * sTn * sd, 13),
              carry0 = randn(size_t(sB) * sd, 19);
    same_on_gpu("prefix means", 1e-6, [&](Ops<float>& o) {
      OnBackend r(o);
      float *bx = r.in(sx), *out = r.in(Vec(sx.size())), *dx = r.in(Vec(sx.size(), 1.f)), *bd = r.in(sdout);
      float *carry = r.in(carry0), *oc = r.in(Vec(sx.size())), *oop = r.in(Vec(sx.size()));
      o.prefix_mean_fwd(bx, sB, sTn, sd, out, oop);  // with the GEMM operand copy
      o.prefix_mean_bwd(bd, sB, sTn, sd, dx);
      o.prefix_mean_carry_fwd(bx, sB, sTn, sd, 5, carry, oc, nullptr);
      return std::vector<Vec>{r.out(out, sx.size()), r.out(dx, sx.size()), r.out(oc, sx.size()),
                              r.out(carry, carry0.size()), r.out(oop, sx.size())};
    });
  }
  const Vec q = randn(size_t(N) * H * dh, 14), kc = randn(size_t(N) * nc * Hkv * dh, 15),
            vc = randn(size_t(N) * nc * Hkv * dh, 16), dq0 = randn(size_t(N) * H * dh, 17),
            dctx = randn(size_t(N) * H * dh, 18);
  same_on_gpu("context attention", 2e-5, [&](Ops<float>& o) {
    OnBackend r(o);
    float *bq = r.in(q), *bk = r.in(kc), *bv = r.in(vc), *out = r.in(Vec(q.size())), *pr = r.in(Vec(size_t(N) * H * nc));
    float *dq = r.in(dq0), *dk = r.in(Vec(kc.size())), *dv = r.in(Vec(vc.size())), *bd = r.in(dctx);
    o.ctx_attention_fwd(bq, bk, bv, N, nc, H, Hkv, dh, Hkv * dh, out, pr);
    o.ctx_attention_bwd(bq, bk, bv, pr, bd, N, nc, H, Hkv, dh, Hkv * dh, dq, dk, dv);
    return std::vector<Vec>{r.out(out, q.size()), r.out(pr, size_t(N) * H * nc), r.out(dq, q.size()),
                            r.out(dk, kc.size()), r.out(dv, vc.size())};
  });
  // The merged context projection's layout: keys and values interleaved,
  // [N, nc, 2, Hkv dh] (row stride 2 Hkv dh); the gradients' halves of one
  // buffer, written row by row (the other half keeps its values).
  const Vec kv = randn(size_t(N) * nc * 2 * Hkv * dh, 20), dkv0 = randn(kv.size(), 21);
  same_on_gpu("context attention, keys|values interleaved", 2e-5, [&](Ops<float>& o) {
    OnBackend r(o);
    const int kvd = Hkv * dh;
    float *bq = r.in(q), *bkv = r.in(kv), *out = r.in(Vec(q.size())), *pr = r.in(Vec(size_t(N) * H * nc));
    float *dq = r.in(dq0), *dkv = r.in(dkv0), *bd = r.in(dctx), *dk = r.in(dkv0);
    o.ctx_attention_fwd(bq, bkv, bkv + kvd, N, nc, H, Hkv, dh, 2 * kvd, out, pr);
    o.ctx_attention_bwd(bq, bkv, bkv + kvd, pr, bd, N, nc, H, Hkv, dh, 2 * kvd, dq, dkv, dkv + kvd);
    // Keys only: the value half of dk keeps dkv0.
    Vec scratch(kv.size());
    float* dvs = r.in(scratch);
    o.ctx_attention_bwd(bq, bkv, bkv + kvd, pr, bd, N, nc, H, Hkv, dh, 2 * kvd, dq, dk, dvs);
    return std::vector<Vec>{r.out(out, q.size()), r.out(pr, size_t(N) * H * nc), r.out(dq, q.size()),
                            r.out(dkv, kv.size()), r.out(dk, kv.size())};
  });
  // SRPE with a non-trivial table, forward then the transpose.
  Vec table(size_t(Tn) * dh);
  for (int t = 0; t < Tn; ++t)
    for (int j = 0; j < dh / 2; ++j) {
      const double th = t * std::pow(1e4, -2.0 * j / dh), rr = 1 + 0.1 * std::sin(0.01 * t);
      table[(size_t(t) * dh / 2 + j) * 2] = float(rr * std::cos(th));
      table[(size_t(t) * dh / 2 + j) * 2 + 1] = float(rr * std::sin(th));
    }
  same_on_gpu("srpe", 1e-6, [&](Ops<float>& o) {
    OnBackend r(o);
    float *bq = r.in(q), *tb = r.in(table), *b2 = r.in(q);
    o.srpe_apply(bq, B, Tn, H, dh, tb, false);
    o.srpe_apply(b2, B, Tn, H, dh, tb, true);
    return std::vector<Vec>{r.out(bq, q.size()), r.out(b2, q.size())};
  });
  // ATM: rows with repeats so that pairs merge; decisions must be identical.
  Vec xr = x;
  for (int b = 0; b < B; ++b)
    for (int t = 1; t < Tn; t += 3)
      for (int j = 0; j < d; ++j) xr[(size_t(b) * Tn + t) * d + j] = xr[(size_t(b) * Tn + t - 1) * d + j] * 1.01f;
  auto atm = [&](Ops<float>& o) {
    OnBackend r(o);
    float* bx = r.in(xr);
    Buffer<float, double> rho(o, size_t(B) * (Tn - 1));
    Buffer<float, uint8_t> open(o, N);
    Buffer<float, int32_t> gf(o, N), ke(o, N), ng(o, B);
    o.atm_similarity(bx, B, Tn, d, rho.data());
    o.atm_plan(rho.data(), B, Tn, 0.9, open.data(), gf.data(), ke.data(), ng.data());
    float *mo = r.in(Vec(x.size())), *dx = r.in(Vec(x.size(), 0.f)), *bd = r.in(dout);
    o.atm_merge_rows(bx, B, Tn, d, gf.data(), ke.data(), ng.data(), mo);
    o.atm_merge_rows_bwd(bd, B, Tn, d, gf.data(), ke.data(), ng.data(), dx);
    std::vector<uint8_t> op(N);
    std::vector<double> rh(rho.size());
    o.download(op.data(), open.data(), N);
    o.download(rh.data(), rho.data(), rh.size() * 8);
    Vec opf(op.begin(), op.end()), rhf(rh.begin(), rh.end());
    return std::vector<Vec>{opf, rhf, r.out(mo, x.size()), r.out(dx, x.size())};
  };
  same_on_gpu("atm", 1e-6, atm);
}

// Self-attention with GQA, plain causal and with ATM keys (merged rows,
// self_open raw keys), forward and backward.
TEST(CudaOps, AttentionPlainAndAtm) {
  REQUIRE_GPU();
  for (int dh : {16, 64, 128}) {
    AttnShape s;
    s.B = 2; s.Tq = s.Tk = 45; s.H = 4; s.Hkv = 2; s.dh = dh;
    const size_t nq = size_t(s.B) * s.Tq * s.H * dh, nk = size_t(s.B) * s.Tk * s.Hkv * dh;
    const Vec q = randn(nq, 20), k = randn(nk, 21), v = randn(nk, 22), dout = randn(nq, 23);
    // A merge plan: pairs (t, t+1) for t % 5 == 1.
    std::vector<uint8_t> open(size_t(s.B) * s.Tq, 0);
    for (int b = 0; b < s.B; ++b)
      for (int t = 1; t + 1 < s.Tq; t += 5) open[size_t(b) * s.Tq + t] = 1;
    const AtmLayout lay = atm_layout(open, s.B, s.Tq);
    for (bool with_atm : {false, true}) {
      const std::string name = "attention dh=" + std::to_string(dh) + (with_atm ? " ATM" : "");
      same_on_gpu(name.c_str(), 3e-5, [&](Ops<float>& o) {
        OnBackend r(o);
        float *bq = r.in(q), *bk = r.in(k), *bv = r.in(v), *bd = r.in(dout);
        float *out = r.in(Vec(nq)), *lse = r.in(Vec(size_t(s.B) * s.H * s.Tq));
        float *dq = r.in(Vec(nq)), *dk = r.in(Vec(nk)), *dv = r.in(Vec(nk)), *drk = r.in(Vec(nk)), *drv = r.in(Vec(nk));
        Buffer<float, int32_t> ke(o, lay.key_end.size()), ng(o, lay.n_groups.size());
        Buffer<float, uint8_t> so(o, open.size());
        o.upload(ke.data(), lay.key_end.data(), ke.bytes());
        o.upload(ng.data(), lay.n_groups.data(), ng.bytes());
        o.upload(so.data(), open.data(), so.bytes());
        const AttnKeys keys = with_atm ? AttnKeys{ke.data(), ng.data(), so.data()} : AttnKeys{};
        // With ATM the keys are the merged rows; the raw ones are k and v.
        float *mk = bk, *mv = bv;
        if (with_atm) {
          Buffer<float, int32_t> gf(o, lay.group_first.size());
          o.upload(gf.data(), lay.group_first.data(), gf.bytes());
          mk = r.in(Vec(nk));
          mv = r.in(Vec(nk));
          o.atm_merge_rows(bk, s.B, s.Tq, s.Hkv * dh, gf.data(), ke.data(), ng.data(), mk);
          o.atm_merge_rows(bv, s.B, s.Tq, s.Hkv * dh, gf.data(), ke.data(), ng.data(), mv);
        }
        o.attention_fwd(s, keys, bq, mk, mv, with_atm ? bk : nullptr, with_atm ? bv : nullptr, out, lse);
        o.attention_bwd(s, keys, bq, mk, mv, with_atm ? bk : nullptr, with_atm ? bv : nullptr, out, lse, bd, dq,
                        dk, dv, with_atm ? drk : nullptr, with_atm ? drv : nullptr);
        std::vector<Vec> res{r.out(out, nq), r.out(lse, size_t(s.B) * s.H * s.Tq), r.out(dq, nq), r.out(dk, nk),
                             r.out(dv, nk)};
        if (with_atm) {
          res.push_back(r.out(drk, nk));
          res.push_back(r.out(drv, nk));
        }
        return res;
      });
    }
  }
}

// Rounds h through the bf16 buffer dst on the GPU; returns the rounded values.
Vec bf16_round_trip(Ops<float>& gpu, const Vec& h, DynBuffer<float>& dst) {
  Buffer<float> f(gpu, h.size());
  gpu.upload(f.data(), h.data(), f.bytes());
  gpu.convert(f.data(), dst.data(), h.size());
  gpu.convert(dst.data(), f.data(), h.size());
  Vec r(h.size());
  gpu.download(r.data(), f.data(), f.bytes());
  return r;
}
// n values of the bf16 buffer src as floats.
Vec bf16_download(Ops<float>& gpu, CPtr src, size_t n) {
  Buffer<float> f(gpu, n);
  gpu.convert(src, f.data(), n);
  Vec r(n);
  gpu.download(r.data(), f.data(), f.bytes());
  return r;
}

// The device side of one bf16 attention call in the tests below: the ATM
// layout uploaded, the merged keys and values (with_atm), the outputs and
// gradients, and the key and raw-key pointers the op takes.
struct GpuAttnCall {
  Buffer<float, int32_t> ke, ng, gf;
  Buffer<float, uint8_t> so;
  DynBuffer<float> mk, mv, go, gdq, gdk, gdv, gdrk, gdrv;
  Buffer<float> glse;
  CPtr keys_k, keys_v, raw_k, raw_v;
  Ptr draw_k, draw_v;
  AttnKeys keys{};
  GpuAttnCall(Ops<float>& gpu, const AttnShape& s, const AtmLayout& lay, const std::vector<uint8_t>& open, CPtr k,
              CPtr v, bool with_atm)
      : ke(gpu, lay.key_end.size()), ng(gpu, lay.n_groups.size()), gf(gpu, lay.group_first.size()),
        so(gpu, open.size()), mk(gpu, DType::BF16, nk(s)), mv(gpu, DType::BF16, nk(s)),
        go(gpu, DType::BF16, nq(s)), gdq(gpu, DType::BF16, nq(s)), gdk(gpu, DType::BF16, nk(s)),
        gdv(gpu, DType::BF16, nk(s)), gdrk(gpu, DType::BF16, nk(s)), gdrv(gpu, DType::BF16, nk(s)),
        glse(gpu, size_t(s.B) * s.H * s.Tq), keys_k(k), keys_v(v) {
    gpu.upload(ke.data(), lay.key_end.data(), ke.bytes());
    gpu.upload(ng.data(), lay.n_groups.data(), ng.bytes());
    gpu.upload(gf.data(), lay.group_first.data(), gf.bytes());
    gpu.upload(so.data(), open.data(), so.bytes());
    if (with_atm) {
      gpu.atm_merge_rows(k, s.B, s.Tq, s.Hkv * s.dh, gf.data(), ke.data(), ng.data(), mk.data());
      gpu.atm_merge_rows(v, s.B, s.Tq, s.Hkv * s.dh, gf.data(), ke.data(), ng.data(), mv.data());
      keys_k = mk.data(); keys_v = mv.data(); raw_k = k; raw_v = v;
      draw_k = gdrk.data(); draw_v = gdrv.data();
      keys = AttnKeys{ke.data(), ng.data(), so.data()};
    }
  }
  static size_t nq(const AttnShape& s) { return size_t(s.B) * s.Tq * s.H * s.dh; }
  static size_t nk(const AttnShape& s) { return size_t(s.B) * s.Tk * s.Hkv * s.dh; }
};

// The same ATM layout on the CPU backend, for the reference call: `keys` is
// empty unless with_atm.
struct CpuAttnKeys {
  Buffer<float, int32_t> ke, ng;
  Buffer<float, uint8_t> so;
  AttnKeys keys{};
  CpuAttnKeys(Ops<float>& cpu, const AtmLayout& lay, const std::vector<uint8_t>& open, bool with_atm)
      : ke(cpu, lay.key_end.size()), ng(cpu, lay.n_groups.size()), so(cpu, open.size()) {
    cpu.upload(ke.data(), lay.key_end.data(), ke.bytes());
    cpu.upload(ng.data(), lay.n_groups.data(), ng.bytes());
    cpu.upload(so.data(), open.data(), so.bytes());
    if (with_atm) keys = AttnKeys{ke.data(), ng.data(), so.data()};
  }
};

// The bf16 attention on tensor cores (kernels/cuda/attention_tc.cu), forward
// and backward, against the CPU on exactly the GPU's bf16 inputs: plain causal
// and ATM keys with self-open raw keys, two full 64-row tiles and a partial
// one, every head dim it takes; then the same calls with the backend option
// attention_bwd = v2 (the second form of the tensor-core backward), then with
// attention = rows (the row kernels). Tolerances (max abs diff / max
// abs of the CPU result): P and dS enter the products as bf16 and every
// output is stored in bf16.
TEST(CudaOps, AttentionTensorCoresBf16) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  auto cpu = make_backend<float>("cpu");
  auto to_bf16 = [&](const Vec& h, DynBuffer<float>& dst) { return bf16_round_trip(*gpu, h, dst); };
  auto from_bf16 = [&](CPtr src, size_t n) { return bf16_download(*gpu, src, n); };
  for (int dh : {32, 64, 96, 128}) {
    AttnShape s;
    s.B = 2; s.Tq = s.Tk = 150; s.H = 4; s.Hkv = 2; s.dh = dh;
    const size_t nq = size_t(s.B) * s.Tq * s.H * dh, nk = size_t(s.B) * s.Tk * s.Hkv * dh;
    const size_t nl = size_t(s.B) * s.H * s.Tq;
    DynBuffer<float> gq(*gpu, DType::BF16, nq), gk(*gpu, DType::BF16, nk), gv(*gpu, DType::BF16, nk),
        gdo(*gpu, DType::BF16, nq);
    const Vec q = to_bf16(randn(nq, 40), gq), k = to_bf16(randn(nk, 41), gk), v = to_bf16(randn(nk, 42), gv),
              dout = to_bf16(randn(nq, 43), gdo);
    std::vector<uint8_t> open(size_t(s.B) * s.Tq, 0);
    for (int b = 0; b < s.B; ++b)
      for (int t = 1 + b; t + 1 < s.Tq; t += 5) open[size_t(b) * s.Tq + t] = 1;
    const AtmLayout lay = atm_layout(open, s.B, s.Tq);
    for (bool with_atm : {false, true}) {
      // The GPU: merged rows (ATM) in bf16, then forward and backward.
      GpuAttnCall c(*gpu, s, lay, open, gk.data(), gv.data(), with_atm);
      auto run_gpu = [&] {
        gpu->attention_fwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data());
        gpu->attention_bwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data(),
                           gdo.data(), c.gdq.data(), c.gdk.data(), c.gdv.data(), c.draw_k, c.draw_v);
        Vec l(nl);
        gpu->download(l.data(), c.glse.data(), c.glse.bytes());
        std::vector<Vec> out{from_bf16(c.go.data(), nq), l, from_bf16(c.gdq.data(), nq), from_bf16(c.gdk.data(), nk),
                             from_bf16(c.gdv.data(), nk)};
        if (with_atm) {
          out.push_back(from_bf16(c.gdrk.data(), nk));
          out.push_back(from_bf16(c.gdrv.data(), nk));
        }
        return out;
      };
      const auto tc = run_gpu();
      set_cuda_backend_options(*gpu, {.attention_bwd = "v2"});
      const auto tc2 = run_gpu();
      set_cuda_backend_options(*gpu, {.attention = "rows"});
      const auto rows = run_gpu();
      set_cuda_backend_options(*gpu, {});

      // The CPU on the same (bf16-valued) inputs.
      const Vec mkh = with_atm ? from_bf16(c.mk.data(), nk) : k, mvh = with_atm ? from_bf16(c.mv.data(), nk) : v;
      OnBackend r(*cpu);
      float *cq = r.in(q), *ck = r.in(mkh), *cv = r.in(mvh), *crk = r.in(k), *crv = r.in(v), *cdo = r.in(dout);
      float *co = r.in(Vec(nq)), *clse = r.in(Vec(nl)), *cdq = r.in(Vec(nq)), *cdk = r.in(Vec(nk)),
            *cdv = r.in(Vec(nk)), *cdrk = r.in(Vec(nk)), *cdrv = r.in(Vec(nk));
      const CpuAttnKeys cpu_keys(*cpu, lay, open, with_atm);
      const AttnKeys ckeys = cpu_keys.keys;
      cpu->attention_fwd(s, ckeys, cq, ck, cv, with_atm ? crk : nullptr, with_atm ? crv : nullptr, co, clse);
      cpu->attention_bwd(s, ckeys, cq, ck, cv, with_atm ? crk : nullptr, with_atm ? crv : nullptr, co, clse, cdo, cdq,
                         cdk, cdv, with_atm ? cdrk : nullptr, with_atm ? cdrv : nullptr);
      std::vector<Vec> ref{r.out(co, nq), r.out(clse, nl), r.out(cdq, nq), r.out(cdk, nk), r.out(cdv, nk)};
      if (with_atm) {
        ref.push_back(r.out(cdrk, nk));
        ref.push_back(r.out(cdrv, nk));
      }

      const char* names[] = {"o", "lse", "dq", "dk", "dv", "draw_k", "draw_v"};
      const double tols[] = {2e-2, 1e-3, 3e-2, 3e-2, 3e-2, 3e-2, 3e-2};
      const std::string name = "dh=" + std::to_string(dh) + (with_atm ? " ATM" : "");
      for (const auto& [kernel, got] :
           {std::pair{"tensor cores", tc}, std::pair{"tc bwd v2", tc2}, std::pair{"rows", rows}}) {
        ASSERT_EQ(got.size(), ref.size());
        for (size_t t = 0; t < ref.size(); ++t) {
          const double e = rel(ref[t], got[t]);
          std::printf("  attention bf16 %-10s %-12s %-7s max rel %.2e (tol %.0e)\n", name.c_str(), kernel, names[t], e,
                      tols[t]);
          EXPECT_LT(e, tols[t]) << name << " " << kernel << " " << names[t];
        }
      }
    }
  }
}

// The FlashAttention-2 form of the bf16 forward (kernels/cuda/attention_fa2.cu,
// backend option attention = fa2) beside the tensor-core forward, against the CPU on
// exactly the GPU's bf16 inputs, at every head dim it takes, with 4 query heads
// on 2 KV groups: T = 67 (a full 64-row tile and a partial one) and T = 200
// (four key tiles: the running max moves from tile to tile and O is rescaled),
// plain causal and ATM keys with self-open raw keys, each followed by the
// tensor-core backward on fa2's o and lse; and a decoding shape (67 queries
// from position 133 over 200 keys, forward only: the tensor-core backward
// takes q_pos0 = 0). The cases with a backward run again with
// attention_bwd = fa2 (attention_fa2.cu's backward), twice, the two
// runs bit-identical. Every case runs the forward again at each other tile
// shape (attention_tile 64x128, 128x64, 128x128), each against the CPU; 128
// query rows a block give the bits of 64 at the same key tile (a warp's 16
// rows see the same key tiles; the extra ones are wholly masked for them:
// p = 0, alpha = 1). The cases with a backward also run the fa2 backward at
// each other tile shape (attention_bwd_tile 64x128, 128x64, 128x128: 128 key
// rows a dK/dV block, 128 query rows a dQ block), each against the CPU and
// bit for bit the default's gradients (a warp's 16 rows meet the same tiles
// as in a 64-row block, the extra ones wholly invisible to them: P = 0); on
// the emulator one of the three a case, in turn. Bounds those of
// AttentionTensorCoresBf16.
TEST(CudaOps, AttentionFa2Bf16) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  auto cpu = make_backend<float>("cpu");
  struct Case {
    int Tq, Tk, q_pos0;
  };
  int bwd_case = 0;  // the cases with a backward so far
  for (int dh : {32, 64, 96, 128})
    for (const Case shape : {Case{67, 67, 0}, Case{200, 200, 0}, Case{67, 200, 133}}) {
#ifdef WIOLA_CUDA_EMU
      // On the emulator (three runs in CI: emu, rev, asan) the four-tile and
      // decoding shapes at d_h = 64 only; every head dim still runs T = 67
      // (two tiles, odd T). The GPU runs them all.
      if (dh != 64 && (shape.Tq != shape.Tk || shape.Tq == 200)) continue;
#endif
      AttnShape s;
      s.B = 2; s.Tq = shape.Tq; s.Tk = shape.Tk; s.q_pos0 = shape.q_pos0; s.H = 4; s.Hkv = 2; s.dh = dh;
      const bool decoding = shape.q_pos0 != 0;
      const size_t nq = size_t(s.B) * s.Tq * s.H * dh, nk = size_t(s.B) * s.Tk * s.Hkv * dh;
      const size_t nl = size_t(s.B) * s.H * s.Tq;
      DynBuffer<float> gq(*gpu, DType::BF16, nq), gk(*gpu, DType::BF16, nk), gv(*gpu, DType::BF16, nk),
          gdo(*gpu, DType::BF16, nq);
      const Vec q = bf16_round_trip(*gpu, randn(nq, 50), gq), k = bf16_round_trip(*gpu, randn(nk, 51), gk),
                v = bf16_round_trip(*gpu, randn(nk, 52), gv), dout = bf16_round_trip(*gpu, randn(nq, 53), gdo);
      std::vector<uint8_t> open(size_t(s.B) * s.Tq, 0);
      for (int b = 0; b < s.B; ++b)
        for (int t = 1 + b; t + 1 < s.Tq; t += 4) open[size_t(b) * s.Tq + t] = 1;
      const AtmLayout lay = atm_layout(open, s.B, s.Tq);
      for (int with_atm = 0; with_atm < (decoding ? 1 : 2); ++with_atm) {
        GpuAttnCall c(*gpu, s, lay, open, gk.data(), gv.data(), with_atm);
        // o and lse, then (bwd) the tensor-core backward's gradients from them.
        // fwd = false: the backward alone, on the o and lse already there.
        auto run_gpu = [&](bool bwd, bool fwd = true) {
          if (fwd)
            gpu->attention_fwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(),
                               c.glse.data());
          Vec l(nl);
          gpu->download(l.data(), c.glse.data(), c.glse.bytes());
          std::vector<Vec> out{bf16_download(*gpu, c.go.data(), nq), l};
          if (!bwd) return out;
          gpu->attention_bwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data(),
                             gdo.data(), c.gdq.data(), c.gdk.data(), c.gdv.data(), c.draw_k, c.draw_v);
          out.push_back(bf16_download(*gpu, c.gdq.data(), nq));
          out.push_back(bf16_download(*gpu, c.gdk.data(), nk));
          out.push_back(bf16_download(*gpu, c.gdv.data(), nk));
          if (with_atm) {
            out.push_back(bf16_download(*gpu, c.gdrk.data(), nk));
            out.push_back(bf16_download(*gpu, c.gdrv.data(), nk));
          }
          return out;
        };
        set_cuda_backend_options(*gpu, {.attention = "fa2"});
        const auto fa2 = run_gpu(!decoding);
        // The forward at the other tile shapes: 64x128, 128x64, 128x128.
        const char* const tile_names[] = {"64x128", "128x64", "128x128"};
        std::vector<Vec> tiles[3];
        for (int t = 0; t < 3; ++t) {
          set_cuda_backend_options(*gpu, {.attention = "fa2", .attention_tile = tile_names[t]});
          tiles[t] = run_gpu(false);
        }
        // The fa2 backward (attention_bwd = fa2) on the same o and lse,
        // twice: the two runs must agree bit for bit.
        std::vector<Vec> fa2b, fa2b_again;
        if (!decoding) {
          set_cuda_backend_options(*gpu, {.attention = "fa2", .attention_bwd = "fa2"});
          fa2b = run_gpu(true);
          fa2b_again = run_gpu(true);
        }
        // The fa2 backward at the other tile shapes (attention_bwd_tile), on
        // the same o and lse (the backward alone: o and lse are fa2b's).
        const char* const bwd_tile_names[] = {"64x128", "128x64", "128x128"};
        std::vector<Vec> bwd_tiles[3];
        if (!decoding)
          for (int t = 0; t < 3; ++t) {
#ifdef WIOLA_CUDA_EMU
            // One shape a case in turn (the fa2 backward is the emulator's
            // slowest kernel): 64x128, 128x64, 128x128, 64x128, ... over the
            // ten cases, so each 128-row kernel (dK/dV of 128x64 and 128x128,
            // dQ of 64x128 and 128x128) runs at every head dim.
            if (t != bwd_case % 3) continue;
#endif
            set_cuda_backend_options(
                *gpu, {.attention = "fa2", .attention_bwd = "fa2", .attention_bwd_tile = bwd_tile_names[t]});
            bwd_tiles[t] = run_gpu(true, false);
          }
        if (!decoding) ++bwd_case;
        set_cuda_backend_options(*gpu, {});
        const auto tc = run_gpu(false);

        // The CPU on the same (bf16-valued) inputs.
        const Vec mkh = with_atm ? bf16_download(*gpu, c.mk.data(), nk) : k,
                  mvh = with_atm ? bf16_download(*gpu, c.mv.data(), nk) : v;
        OnBackend r(*cpu);
        float *cq = r.in(q), *ck = r.in(mkh), *cv = r.in(mvh), *crk = r.in(k), *crv = r.in(v), *cdo = r.in(dout);
        float *co = r.in(Vec(nq)), *clse = r.in(Vec(nl)), *cdq = r.in(Vec(nq)), *cdk = r.in(Vec(nk)),
              *cdv = r.in(Vec(nk)), *cdrk = r.in(Vec(nk)), *cdrv = r.in(Vec(nk));
        const CpuAttnKeys cpu_keys(*cpu, lay, open, with_atm);
        const AttnKeys ckeys = cpu_keys.keys;
        cpu->attention_fwd(s, ckeys, cq, ck, cv, with_atm ? crk : nullptr, with_atm ? crv : nullptr, co, clse);
        std::vector<Vec> ref{r.out(co, nq), r.out(clse, nl)};
        if (!decoding) {
          cpu->attention_bwd(s, ckeys, cq, ck, cv, with_atm ? crk : nullptr, with_atm ? crv : nullptr, co, clse, cdo,
                             cdq, cdk, cdv, with_atm ? cdrk : nullptr, with_atm ? cdrv : nullptr);
          for (auto [p, n] : {std::pair{cdq, nq}, std::pair{cdk, nk}, std::pair{cdv, nk}}) ref.push_back(r.out(p, n));
          if (with_atm) {
            ref.push_back(r.out(cdrk, nk));
            ref.push_back(r.out(cdrv, nk));
          }
        }

        const char* names[] = {"o", "lse", "dq", "dk", "dv", "draw_k", "draw_v"};
        const double tols[] = {2e-2, 1e-3, 3e-2, 3e-2, 3e-2, 3e-2, 3e-2};
        std::string name = "dh=" + std::to_string(dh) + " T=" + std::to_string(s.Tq);
        if (decoding) name += " from " + std::to_string(s.q_pos0);
        if (with_atm) name += " ATM";
        // (name, outputs, forward only: o and lse)
        std::vector<std::tuple<std::string, const std::vector<Vec>*, bool>> runs{{"fa2", &fa2, decoding},
                                                                                {"tc", &tc, true}};
        if (!decoding) runs.emplace_back("fa2 bwd", &fa2b, false);
        if (!decoding)
          for (int t = 0; t < 3; ++t)
            if (!bwd_tiles[t].empty())
              runs.emplace_back(std::string("fa2 bwd ") + bwd_tile_names[t], &bwd_tiles[t], false);
        for (int t = 0; t < 3; ++t) runs.emplace_back(std::string("fa2 ") + tile_names[t], &tiles[t], true);
        for (const auto& [kernel, got, fwd_only] : runs) {
          ASSERT_LE(got->size(), ref.size());
          ASSERT_EQ(got->size(), fwd_only ? size_t(2) : ref.size());
          // (The backward tile shapes ran the backward alone: judged on the gradients.)
          for (size_t t = kernel.rfind("fa2 bwd ", 0) == 0 ? 2 : 0; t < got->size(); ++t) {
            const double e = rel(ref[t], (*got)[t]);
            std::printf("  attention bf16 %-20s %-15s %-7s max rel %.2e (tol %.0e)\n", name.c_str(), kernel.c_str(),
                        names[t], e, tols[t]);
            EXPECT_LT(e, tols[t]) << name << " " << kernel << " " << names[t];
          }
        }
        if (!decoding) {
          // Deterministic: the second run gave the same bits.
          ASSERT_EQ(fa2b_again.size(), fa2b.size());
          for (size_t t = 0; t < fa2b.size(); ++t)
            EXPECT_EQ(0, std::memcmp(fa2b[t].data(), fa2b_again[t].data(), fa2b[t].size() * sizeof(float)))
                << name << " fa2 bwd " << names[t] << ": two runs differ";
          // The fa2 backward ran (the tensor-core backward sums in another
          // order and rounds P and dS elsewhere: some gradient bits differ).
          bool differs = false;
          for (size_t t = 2; t < fa2b.size(); ++t) differs = differs || fa2b[t] != fa2[t];
          EXPECT_TRUE(differs) << name << ": attention_bwd = fa2 gave the tc backward's gradients";
          // Every backward tile shape: the default's bits (so it ran fa2's
          // kernels, not a fallback to the tensor-core backward).
          int bwd_tiles_run = 0;
          for (int t = 0; t < 3; ++t) {
            if (bwd_tiles[t].empty()) continue;  // (on the emulator, another case's)
            ++bwd_tiles_run;
            ASSERT_EQ(bwd_tiles[t].size(), fa2b.size());
            for (size_t u = 0; u < fa2b.size(); ++u)
              EXPECT_EQ(0, std::memcmp(bwd_tiles[t][u].data(), fa2b[u].data(), fa2b[u].size() * sizeof(float)))
                  << name << " fa2 bwd " << bwd_tile_names[t] << " " << names[u] << ": differs from 64x64";
          }
#ifdef WIOLA_CUDA_EMU
          EXPECT_EQ(bwd_tiles_run, 1) << name;
#else
          EXPECT_EQ(bwd_tiles_run, 3) << name;
#endif
        }
        // The fa2 kernel ran (a fallback to the tensor-core kernel would give
        // its outputs bit for bit: fa2 sums in another order, in base 2).
        EXPECT_NE(fa2[1], tc[1]) << name << ": attention = fa2 gave the tc kernel's lse";
        for (int t = 0; t < 3; ++t)
          EXPECT_NE(tiles[t][1], tc[1]) << name << " " << tile_names[t] << ": gave the tc kernel's lse";
        // 128-key tiles ran: at T = 200 the running max moves between 64-key
        // tiles that one 128-key tile takes at once (one rescale fewer: other
        // bits). (At T = 67 the sums run in the same order: the same bits.)
        if (shape.Tq == 200) {
          EXPECT_NE(tiles[0][1], fa2[1]) << name << ": attention_tile = 64x128 gave 64x64's lse";
        }
        // 128 query rows a block: the bits of 64 at the same key tile (o, lse).
        using Outs = const std::vector<Vec>*;
        for (auto [t128, t64] : {std::pair<Outs, Outs>{&tiles[1], &fa2}, std::pair<Outs, Outs>{&tiles[2], &tiles[0]}})
          for (size_t t = 0; t < 2; ++t)
            EXPECT_EQ(0, std::memcmp((*t128)[t].data(), (*t64)[t].data(), (*t64)[t].size() * sizeof(float)))
                << name << " " << names[t] << ": 128 query rows a block differ from 64";
      }
    }
#ifdef WIOLA_CUDA_EMU
  EXPECT_EQ(bwd_case, 10);  // T = 67 at every head dim, T = 200 at d_h 64; causal and ATM
#else
  EXPECT_EQ(bwd_case, 16);  // T = 67 and 200 at every head dim; causal and ATM
#endif
}

// Head packing in the fa2 forward (backend option attention_heads_per_block
// 2 or 4: query heads of one KV group a block, sharing each K/V tile, the
// tile's query rows split among them) against the CPU on exactly the GPU's
// bf16 inputs, at every head dim it takes, with GQA ratio 4 (8 query heads on
// 2 KV groups: heads g, g + 2, g + 4, g + 6 of group g) and 2 (4 on 2), T = 67
// (odd: partial blocks at 16, 32 and 64 rows a head), plain causal and with
// ATM merges (self-open raw keys), at every tile shape: o and lse within
// AttentionTensorCoresBf16's bounds and bit for bit the unpacked forward's at
// the same key tile (a warp's rows meet the same key tiles or fewer, the
// others wholly masked for it). Since those bits cannot tell a packed launch
// from an unpacked one, on the emulator each packed forward's launch is read
// back (tools/cuda_emu/launch_record.h): H / HP blocks of heads, rows / HP a
// block of each. A packing that does not divide H / H_kv is refused, naming
// the key. On the emulator (three runs in CI) one tile shape a case, in turn.
TEST(CudaOps, AttentionFa2HeadPacking) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  auto cpu = make_backend<float>("cpu");
  struct Heads {
    int H, Hkv;
  };
  const char* const tile_names[] = {"64x64", "64x128", "128x64", "128x128"};
  int n_case = 0, packed_runs = 0;
  for (int dh : {32, 64, 96, 128})
    for (const Heads hk : {Heads{8, 2}, Heads{4, 2}}) {
      AttnShape s;
      s.B = 1; s.Tq = s.Tk = 67; s.q_pos0 = 0; s.H = hk.H; s.Hkv = hk.Hkv; s.dh = dh;
      const size_t nq = size_t(s.B) * s.Tq * s.H * dh, nk = size_t(s.B) * s.Tk * s.Hkv * dh;
      const size_t nl = size_t(s.B) * s.H * s.Tq;
      DynBuffer<float> gq(*gpu, DType::BF16, nq), gk(*gpu, DType::BF16, nk), gv(*gpu, DType::BF16, nk);
      const Vec q = bf16_round_trip(*gpu, randn(nq, 60 + dh), gq), k = bf16_round_trip(*gpu, randn(nk, 61 + dh), gk),
                v = bf16_round_trip(*gpu, randn(nk, 62 + dh), gv);
      std::vector<uint8_t> open(size_t(s.B) * s.Tq, 0);
      for (int t = 2; t + 1 < s.Tq; t += 3) open[size_t(t)] = 1;
      const AtmLayout lay = atm_layout(open, s.B, s.Tq);
      for (int with_atm = 0; with_atm < 2; ++with_atm, ++n_case) {
        GpuAttnCall c(*gpu, s, lay, open, gk.data(), gv.data(), with_atm);
        auto run_gpu = [&](const char* tile, const char* hp) {
          set_cuda_backend_options(*gpu, {.attention = "fa2", .attention_tile = tile, .attention_heads_per_block = hp});
          gpu->attention_fwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data());
          Vec l(nl);
          gpu->download(l.data(), c.glse.data(), c.glse.bytes());
          return std::vector<Vec>{bf16_download(*gpu, c.go.data(), nq), l};
        };
        // The unpacked forward at each key tile (64, 128 keys).
        const std::vector<Vec> unpacked[2] = {run_gpu("64x64", "1"), run_gpu("64x128", "1")};

        // The CPU on the same (bf16-valued) inputs.
        const Vec mkh = with_atm ? bf16_download(*gpu, c.mk.data(), nk) : k,
                  mvh = with_atm ? bf16_download(*gpu, c.mv.data(), nk) : v;
        OnBackend r(*cpu);
        float *cq = r.in(q), *ck = r.in(mkh), *cv = r.in(mvh), *crk = r.in(k), *crv = r.in(v);
        float *co = r.in(Vec(nq)), *clse = r.in(Vec(nl));
        const CpuAttnKeys cpu_keys(*cpu, lay, open, with_atm);
        const AttnKeys ckeys = cpu_keys.keys;
        cpu->attention_fwd(s, ckeys, cq, ck, cv, with_atm ? crk : nullptr, with_atm ? crv : nullptr, co, clse);
        const std::vector<Vec> ref{r.out(co, nq), r.out(clse, nl)};

        const char* names[] = {"o", "lse"};
        const double tols[] = {2e-2, 1e-3};
        const std::string name = "dh=" + std::to_string(dh) + " H=" + std::to_string(s.H) + "/" +
                                 std::to_string(s.Hkv) + (with_atm ? " ATM" : "");
        for (int t = 0; t < 4; ++t) {
#ifdef WIOLA_CUDA_EMU
          // One tile shape a case, in turn: each with HP 2 at every head dim, with HP 4 at two.
          if (t != (n_case + dh / 32 - 1) % 4) continue;
#endif
          for (int hp : {2, 4}) {
            if (s.H / s.Hkv % hp != 0) continue;
#ifdef WIOLA_CUDA_EMU
            wiola_emu::record_launches(true);
#endif
            const auto got = run_gpu(tile_names[t], hp == 2 ? "2" : "4");
            const std::string kernel = std::string("fa2 ") + tile_names[t] + " hp" + std::to_string(hp);
            ++packed_runs;
#ifdef WIOLA_CUDA_EMU
            std::vector<wiola_emu::LaunchShape> launches;  // the fa2 forward's
            for (auto& l : wiola_emu::recorded_launches())
              if (l.name.rfind("k_attn_fwd_fa2<", 0) == 0) launches.push_back(l);
            wiola_emu::record_launches(false);
            // One launch, the packed grid: rows / HP of each of HP heads a block.
            const int rows = (t < 2 ? 64 : 128) / hp;
            ASSERT_EQ(launches.size(), size_t(1)) << name << " " << kernel;
            EXPECT_EQ(launches[0].grid[0], unsigned((s.Tq + rows - 1) / rows)) << name << " " << kernel;
            EXPECT_EQ(launches[0].grid[1], unsigned(s.H / hp)) << name << " " << kernel;
            EXPECT_EQ(launches[0].block[0], unsigned(2 * rows * hp)) << name << " " << kernel;
#endif
            for (size_t u = 0; u < 2; ++u) {
              const double e = rel(ref[u], got[u]);
              std::printf("  attention bf16 %-18s %-17s %-3s max rel %.2e (tol %.0e)\n", name.c_str(), kernel.c_str(),
                          names[u], e, tols[u]);
              EXPECT_LT(e, tols[u]) << name << " " << kernel << " " << names[u];
              // The unpacked forward's bits at the same key tile.
              const Vec& same = unpacked[t % 2][u];
              EXPECT_EQ(0, std::memcmp(got[u].data(), same.data(), same.size() * sizeof(float)))
                  << name << " " << kernel << " " << names[u] << ": differs from the unpacked forward";
            }
          }
        }
      }
      // A packing that does not divide the heads of a KV group is refused.
      if (s.H / s.Hkv == 2) {
        GpuAttnCall c(*gpu, s, lay, open, gk.data(), gv.data(), false);
        set_cuda_backend_options(*gpu, {.attention = "fa2", .attention_heads_per_block = "4"});
        try {
          gpu->attention_fwd(s, c.keys, gq.data(), c.keys_k, c.keys_v, c.raw_k, c.raw_v, c.go.data(), c.glse.data());
          ADD_FAILURE() << "attention_heads_per_block = 4 with H / H_kv = 2 was not refused";
        } catch (const wiola::Error& e) {
          EXPECT_NE(std::string(e.what()).find("train.cuda_attention_heads_per_block"), std::string::npos) << e.what();
        }
      }
      set_cuda_backend_options(*gpu, {});
    }
#ifdef WIOLA_CUDA_EMU
  EXPECT_EQ(packed_runs, 24);  // 16 cases, one tile each: HP 2 and 4 at ratio 4, HP 2 at ratio 2
#else
  EXPECT_EQ(packed_runs, 96);  // 16 cases, every tile: HP 2 and 4 at ratio 4, HP 2 at ratio 2
#endif
}

TEST(CudaOps, GemmAndConvert) {
  REQUIRE_GPU();
  const int m = 70, n = 45, k = 33;
  const Vec a = randn(size_t(m) * k, 30), b = randn(size_t(n) * k, 31), c0 = randn(size_t(m) * n, 32);
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      same_on_gpu("gemm", 2e-6, [&](Ops<float>& o) {
        OnBackend r(o);
        const int lda = ta == Trans::N ? k : m, ldb = tb == Trans::N ? n : k;
        float *A = r.in(a), *B = r.in(b), *C = r.in(c0);
        o.gemm(ta, tb, m, n, k, 0.7f, A, lda, B, ldb, 0.3f, C, n);
        return std::vector<Vec>{r.out(C, c0.size())};
      });
  // A column block between row lengths (the fused projection's split and join): exact.
  same_on_gpu("copy_block", 1e-30, [&](Ops<float>& o) {
    OnBackend r(o);
    float *A = r.in(a), *C = r.in(c0);
    o.copy_block(Ptr(C) + 3, n, CPtr(A) + 2, k, m, 20);
    return std::vector<Vec>{r.out(C, c0.size())};
  });
  // fp32 -> bf16 -> fp32 rounds to 8 significant bits.
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  Buffer<float> src(*gpu, a.size()), back(*gpu, a.size());
  DynBuffer<float> half(*gpu, DType::BF16, a.size());
  gpu->upload(src.data(), a.data(), src.bytes());
  gpu->convert(src.data(), half.data(), a.size());
  gpu->convert(half.data(), back.data(), a.size());
  Vec h(a.size());
  gpu->download(h.data(), back.data(), back.bytes());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(h[i], a[i], std::abs(a[i]) * 0.0079 + 1e-30);
}

// The whole model step in fp32: loss, every gradient, parameters after
// AdamW, and ATM decisions, against the CPU step.
TEST(CudaModel, StepMatchesCpu) {
  REQUIRE_GPU();
  ModelConfig c = model_preset("wiola-tiny");
  c.tau = 0.5;  // merges in the ATM layers
  const int B = 2;
  std::mt19937_64 rg(3);
  std::vector<int32_t> tok(size_t(B) * (c.T + 1));
  for (auto& t : tok) t = int32_t(rg() % uint64_t(c.V));
  struct Out {
    double loss;
    Vec grads, after;
    std::vector<std::vector<uint8_t>> atm;
  };
  auto step = [&](Ops<float>& ops) {
    Model<float> m(ops, c, ModelShard{}, nullptr, ModelOptions{B, false, false});
    m.init(5);
    m.zero_grads();
    Out o;
    o.loss = m.train_micro_step(tok.data(), 1.0 / (B * c.T));
    o.grads.resize(m.n_params());
    ops.download(o.grads.data(), m.grads(), o.grads.size() * 4);
    for (int l = 0; l < c.L; ++l) o.atm.push_back(m.atm_open(l));
    dist::DistAdamW adam(ops, m.params(), m.grads(), m.n_params(), segments(m.layout()),
                         dist::AdamWConfig{}, nullptr, nullptr);
    adam.step(1e-3, 1);
    o.after.resize(m.n_params());
    ops.download(o.after.data(), m.params(), o.after.size() * 4);
    return o;
  };
  auto cpu = make_backend<float>("cpu");
  auto gpu = make_cuda_ops(CudaPrecision::FP32);
  const Out a = step(*cpu), b = step(*gpu);
  std::printf("  loss cpu %.8f gpu %.8f; grads max rel %.2e; params after AdamW max rel %.2e\n", a.loss, b.loss,
              rel(a.grads, b.grads), rel(a.after, b.after));
  EXPECT_LT(std::abs(a.loss - b.loss) / a.loss, 1e-5);
  EXPECT_LT(rel(a.grads, b.grads), 1e-4);
  EXPECT_LT(rel(a.after, b.after), 1e-4);
  EXPECT_EQ(a.atm, b.atm);
}

// CUDA Graphs (train.cuda_graphs = layers; docs/gpu.md): five steps of
// wiola-tiny (3 layers, T = 16) with each layer's forward and backward run
// op by op the first time, recorded the second and replayed after give the
// bits of the same steps launched op by op: the same kernels in the same
// order. The tokens change every step, and so do ATM's merges, which the
// recordings read from device memory. With an odd number of layers the
// backward's two residual-gradient buffers trade places every step, so its
// keys alternate (A, B, A, B, A): two recordings per layer, each replayed.
// In fp32, and in bf16 with recompute (the recomputed forward is a
// recording of its own, keyed like the backward).
TEST(CudaModel, GraphsMatchEagerBitForBit) {
  REQUIRE_GPU();
  ModelConfig c = model_preset("wiola-tiny");
  c.tau = 0.5;  // merges in the ATM layer (l = 1)
  c.T = 16;
  c.L = 3;
  const int B = 2, steps = 5;
  std::vector<std::vector<int32_t>> tok(steps, std::vector<int32_t>(size_t(B) * (c.T + 1)));
  std::mt19937_64 rg(17);
  for (auto& t : tok)
    for (size_t i = 0; i < t.size(); ++i)  // runs of repeats: ATM merges some neighbours
      t[i] = i > 0 && rg() % 4 == 0 ? t[i - 1] : int32_t(rg() % uint64_t(c.V));
  struct Run {
    std::vector<double> loss;
    std::vector<std::vector<std::vector<uint8_t>>> atm;  // [step][layer]
    Vec params;
    CudaGraphStats stats;
  };
  auto run = [&](CudaPrecision prec, bool recompute, const std::string& graphs) {
    auto gpu = make_cuda_ops(prec, 0, {.cuda_graphs = graphs});
    Run r;
    {
      ModelOptions mo;
      mo.micro_batch = B;
      mo.recompute = recompute;
      Model<float> m(*gpu, c, ModelShard{}, nullptr, mo);
      m.init(5);
      m.zero_grads();
      dist::AdamWConfig ac;
      ac.zero = false;
      ac.zero_grads = true;
      dist::DistAdamW adam(*gpu, m.params(), m.grads(), m.n_params(), segments(m.layout()), ac, nullptr, nullptr);
      if (m.weight_copy().raw()) adam.set_weight_copy(m.weight_copy());
      for (int s = 0; s < steps; ++s) {
        r.loss.push_back(m.train_micro_step(tok[size_t(s)].data(), 1.0 / (B * c.T)));
        r.atm.emplace_back();
        for (int l = 0; l < c.L; ++l) r.atm.back().push_back(m.atm_open(l));
        adam.step(1e-3, s + 1);
      }
      r.params.resize(m.n_params());
      gpu->download(r.params.data(), m.params(), r.params.size() * 4);
      r.stats = cuda_graph_stats(*gpu);
    }
    EXPECT_EQ(cuda_graph_stats(*gpu).recordings, 0) << "the model's recordings outlived it";
    return r;
  };
  for (const auto& [prec, recompute, name] :
       {std::tuple{CudaPrecision::FP32, false, "fp32"}, std::tuple{CudaPrecision::BF16, true, "bf16 recompute"}}) {
    const Run off = run(prec, recompute, "off"), on = run(prec, recompute, "layers");
    std::printf("  %s: %d steps, losses %.6f .. %.6f; graphs: %ld recorded (%ld nodes), %ld launches, pool %.2f MiB\n",
                name, steps, on.loss.front(), on.loss.back(), on.stats.captures, on.stats.nodes,
                on.stats.launches, double(on.stats.pool_bytes) / 1048576.0);
    EXPECT_EQ(off.stats.captures, 0) << name;
    // Forward: op by op in step 1, recorded in step 2, launched in steps
    // 2..5. Backward (and recompute), keys A B A B A: op by op in steps 1
    // and 2, recorded in steps 3 and 4, launched in steps 3..5.
    const long L = c.L, bwd_passes = recompute ? 2 : 1;
    EXPECT_EQ(on.stats.captures, L * (1 + 2 * bwd_passes)) << name;
    EXPECT_EQ(on.stats.launches, L * (4 + 3 * bwd_passes)) << name;
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(std::memcmp(&off.loss[size_t(s)], &on.loss[size_t(s)], sizeof(double)), 0)
          << name << " step " << s + 1 << ": loss " << off.loss[size_t(s)] << " vs " << on.loss[size_t(s)];
      EXPECT_EQ(off.atm[size_t(s)], on.atm[size_t(s)]) << name << " step " << s + 1;
    }
    ASSERT_EQ(off.params.size(), on.params.size());
    EXPECT_EQ(std::memcmp(off.params.data(), on.params.data(), off.params.size() * 4), 0)
        << name << ": parameters after " << steps << " steps differ, max rel " << rel(off.params, on.params);
    // The merges did change from step to step while recordings replayed.
    size_t merges = 0, changed = 0;
    for (int l = 0; l < c.L; ++l) {
      if (on.atm[0][size_t(l)].empty()) continue;
      for (int s = 0; s < steps; ++s)
        for (uint8_t o : on.atm[size_t(s)][size_t(l)]) merges += o != 0;
      for (int s = 2; s < steps; ++s) changed += on.atm[size_t(s)][size_t(l)] != on.atm[size_t(s) - 1][size_t(l)];
    }
    EXPECT_GT(merges, 0u) << name;
    EXPECT_GT(changed, 0u) << name << ": ATM decided the same in every step; the test would prove nothing";
  }
}

// A recorded segment that reads back to the host fails loudly, naming the
// capture, and leaves the backend usable.
TEST(CudaOps, GraphCaptureRefusesHostReads) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::FP32, 0, {.cuda_graphs = "layers"});
  Buffer<float> x(*gpu, 64);
  Vec host(64, 0.f);
  int sentinel = 0;
  auto body = [&] {
    gpu->zero(x.data(), 64 * sizeof(float));
    gpu->download(host.data(), x.data(), 64 * sizeof(float));
  };
  const GraphKey key{&sentinel, {1}};
  gpu->graph(key, body);  // first: op by op
  try {
    gpu->graph(key, body);  // second: recorded
    ADD_FAILURE() << "a download inside a recording was not refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("CUDA Graph capture (train.cuda_graphs = layers) failed"), std::string::npos) << m;
    EXPECT_NE(m.find("download"), std::string::npos) << m;
  }
  EXPECT_EQ(cuda_graph_stats(*gpu).captures, 0);
  Vec ones(64, 1.f);
  gpu->upload(x.data(), ones.data(), 64 * sizeof(float));
  gpu->download(host.data(), x.data(), 64 * sizeof(float));
  EXPECT_EQ(host, ones);
  gpu->forget_graphs(&sentinel);
}

// Cached decoding in chunks equals the full forward (fp32: < 1e-4).
TEST(CudaModel, CachedDecodingMatchesFullForward) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::FP32);
  const double d = checks::cached_decoding_diff(*gpu, model_preset("wiola-tiny"), nullptr);
  std::printf("  cached decoding: max |logit diff| %.2e\n", d);
  EXPECT_LT(d, 1e-4);
}

// ATM's merge decisions in bf16 against fp32 from the same parameters and
// tokens (docs/gpu.md: they may flip for neighbours near tau, so the rate is
// reported; the bound only catches a broken bf16 path).
TEST(CudaModel, Bf16AtmFlipRate) {
  REQUIRE_GPU();
  ModelConfig c = model_preset("wiola-tiny");
  c.d = 128; c.dA = 128; c.dB = 512; c.T = 96;
  c.tau = 0.5;  // merges in the ATM layers
  const int B = 4;
  std::mt19937_64 rg(11);
  std::vector<int32_t> tok(size_t(B) * (c.T + 1));
  for (auto& t : tok) t = int32_t(rg() % 64);
  const checks::Flips r =
      checks::count_flips(checks::atm_decisions([] { return make_cuda_ops(CudaPrecision::FP32); }, c, B, tok),
                          checks::atm_decisions([] { return make_cuda_ops(CudaPrecision::BF16); }, c, B, tok));
  std::printf("  ATM decisions bf16 vs fp32: %zu of %zu flipped (%.3f %%); fp32 opened %zu merges\n", r.flips,
              r.total, r.total ? 100.0 * double(r.flips) / double(r.total) : 0.0, r.merges);
  ASSERT_TRUE(r.same_shape);
  EXPECT_GT(r.total, 0u);
  EXPECT_GT(r.merges, 0u);  // tau = 0.5 merges something, or the comparison says nothing
  EXPECT_LT(double(r.flips), 0.1 * double(r.total));
}

// A short bf16 run tracks the fp32 one: same data, same init, 30 steps (6
// steps of 2 sequences under the CPU emulator, tests/cuda_emu, which runs
// every GPU thread on one core).
TEST(CudaModel, Bf16TrainingTracksFp32) {
  REQUIRE_GPU();
  ModelConfig c = model_preset("wiola-tiny");
  // Head dim 32 and T = 96: the bf16 run takes the tensor-core attention over
  // a full and a partial 64-row tile (the fp32 run, the row kernels).
  c.d = 128; c.dA = 128; c.dB = 512; c.T = 96;
#ifdef WIOLA_CUDA_EMU
  const int B = 2, steps = 6;
#else
  const int B = 4, steps = 30;
#endif
  std::mt19937_64 rg(9);
  std::vector<int32_t> tok(size_t(B) * (c.T + 1) * steps);
  for (auto& t : tok) t = int32_t(rg() % 64);  // a small vocabulary is learnable in 30 steps
  const auto f = checks::training_losses([] { return make_cuda_ops(CudaPrecision::FP32); }, c, B, steps, tok);
  const auto h = checks::training_losses([] { return make_cuda_ops(CudaPrecision::BF16); }, c, B, steps, tok);
  double worst = 0;
  for (int s = 0; s < steps; ++s) worst = std::max(worst, std::abs(f[s] - h[s]) / f[s]);
  std::printf("  loss fp32 %.4f -> %.4f, bf16 %.4f -> %.4f; worst step rel diff %.3f\n", f.front(), f.back(),
              h.front(), h.back(), worst);
  EXPECT_LT(f.back(), f.front());
  EXPECT_LT(h.back(), h.front());
  EXPECT_LT(worst, 0.05);
}

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
        o.prefix_mean_fwd(x, sB, sT, d, pm1, nullptr);
        o.prefix_mean_fwd(x, sB, sT, d, pm2, q2);
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
    for (const auto& [sB, sT, H, Hkv, dh, off] :
         {std::tuple{2, 37, 3, 1, 16, 0}, std::tuple{1, 33, 4, 2, 64, 0}, std::tuple{2, 9, 3, 1, 6, 0},
          std::tuple{1, 9, 2, 1, 16, 1}}) {
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
      o.srpe_split_fwd(proj, sB, sT, H, Hkv, dh, tab, two[0], two[1], two[2], two[3]);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(bytes(two[i], sizes[i]), bytes(one[i], sizes[i])) << "block " << i;
      const Ptr dj1 = at(act, Vec(nw + size_t(off), 1.5f)), dj2 = at(act, Vec(nw + size_t(off), -0.5f));
      o.srpe_split_bwd(g[0], g[1], g[2], g[3], sB, sT, H, Hkv, dh, tab, dj2);
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

// The flat elementwise kernels move 16 bytes per access (vec_map,
// kernels/cuda/common.cuh): a head element by element up to the first
// 16-byte boundary, whole packs, a tail element by element, and every
// element the scalar way where the operands' misalignments differ. Each op,
// in each storage mix it runs in, at sizes 1, 7, 8, 9 and 4097 with its
// operands at element offsets 0..7 of their buffers (exactly as long as
// needed, so that AddressSanitizer sees an access past the end):
// - bit for bit against the same op with its inputs one element further on
//   than its outputs (misalignments that differ: all scalar). Outputs start
//   as different bytes in the two runs, so an element that either run
//   leaves unwritten differs, and the bytes before the offset must keep them;
// - against the CPU backend ("cpu"; "cpu-bf16" where an operand is bf16)
//   within ElementwiseForwardBackward's bounds (absolute where outputs are
//   below 1), bf16 outputs within one bf16 rounding: an element read or
//   written in the wrong place, or left as it was, fails.
TEST(CudaOps, VectorisedElementwiseMatchesScalar) {
  REQUIRE_GPU();
  enum Role { In, Out, InOut };
  struct Operand {
    DType t;
    Role role;
    bool positive = false;  // |randn| (AdamW's second moment)
  };
  struct Case {
    std::string name;
    std::vector<Operand> ops;
    double tol;  // fp32 outputs against the CPU
    std::function<void(Ops<float>&, const std::vector<Ptr>&, size_t)> run;
  };
  const DType F = DType::F32, H = DType::BF16;
  std::vector<Case> cases;
  for (DType t : {F, H}) {
    const std::string s = t == F ? " f32" : " bf16";
    cases.push_back({"add" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.add(p[0], p[1], p[2], n); }});
    cases.push_back({"axpy" + s, {{t, In}, {t, InOut}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.axpy(0.75f, p[0], p[1], n); }});
    cases.push_back({"scale" + s, {{t, InOut}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.scale(p[0], -1.25f, n); }});
    cases.push_back({"accumulate" + s, {{DType::F64, In}, {t, InOut}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.accumulate(p[0].as<double>(), p[1], n);
                     }});
    cases.push_back({"swiglu_fwd" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.swiglu_fwd(p[0], p[1], n, p[2]); }});
    cases.push_back({"swiglu_bwd" + s, {{t, In}, {t, In}, {t, In}, {t, Out}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.swiglu_bwd(p[0], p[1], p[2], n, p[3], p[4]);
                     }});
    cases.push_back({"gelu_fwd" + s, {{t, In}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.gelu_fwd(p[0], n, p[1]); }});
    cases.push_back({"gelu_bwd" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.gelu_bwd(p[0], p[1], n, p[2]); }});
    cases.push_back({"sigmoid_gate_fwd" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.sigmoid_gate_fwd(p[0], p[1], n, p[2]);
                     }});
    cases.push_back({"sigmoid_gate_bwd" + s, {{t, In}, {t, In}, {t, In}, {t, Out}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.sigmoid_gate_bwd(p[0], p[1], p[2], n, p[3], p[4]);
                     }});
    // phi: one fp32 scalar (the kernel's beta), not a mapped operand.
    cases.push_back({"blend_fwd" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       Buffer<float> phi(o, 1);
                       const float v = -0.7f;
                       o.upload(phi.data(), &v, sizeof v);
                       o.blend_fwd(p[0], p[1], phi.data(), n, p[2]);
                     }});
    cases.push_back({"blend_gate_fwd" + s, {{t, In}, {t, In}, {t, In}, {t, Out}, {t, Out}}, 2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       Buffer<float> phi(o, 1);
                       const float v = -0.7f;
                       o.upload(phi.data(), &v, sizeof v);
                       o.blend_gate_fwd(p[0], p[1], phi.data(), p[2], n, p[3], p[4]);
                     }});
    // AdamW writing the weight copy (of type t) and zeroing the gradient.
    cases.push_back({"adamw+copy" + s, {{F, InOut}, {F, InOut}, {F, InOut}, {F, InOut, true}, {t, Out}}, 1e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.adamw(p[0], p[1], p[2], p[3], n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, p[4], true);
                     }});
    for (DType d : {F, H}) {
      const std::string sd = s + (d == F ? "->f32" : "->bf16");
      cases.push_back({"convert" + sd, {{t, In}, {d, Out}}, 2e-6,
                       [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.convert(p[0], p[1], n); }});
      // fusion: pre, a, b (and da, db, dpre) of type t, res / dout / out of type d.
      cases.push_back({"fusion_fwd" + sd, {{t, In}, {t, In}, {t, In}, {d, Out}}, 2e-6,
                       [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                         o.fusion_fwd(p[0], p[1], p[2], nullptr, n, p[3]);
                       }});
      cases.push_back({"fusion_fwd+res" + sd, {{t, In}, {t, In}, {t, In}, {d, In}, {d, Out}}, 2e-6,
                       [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                         o.fusion_fwd(p[0], p[1], p[2], p[3], n, p[4]);
                       }});
      cases.push_back({"fusion_bwd" + sd, {{t, In}, {t, In}, {t, In}, {d, In}, {t, Out}, {t, Out}, {t, Out}}, 2e-6,
                       [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                         o.fusion_bwd(p[0], p[1], p[2], p[3], n, p[4], p[5], p[6]);
                       }});
    }
  }
  cases.push_back({"adamw", {{F, InOut}, {F, In}, {F, InOut}, {F, InOut, true}}, 1e-6,
                   [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                     o.adamw(p[0], p[1], p[2], p[3], n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, nullptr, false);
                   }});
  cases.push_back({"adamw+zero", {{F, InOut}, {F, InOut}, {F, InOut}, {F, InOut, true}}, 1e-6,
                   [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                     o.adamw(p[0], p[1], p[2], p[3], n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, nullptr, true);
                   }});

  // Storage bytes of fp32 values in type t.
  auto bytes_of = [](DType t, const Vec& v) {
    std::vector<unsigned char> b(v.size() * dtype_bytes(t));
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == DType::F32) std::memcpy(&b[i * 4], &v[i], 4);
      else if (t == DType::F64) {
        const double d = v[i];
        std::memcpy(&b[i * 8], &d, 8);
      } else {
        const uint16_t h = bf16_round(v[i]);
        std::memcpy(&b[i * 2], &h, 2);
      }
    }
    return b;
  };
  auto values_of = [](DType t, const std::vector<unsigned char>& b) {
    Vec v(b.size() / dtype_bytes(t));
    for (size_t i = 0; i < v.size(); ++i) {
      if (t == DType::F32) std::memcpy(&v[i], &b[i * 4], 4);
      else {
        uint16_t h;
        std::memcpy(&h, &b[i * 2], 2);
        v[i] = bf16_widen(h);
      }
    }
    return v;
  };
  // Runs c on `o` with operand k at element offset off + (shift if an input)
  // of a buffer that ends where the operand does, every byte before it
  // `fill`; returns each written operand's n elements' bytes (empty where
  // its bytes before the offset changed).
  auto run = [&](Ops<float>& o, const Case& c, const std::vector<Vec>& in, size_t n, size_t off, size_t shift,
                 unsigned char fill) {
    std::vector<DynBuffer<float>> bufs;
    std::vector<Ptr> ptrs;
    std::vector<size_t> at;
    for (size_t k = 0; k < c.ops.size(); ++k) {
      const Operand& op = c.ops[k];
      const size_t a = off + (op.role == In ? shift : 0), e = dtype_bytes(op.t);
      bufs.emplace_back(o, op.t, a + n);
      std::vector<unsigned char> b(bufs.back().bytes(), fill);
      if (op.role != Out) {
        const auto d = bytes_of(op.t, in[k]);
        std::memcpy(&b[a * e], d.data(), d.size());
      }
      o.upload(bufs.back().data().raw(), b.data(), b.size());
      ptrs.push_back(bufs.back().data() + a);
      at.push_back(a);
    }
    c.run(o, ptrs, n);
    std::vector<std::vector<unsigned char>> outs;
    for (size_t k = 0; k < c.ops.size(); ++k) {
      if (c.ops[k].role == In) continue;
      std::vector<unsigned char> b(bufs[k].bytes());
      o.download(b.data(), bufs[k].data().raw(), b.size());
      const size_t e = dtype_bytes(c.ops[k].t);
      const bool kept = std::all_of(b.begin(), b.begin() + long(at[k] * e), [&](unsigned char x) { return x == fill; });
      outs.emplace_back(kept ? std::vector<unsigned char>(b.begin() + long(at[k] * e), b.end())
                             : std::vector<unsigned char>());
    }
    return outs;
  };

  auto gpu = make_cuda_ops(CudaPrecision::FP32);
  auto cpu = make_backend<float>("cpu");
  auto cpu_bf16 = make_backend<float>("cpu-bf16");
  int failures = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    const bool any_bf16 =
        std::any_of(c.ops.begin(), c.ops.end(), [](const Operand& op) { return op.t == DType::BF16; });
    Ops<float>& ref = any_bf16 ? *cpu_bf16 : *cpu;
    double worst = 0;
    for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(4097)}) {
      std::vector<Vec> in;
      for (size_t k = 0; k < c.ops.size(); ++k) {
        Vec v = randn(n, 1000 * ci + 10 * k + n);
        if (c.ops[k].positive)
          for (auto& x : v) x = std::abs(x);
        in.push_back(v);
      }
      const auto want = run(ref, c, in, n, 0, 0, 0);
      for (size_t off = 0; off < 8; ++off) {
        const auto vec = run(*gpu, c, in, n, off, 0, 0x55);
        const auto scalar = run(*gpu, c, in, n, off, 1, 0xaa);
        size_t w = 0;
        for (size_t k = 0; k < c.ops.size(); ++k) {
          if (c.ops[k].role == In) continue;
          const std::string where =
              c.name + " n=" + std::to_string(n) + " offset " + std::to_string(off) + " operand " + std::to_string(k);
          EXPECT_FALSE(vec[w].empty()) << where << ": bytes before the operand written";
          EXPECT_FALSE(scalar[w].empty()) << where << ": bytes before the operand written (all-scalar run)";
          EXPECT_TRUE(vec[w] == scalar[w]) << where << ": not bit for bit the all-scalar run";
          if (!vec[w].empty()) {
            const double bound = c.ops[k].t == DType::BF16 ? 0.0079 : c.tol;
            const double e = rel(values_of(c.ops[k].t, want[w]), values_of(c.ops[k].t, vec[w]), 1.0);
            worst = std::max(worst, c.ops[k].t == DType::BF16 ? 0.0 : e);
            EXPECT_LT(e, bound) << where << ": against the CPU";
            if (e >= bound || vec[w] != scalar[w]) ++failures;
          }
          ++w;
        }
        if (failures > 20) FAIL() << "more than 20 mismatches";
      }
    }
    std::printf("  %-28s fp32 outputs' worst diff to the CPU %.2e (tol %.0e)\n", c.name.c_str(), worst, c.tol);
  }
}

// ---- the backend options and the GEMM paths (kernels/backend_options.h,
// kernels/cuda/gemm_tuner.cuh) -------------------------------------------------------

// An old switch still set is refused with the key that replaced it; an
// unknown option value is refused naming the key (and the values it takes).
TEST(CudaOps, BackendOptionsRefuseOldVariables) {
  REQUIRE_GPU();
  setenv("WIOLA_CUDA_ATTENTION", "rows", 1);
  try {
    make_cuda_ops(CudaPrecision::BF16);
    ADD_FAILURE() << "WIOLA_CUDA_ATTENTION was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.cuda_attention"), std::string::npos) << e.what();
  }
  unsetenv("WIOLA_CUDA_ATTENTION");
  EXPECT_THROW(make_cuda_ops(CudaPrecision::BF16, 0, {.gemm = "fastest"}), Error);
  // `make` must throw wiola::Error whose message holds `says`.
  const auto refused = [](const char* what, const std::function<void()>& make, const std::string& says) {
    try {
      make();
      ADD_FAILURE() << what << " was not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("attention_tile = 96x64",
          [] { make_cuda_ops(CudaPrecision::BF16, 0, {.attention = "fa2", .attention_tile = "96x64"}); },
          "train.cuda_attention_tile (--attention-tile) must be 64x64, 64x128, 128x64 or 128x128 (got \"96x64\")");
  refused("attention_bwd_tile = 64x96",
          [] { make_cuda_ops(CudaPrecision::BF16, 0, {.attention_bwd = "fa2", .attention_bwd_tile = "64x96"}); },
          "train.cuda_attention_bwd_tile (--attention-bwd-tile) must be 64x64, 64x128, 128x64 or 128x128 (got "
          "\"64x96\")");
  refused("attention_heads_per_block = 3",
          [] { make_cuda_ops(CudaPrecision::BF16, 0, {.attention = "fa2", .attention_heads_per_block = "3"}); },
          "train.cuda_attention_heads_per_block (--attention-heads-per-block) must be 1, 2 or 4 (got \"3\")");
  // Against the model: the heads a block must divide n_heads / n_kv_heads.
  check_attention_heads_per_block({.attention_heads_per_block = "4"}, 16, 4);
  refused("attention_heads_per_block = 4 with 16 / 8 heads",
          [] { check_attention_heads_per_block({.attention_heads_per_block = "4"}, 16, 8); },
          "must be 1 or divide the query heads of a KV group, model.n_heads / model.n_kv_heads = 16 / 8 (got 4)");
}

// One GEMM of every kind the backend issues (transposes NT, NN, TN; bf16
// operands into bf16 or fp32, fp32 into fp32; beta 0 and 1), by each value
// of the option gemm: cublaslt and auto (its sweep, then its choice once
// adopted) against cublas. The emulator computes every path alike: the same
// bits; on a GPU within the tuner's own tolerance.
TEST(CudaOps, GemmPathsMatchCublas) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  const int m = 70, n = 48, k = 96;
  const Vec a = randn(size_t(m) * k, 70), b = randn(size_t(k) * n, 71), c0 = randn(size_t(m) * n, 72);
  Buffer<float> a32(*gpu, a.size()), b32(*gpu, b.size()), c32(*gpu, c0.size());
  gpu->upload(a32.data(), a.data(), a32.bytes());
  gpu->upload(b32.data(), b.data(), b32.bytes());
  DynBuffer<float> a16(*gpu, DType::BF16, a.size()), b16(*gpu, DType::BF16, b.size()), c(*gpu, DType::F32, c0.size());
  gpu->convert(a32.data(), a16.data(), a.size());
  gpu->convert(b32.data(), b16.data(), b.size());
  for (auto [ta, tb] : {std::pair{Trans::N, Trans::T}, std::pair{Trans::N, Trans::N}, std::pair{Trans::T, Trans::N}})
    for (auto [ab, ct] : {std::pair{DType::BF16, DType::BF16}, std::pair{DType::BF16, DType::F32},
                          std::pair{DType::F32, DType::F32}})
      for (float beta : {0.f, 1.f}) {
        const int lda = ta == Trans::N ? k : m, ldb = tb == Trans::N ? n : k;
        const CPtr A = ab == DType::F32 ? CPtr(a32.data()) : a16.data(), B = ab == DType::F32 ? CPtr(b32.data()) : b16.data();
        auto run = [&](const std::string& path, int times) {
          set_cuda_backend_options(*gpu, {.gemm = path});
          Vec out;
          for (int t = 0; t < times; ++t) {
            gpu->upload(c32.data(), c0.data(), c32.bytes());
            const Ptr C = ct == DType::F32 ? Ptr(c.data()) : Ptr(c.data().raw(), DType::BF16);
            gpu->convert(c32.data(), C, c0.size());
            gpu->gemm(ta, tb, m, n, k, 0.5f, A, lda, B, ldb, beta, C, n);
            if (t == 0 && path == "auto") gpu->adopt_gemm_tuning(gpu->gemm_tuning());
            out = ct == DType::F32 ? Vec(c0.size()) : bf16_download(*gpu, C, c0.size());
            if (ct == DType::F32) gpu->download(out.data(), c.data().raw(), c32.bytes());
          }
          return out;
        };
        const Vec ref = run("cublas", 1), lt = run("cublaslt", 1), tuned = run("auto", 2);
        const std::string what = std::string(ta == Trans::T ? "T" : "N") + (tb == Trans::T ? "T " : "N ") +
                                 dtype_name(ab) + ">" + dtype_name(ct) + " beta " + std::to_string(int(beta));
#ifdef WIOLA_CUDA_EMU
        EXPECT_EQ(lt, ref) << what;
        EXPECT_EQ(tuned, ref) << what;
#else
        const double tol = ct == DType::F32 ? 1e-4 : 1e-2;
        EXPECT_LT(rel(ref, lt), tol) << what;
        EXPECT_LT(rel(ref, tuned), tol) << what;
#endif
      }
  set_cuda_backend_options(*gpu, {});
}

// The tuning table: what the backend measured round-trips through its text
// and is taken back unchanged; a table for another device or library
// version is ignored (with a message) and changes nothing; two backends
// given the same table make the same choice for the same GEMM; and (on the
// emulator, whose candidate 0 computes wrong with WIOLA_EMU_LT_WRONG_ALGO=0)
// a choice that fails its check against cublasGemmEx never wins.
TEST(CudaOps, GemmTuningTable) {
  REQUIRE_GPU();
#ifdef WIOLA_CUDA_EMU
  setenv("WIOLA_EMU_LT_WRONG_ALGO", "0", 1);
#endif
  auto sweep = [&] {
    auto gpu = make_cuda_ops(CudaPrecision::BF16, 0, {.gemm = "auto"});
    const int m = 64, n = 32, k = 4096;  // few output tiles, deep: split-K candidates
    DynBuffer<float> A(*gpu, DType::BF16, size_t(k) * m), B(*gpu, DType::BF16, size_t(k) * n), C(*gpu, DType::F32, size_t(m) * n);
    Buffer<float> tmp(*gpu, size_t(k) * m);
    const Vec h = randn(size_t(k) * m, 80);
    gpu->upload(tmp.data(), h.data(), tmp.bytes());
    gpu->convert(tmp.data(), A.data(), A.size());
    gpu->convert(tmp.data(), B.data(), B.size());
    gpu->zero(C.data().raw(), C.bytes());
    gpu->gemm(Trans::T, Trans::N, m, n, k, 1.f, A.data(), m, B.data(), n, 1.f, C.data(), n);
    gpu->synchronize();
    return gpu->gemm_tuning();
  };
  const std::string text = sweep();
  const auto file = nlohmann::json::parse(text);
  ASSERT_EQ(file["tables"].size(), 1u) << text;
  const std::string device = file["tables"][0]["device"];
  const GemmTable t = gemm_table_for(text, device, "test");
  ASSERT_EQ(t.choices.size(), 1u) << text;
  const GemmChoice& won = t.choices.begin()->second;
  EXPECT_GT(won.us, 0) << text;
  EXPECT_GE(won.tried.size(), 2u) << text;
#ifdef WIOLA_CUDA_EMU
  EXPECT_NE(won.config.rfind("id 0 ", 0), 0u) << "the wrong candidate won: " << text;
  bool rejected = false, split = false;
  for (const auto& c : won.tried) {
    rejected = rejected || (c.rfind("cublaslt id 0 ", 0) == 0 && c.find("rejected") != std::string::npos);
    split = split || c.find("splitk 4") != std::string::npos;
  }
  EXPECT_TRUE(rejected) << text;
  EXPECT_TRUE(split) << text;
  unsetenv("WIOLA_EMU_LT_WRONG_ALGO");
#endif
  // Round trip: the text read back is the same table; merged into a file
  // with another device's table, each device finds its own.
  EXPECT_EQ(gemm_table_for(gemm_tuning_json(t), device, "again").choices, t.choices);
  GemmTable other{"Another card, sm_80, cuBLASLt 1", {{"x", GemmChoice{}}}};
  const std::string both = merge_gemm_tuning(text, other);
  EXPECT_EQ(gemm_table_for(both, device, "both").choices, t.choices);
  std::string why;
  EXPECT_TRUE(gemm_table_for(gemm_tuning_json(other), device, "other", &why).choices.empty());
  EXPECT_NE(why.find("Another card"), std::string::npos) << why;
  // A backend given the table takes its choice, every time; another card's
  // table leaves it as it was.
  for (int run = 0; run < 2; ++run) {
    auto gpu = make_cuda_ops(CudaPrecision::BF16, 0, {.gemm = "auto"});
    gpu->adopt_gemm_tuning(text);
    gpu->adopt_gemm_tuning(gemm_tuning_json(other));  // ignored, with a message
    const GemmTable got = gemm_table_for(gpu->gemm_tuning(), device, "adopted");
    ASSERT_EQ(got.choices.size(), 1u);
    EXPECT_EQ(got.choices.begin()->second, won) << "run " << run;
  }
}

}  // namespace
}  // namespace wiola
