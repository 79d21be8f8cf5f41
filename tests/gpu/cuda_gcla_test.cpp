// The CUDA backend's GCLA pieces, SRPE and ATM (kernels/cuda/gcla.cu, srpe.cu,
// atm.cu) against the CPU backend in the fp32 mode: prefix means, the context
// attention, the rotation, and ATM's similarity, plan and row merges; with
// documents (and the cross-entropy's masked targets, vocab.cu) in both modes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/atm_plan.h"
#include "tests/gpu/cuda_test_util.h"

namespace wiola {
namespace {

using namespace cuda_test;

// An SRPE table [Tn, dh/2, 2] of (c, s) with a norm that varies by position.
Vec srpe_test_table(int Tn, int dh) {
  Vec table(size_t(Tn) * dh);
  for (int t = 0; t < Tn; ++t)
    for (int j = 0; j < dh / 2; ++j) {
      const double th = t * std::pow(1e4, -2.0 * j / dh), rr = 1 + 0.1 * std::sin(0.01 * t);
      table[(size_t(t) * dh / 2 + j) * 2] = float(rr * std::cos(th));
      table[(size_t(t) * dh / 2 + j) * 2 + 1] = float(rr * std::sin(th));
    }
  return table;
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
      o.prefix_mean_fwd(bx, sB, sTn, sd, nullptr, out, oop);  // with the GEMM operand copy
      o.prefix_mean_bwd(bd, sB, sTn, sd, nullptr, dx);
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
    float *bq = r.in(q), *bk = r.in(kc), *bv = r.in(vc), *out = r.in(Vec(q.size())),
          *pr = r.in(Vec(size_t(N) * H * nc));
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
  const Vec table = srpe_test_table(Tn, dh);
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
    o.atm_plan(rho.data(), B, Tn, 0.9, nullptr, open.data(), gf.data(), ke.data(), ng.data());
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

// Buffers of any storage type on one backend: host values in (rounded once
// to the type), values out as floats; document starts and targets in.
struct Typed {
  Ops<float>& ops;
  std::deque<DynBuffer<float>> bufs;
  std::deque<Buffer<float, int32_t>> ints;
  explicit Typed(Ops<float>& o) : ops(o) {}
  Ptr in(DType t, const Vec& h) {
    Buffer<float> f(ops, h.size());
    ops.upload(f.data(), h.data(), f.bytes());
    bufs.emplace_back(ops, t, h.size());
    ops.convert(f.data(), bufs.back().data(), h.size());
    return bufs.back().data();
  }
  const int32_t* in(const std::vector<int32_t>& h) {
    ints.emplace_back(ops, h.size());
    ops.upload(ints.back().data(), h.data(), h.size() * sizeof(int32_t));
    return ints.back().data();
  }
  Vec out(CPtr p, size_t n) {
    Buffer<float> f(ops, n);
    ops.convert(p, f.data(), n);
    Vec h(n);
    ops.download(h.data(), f.data(), f.bytes());
    return h;
  }
};

// Document starts [B, Tn] (model/model.cpp's document_starts) from each
// sequence's document lengths.
std::vector<int32_t> starts_of(const std::vector<std::vector<int>>& lens, int Tn) {
  std::vector<int32_t> ds;
  for (const auto& seq : lens) {
    int first = 0;
    for (const int len : seq) {
      ds.insert(ds.end(), size_t(len), first);
      first += len;
    }
    EXPECT_EQ(first, Tn) << "document lengths";
  }
  return ds;
}

// Documents (data.documents, docs/model.md §2) on the CUDA backend against the
// CPU's, in fp32 (cpu, cuda-fp32) and in bf16 (cpu-bf16, cuda): the prefix
// means restarting at each document, forward and backward; SRPE's split and
// join with each document's positions; ATM's plan with no pair across a
// start; the cross-entropy with masked (negative) targets. The documents:
// EOS-only ones (one token), ones of two (ATM's pair) and of fewer rows than
// a scan chunk, starts on a chunk's first row, and documents
// across several chunks (the scans split Tn = 301 into chunks of 10 rows,
// Tn = 37 into chunks of 2); a sequence with no start but 0.
TEST(CudaOps, DocumentsMatchCpu) {
  REQUIRE_GPU();
  struct Shape {
    int B, Tn, d;
    std::vector<std::vector<int>> lens;
  };
  const Shape shapes[] = {{2, 301, 40, {{3, 1, 1, 5, 10, 45, 2, 150, 84}, {1, 299, 1}}},
                          {3, 37, 64, {{1, 1, 2, 3, 30}, {37}, {5, 1, 14, 17}}}};
  for (const Shape& sh : shapes) {
    const int sB = sh.B, sTn = sh.Tn, sd = sh.d;  // captured by the lambdas below
    SCOPED_TRACE(testing::Message() << "B " << sB << " Tn " << sTn);
    const std::vector<int32_t> ds = starts_of(sh.lens, sTn);
    const size_t n = size_t(sB) * sTn * sd;
    const Vec x = randn(n, 12), dout = randn(n, 13);
    // The summaries: residual-type x (fp32 in both modes, and the
    // activation type), the GEMM operand copy in the activation type.
    auto prefix = [&](Ops<float>& o) {
      Typed r(o);
      std::vector<Vec> outs;
      std::vector<DType> residual{DType::F32};
      if (o.precision().act != DType::F32) residual.push_back(o.precision().act);
      for (const DType res : residual) {
        const Ptr out = r.in(res, Vec(n)), op = r.in(o.precision().act, Vec(n)), dx = r.in(res, Vec(n, 1.f));
        const int32_t* bds = r.in(ds);
        o.prefix_mean_fwd(r.in(res, x), sB, sTn, sd, bds, out, op);
        o.prefix_mean_bwd(r.in(res, dout), sB, sTn, sd, bds, dx);
        for (const CPtr p : {CPtr(out), CPtr(op), CPtr(dx)}) outs.push_back(r.out(p, n));
      }
      return outs;
    };
    same_on_gpu("prefix means, documents", 1e-6, prefix);
    same_on_gpu_bf16("prefix means, documents bf16", 8e-3, prefix);
  }

  // SRPE split and join (16 bytes a thread at dh 16, one element at dh 6),
  // the table's row of each position in its document.
  const int B = 3, Tn = 37;
  const std::vector<int32_t> ds = starts_of({{1, 1, 2, 3, 30}, {37}, {5, 1, 14, 17}}, Tn);
  for (const int dh : {16, 6}) {
    const int H = 4, Hkv = 2, N = B * Tn;
    const size_t nq = size_t(N) * H * dh, nk = size_t(N) * Hkv * dh, nw = 2 * (nq + nk);
    const Vec table = srpe_test_table(Tn, dh);
    const Vec proj = randn(nw, 40), g = randn(nw, 41);
    auto srpe = [&](Ops<float>& o) {
      Typed r(o);
      const DType act = o.precision().act;
      const int32_t* bds = r.in(ds);
      const Ptr tab = r.in(DType::F32, table), p = r.in(act, proj), dp = r.in(act, Vec(nw));
      const Ptr q = r.in(act, Vec(nq)), k = r.in(act, Vec(nk)), v = r.in(act, Vec(nk)), gate = r.in(act, Vec(nq));
      const CPtr gs = r.in(act, g);
      o.srpe_split_fwd(p, B, Tn, H, Hkv, dh, tab, bds, q, k, v, gate);
      o.srpe_split_bwd(gs, gs + nq, gs + (nq + nk), gs + (nq + 2 * nk), B, Tn, H, Hkv, dh, tab, bds, dp);
      return std::vector<Vec>{r.out(q, nq), r.out(k, nk), r.out(v, nk), r.out(gate, nq), r.out(dp, nw)};
    };
    same_on_gpu("srpe split, documents", 1e-6, srpe);
    same_on_gpu_bf16("srpe split, documents bf16", 8e-3, srpe);
  }

  // ATM's plan: every pair above tau at a document's start, so that only
  // the documents keep them apart (the plan differs without them).
  std::vector<double> rho(size_t(B) * (Tn - 1));
  std::mt19937_64 rg(5);
  for (auto& v : rho) v = double(rg() % 2001) / 1000.0 - 1.0;
  for (int b = 0; b < B; ++b)
    for (int t = 1; t < Tn; ++t)
      if (ds[size_t(b) * Tn + t] == t) rho[size_t(b) * (Tn - 1) + t - 1] = 0.99;
  const double tau = 0.2;
  same_on_gpu("atm plan, documents", 1e-6, [&](Ops<float>& o) {
    Typed r(o);
    Buffer<float, double> br(o, rho.size());
    o.upload(br.data(), rho.data(), rho.size() * sizeof(double));
    Buffer<float, uint8_t> open(o, size_t(B) * Tn);
    Buffer<float, int32_t> gf(o, size_t(B) * Tn), ke(o, size_t(B) * Tn), ng(o, B);
    o.atm_plan(br.data(), B, Tn, tau, r.in(ds), open.data(), gf.data(), ke.data(), ng.data());
    std::vector<uint8_t> op(open.size());
    std::vector<int32_t> f(gf.size()), e(ke.size()), c(ng.size());
    o.download(op.data(), open.data(), op.size());
    o.download(f.data(), gf.data(), f.size() * 4);
    o.download(e.data(), ke.data(), e.size() * 4);
    o.download(c.data(), ng.data(), c.size() * 4);
    for (int b = 0; b < B; ++b)  // no pair crosses a start
      for (int t = 0; t + 1 < Tn; ++t)
        EXPECT_FALSE(op[size_t(b) * Tn + t] && ds[size_t(b) * Tn + t + 1] == t + 1) << b << " " << t;
    std::vector<uint8_t> plain(static_cast<size_t>(Tn));
    atm_greedy_row(rho.data(), Tn, tau, plain.data());
    EXPECT_NE(std::vector<uint8_t>(op.begin(), op.begin() + Tn), plain) << "the documents changed no merge";
    return std::vector<Vec>{Vec(op.begin(), op.end()), Vec(f.begin(), f.end()), Vec(e.begin(), e.end()),
                            Vec(c.begin(), c.end())};
  });

  // Cross-entropy with masked targets (the EOS positions' with documents):
  // loss 0 and a zero gradient row; a vocab slice [v0, v0 + V).
  const int N = 60, V = 517, v0 = 40;
  const Vec logits = randn(size_t(N) * V, 10, 3.f);
  std::vector<int32_t> tg(N);
  for (int i = 0; i < N; ++i) tg[size_t(i)] = i % 5 == 2 ? -1 : int32_t(rg() % 600);
  auto ce = [&](Ops<float>& o) {
    Typed r(o);
    const DType F = DType::F32;
    const int32_t* bt = r.in(tg);
    const Ptr lg = r.in(o.precision().act, logits), mx = r.in(F, Vec(N)), se = r.in(F, Vec(N)), t = r.in(F, Vec(N));
    const Ptr loss = r.in(F, Vec(N, 5.f)), l2 = r.in(F, Vec(N, 5.f));
    o.ce_row_max(lg, N, V, mx);
    o.ce_sumexp_target(lg, bt, N, V, v0, mx, se, t);
    o.ce_loss(lg, bt, N, V, v0, mx, se, t, l2);
    o.ce_loss_grad(lg, bt, N, V, v0, mx, se, t, 0.01, loss);
    std::vector<Vec> outs{r.out(loss, N), r.out(l2, N), r.out(lg, logits.size())};
    for (int i = 2; i < N; i += 5) {  // the masked rows: nothing
      EXPECT_EQ(outs[0][size_t(i)], 0.f);
      EXPECT_EQ(outs[1][size_t(i)], 0.f);
      for (int j = 0; j < V; ++j) EXPECT_EQ(outs[2][size_t(i) * V + j], 0.f);
    }
    return outs;
  };
  same_on_gpu("cross-entropy, masked targets", 2e-5, ce);
  same_on_gpu_bf16("cross-entropy, masked bf16", 8e-3, ce);
}

}  // namespace
}  // namespace wiola
