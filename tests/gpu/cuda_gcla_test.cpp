// The CUDA backend's GCLA pieces, SRPE and ATM (kernels/cuda/gcla.cu, srpe.cu,
// atm.cu) against the CPU backend in the fp32 mode: prefix means, the context
// attention, the rotation, and ATM's similarity, plan and row merges.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "tests/gpu/cuda_test_util.h"
#include "util/error.h"

namespace wiola {
namespace {

using namespace cuda_test;

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

// Documents (data.documents, docs/model.md §2) are not computed by the CUDA
// kernels yet: every op given document starts refuses them, naming the key,
// instead of computing something else.
TEST(CudaOps, DocumentStartsRefused) {
  REQUIRE_GPU();
  auto o = make_cuda_ops(CudaPrecision::FP32);
  const int B = 1, Tn = 8, d = 4, H = 2, Hkv = 1, dh = 4, N = B * Tn;
  Buffer<float> x(*o, size_t(N) * d), y(*o, size_t(N) * d), q(*o, size_t(N) * H * dh), lse(*o, size_t(N) * H);
  Buffer<float> proj(*o, size_t(N) * (2 * H + 2 * Hkv) * dh), k(*o, size_t(N) * Hkv * dh), table(*o, size_t(Tn) * dh);
  Buffer<float, int32_t> ds(*o, N), gf(*o, N), ke(*o, N), ng(*o, B);
  Buffer<float, double> rho(*o, size_t(B) * (Tn - 1));
  Buffer<float, uint8_t> open(*o, N);
  const AttnShape s{B, Tn, Tn, H, Hkv, dh, 0};
  const AttnKeys keys{nullptr, nullptr, nullptr, ds.data()};
  const std::function<void()> calls[] = {
      [&] { o->prefix_mean_fwd(x.data(), B, Tn, d, ds.data(), y.data(), nullptr); },
      [&] { o->prefix_mean_bwd(x.data(), B, Tn, d, ds.data(), y.data()); },
      [&] { o->atm_plan(rho.data(), B, Tn, 0.9, ds.data(), open.data(), gf.data(), ke.data(), ng.data()); },
      [&] {
        o->srpe_split_fwd(proj.data(), B, Tn, H, Hkv, dh, table.data(), ds.data(), q.data(), k.data(), k.data(),
                          q.data());
      },
      [&] {
        o->srpe_split_bwd(q.data(), k.data(), k.data(), q.data(), B, Tn, H, Hkv, dh, table.data(), ds.data(),
                          proj.data());
      },
      [&] { o->attention_fwd(s, keys, q.data(), k.data(), k.data(), nullptr, nullptr, q.data(), lse.data()); },
  };
  for (const auto& call : calls) {
    try {
      call();
      ADD_FAILURE() << "document starts were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("data.documents"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace wiola
