// The CUDA backend's self-attention (kernels/cuda/attention.cu, the row
// kernels; attention_tc.cu, the bf16 tensor-core kernels) against the CPU
// backend, plain causal and with ATM keys, with and without packed documents,
// forward and backward.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tests/gpu/cuda_test_util.h"

#ifdef WIOLA_CUDA_EMU
#include "tools/cuda_emu/emu_sanitizer.h"
#endif

namespace wiola {
namespace {

using namespace cuda_test;

// Self-attention with GQA, plain causal and with ATM keys (merged rows,
// self_open raw keys), forward and backward; at d_h = 64 again with packed
// documents (doc_start): each sequence holds short documents, documents that
// are only an EOS (length 1, at the window's start too) and a long one, and
// the ATM plan merges no pair across a document start.
TEST(CudaOps, AttentionPlainAndAtm) {
  REQUIRE_GPU();
  for (int dh : {16, 64, 128}) {
    AttnShape s;
    s.B = 2;
    s.Tq = s.Tk = 45;
    s.H = 4;
    s.Hkv = 2;
    s.dh = dh;
    const size_t nq = size_t(s.B) * s.Tq * s.H * dh, nk = size_t(s.B) * s.Tk * s.Hkv * dh;
    const Vec q = randn(nq, 20), k = randn(nk, 21), v = randn(nk, 22), dout = randn(nq, 23);
    // Documents: starts at 3, 4 (an EOS-only document), 20, 31, 32 (EOS-only)
    // and at 1 (after an EOS-only first one), 2, 9 (a long one), 44 (the last
    // position alone).
    const std::vector<int32_t> docs = doc_starts(s.Tq, {{3, 4, 20, 31, 32}, {1, 2, 9, 44}});
    for (int variant = 0; variant < (dh == 64 ? 4 : 2); ++variant) {
      const bool with_atm = variant % 2 == 1, with_docs = variant >= 2;
      // A merge plan: pairs (t, t+1) for t % 5 == 1 (none across a document start).
      std::vector<uint8_t> open(size_t(s.B) * s.Tq, 0);
      for (int b = 0; b < s.B; ++b)
        for (int t = 1; t + 1 < s.Tq; t += 5) open[size_t(b) * s.Tq + t] = 1;
      if (with_docs) no_merge_across(open, docs, s.B, s.Tq);
      const AtmLayout lay = atm_layout(open, s.B, s.Tq);
      const std::string name =
          "attention dh=" + std::to_string(dh) + (with_atm ? " ATM" : "") + (with_docs ? " docs" : "");
      same_on_gpu(name.c_str(), 3e-5, [&](Ops<float>& o) {
        OnBackend r(o);
        float *bq = r.in(q), *bk = r.in(k), *bv = r.in(v), *bd = r.in(dout);
        float *out = r.in(Vec(nq)), *lse = r.in(Vec(size_t(s.B) * s.H * s.Tq));
        float *dq = r.in(Vec(nq)), *dk = r.in(Vec(nk)), *dv = r.in(Vec(nk)), *drk = r.in(Vec(nk)), *drv = r.in(Vec(nk));
        Buffer<float, int32_t> ke(o, lay.key_end.size()), ng(o, lay.n_groups.size());
        Buffer<float, uint8_t> so(o, open.size());
        Buffer<float, int32_t> ds(o, docs.size());
        o.upload(ke.data(), lay.key_end.data(), ke.bytes());
        o.upload(ng.data(), lay.n_groups.data(), ng.bytes());
        o.upload(so.data(), open.data(), so.bytes());
        o.upload(ds.data(), docs.data(), ds.bytes());
        AttnKeys keys = with_atm ? AttnKeys{ke.data(), ng.data(), so.data()} : AttnKeys{};
        if (with_docs) keys.doc_start = ds.data();
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
        o.attention_bwd(s, keys, bq, mk, mv, with_atm ? bk : nullptr, with_atm ? bv : nullptr, out, lse, bd, dq, dk, dv,
                        with_atm ? drk : nullptr, with_atm ? drv : nullptr);
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

// The bf16 attention on tensor cores (kernels/cuda/attention_tc.cu), forward
// and backward, against the CPU on exactly the GPU's bf16 inputs: plain causal
// and ATM keys with self-open raw keys, every head dim it takes; then the same
// calls with the backend option attention_bwd = v2 (the second form of the
// tensor-core backward), then with attention = rows (the row kernels).
// Tolerances (max abs diff / max abs of the CPU result): P and dS enter the
// products as bf16 and every output is stored in bf16.
//
// The shapes and the kernels' paths they reach (64-row query and key tiles;
// the kernels mask element by element, so a path is a loop count or a branch):
// - T = 67 (every head dim): a full and a partial tile of queries and keys;
//   plain causal, the second key tile's loads issued while the first is
//   computed (k_attention_fwd_tc's prefetch, k_attention_bwd_dq_tc's key loop) and a dK/dV
//   block meeting a diagonal and a partial query tile; with ATM (one pair
//   merged in five: 54 keys or fewer) a dK/dV key block wholly past the merged
//   keys (KeyBlock i_start = T: no query tile) and self-open raw keys.
// - T = 150 (two full tiles and a partial one): as T = 67, and a dK/dV block
//   meeting a full query tile below the diagonal, a query tile with two whole
//   key tiles before its diagonal one. On the GPU at every head dim; on the
//   emulator (three runs in CI: emu, rev, asan) at d_h = 64. At T = 150 also
//   with packed documents (test_documents: starts inside a tile and on its
//   boundaries, EOS-only documents, one across the boundary at 128), plain
//   and ATM (no pair merged across a start): query blocks whose key loop
//   starts past tile 0 (rows 64.. and 128.. of the first sequence), dK/dV
//   blocks whose query loop ends before the last tile (keys 0..63, whose
//   documents end at 64), partially visible tiles masked by the document.
TEST(CudaOps, AttentionTensorCoresBf16) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  auto cpu = make_backend<float>("cpu");
  auto from_bf16 = [&](CPtr src, size_t n) { return bf16_download(*gpu, src, n); };
  for (int dh : {32, 64, 96, 128})
    for (int T : {67, 150}) {
#ifdef WIOLA_CUDA_EMU
      if (T == 150 && dh != 64) continue;
#endif
      AttnShape s;
      s.B = 2;
      s.Tq = s.Tk = T;
      s.H = 4;
      s.Hkv = 2;
      s.dh = dh;
      const size_t nq = GpuAttnCall::nq(s), nk = GpuAttnCall::nk(s), nl = GpuAttnCall::nl(s);
      DynBuffer<float> gq(*gpu, DType::BF16, nq), gk(*gpu, DType::BF16, nk), gv(*gpu, DType::BF16, nk),
          gdo(*gpu, DType::BF16, nq);
      AttnInputs in;
      in.q = bf16_round_trip(*gpu, randn(nq, 40), gq);
      in.k = bf16_round_trip(*gpu, randn(nk, 41), gk);
      in.v = bf16_round_trip(*gpu, randn(nk, 42), gv);
      in.dout = bf16_round_trip(*gpu, randn(nq, 43), gdo);
      for (int variant = 0; variant < (T == 150 ? 4 : 2); ++variant) {
        const bool with_atm = variant % 2 == 1, with_docs = variant >= 2;
#ifdef WIOLA_CUDA_EMU
        // Under ASan T = 150 with ATM and documents only: every mask path of
        // it, each variant already at T = 67.
        if (wiola_emu::under_address_sanitizer() && T == 150 && variant != 3) continue;
#endif
        in.doc_start = with_docs ? test_documents(s.B, s.Tq) : std::vector<int32_t>{};
        in.open.assign(size_t(s.B) * s.Tq, 0);
        for (int b = 0; b < s.B; ++b)
          for (int t = 1 + b; t + 1 < s.Tq; t += 5) in.open[size_t(b) * s.Tq + t] = 1;
        if (with_docs) no_merge_across(in.open, in.doc_start, s.B, s.Tq);
        in.lay = atm_layout(in.open, s.B, s.Tq);
        // The GPU: merged rows (ATM) in bf16, then forward and backward.
        GpuAttnCall c(*gpu, s, in.lay, in.open, gk.data(), gv.data(), with_atm, in.doc_start);
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
        set_cuda_backend_options(*gpu, {.attention_bwd = AttentionBwd::V2});
        const auto tc2 = run_gpu();
        set_cuda_backend_options(*gpu, {.attention = AttentionFwd::Rows});
        const auto rows = run_gpu();
        set_cuda_backend_options(*gpu, {});
        // The CPU on the same (bf16-valued) inputs: one reference for the three.
        const std::vector<Vec> ref = cpu_attention(*cpu, *gpu, s, in, c, with_atm);

        const char* names[] = {"o", "lse", "dq", "dk", "dv", "draw_k", "draw_v"};
        const double tols[] = {2e-2, 1e-3, 3e-2, 3e-2, 3e-2, 3e-2, 3e-2};
        const std::string name = "dh=" + std::to_string(dh) + " T=" + std::to_string(T) + (with_atm ? " ATM" : "") +
                                 (with_docs ? " docs" : "");
        for (const auto& [kernel, got] :
             {std::pair{"tensor cores", tc}, std::pair{"tc bwd v2", tc2}, std::pair{"rows", rows}}) {
          ASSERT_EQ(got.size(), ref.size());
          for (size_t t = 0; t < ref.size(); ++t) {
            const double e = rel(ref[t], got[t]);
            std::printf("  attention bf16 %-16s %-12s %-7s max rel %.2e (tol %.0e)\n", name.c_str(), kernel, names[t],
                        e, tols[t]);
            EXPECT_LT(e, tols[t]) << name << " " << kernel << " " << names[t];
          }
        }
      }
    }
}

}  // namespace
}  // namespace wiola
