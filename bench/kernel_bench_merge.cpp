// wiola_kernel_bench's merged projections (section "gemm merge", run by
// run_gemm): projections that read one input as one GEMM or as several.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"

namespace kernel_bench {
namespace {

// Projections that read one input, as one GEMM or as several (run by
// run_gemm, section "gemm merge"): the context K|V (model/layer.cpp merges
// them: W_K^ctx and W_V^ctx adjacent, keys and values interleaved [N, nc, 2,
// Hkv dh]) and DSFF's three up-projections G_A, U_A, U_B, which read the
// normed X-half (separate in the model, docs/gpu.md; whether to merge them is
// this measurement's to decide). Per case and direction: "merged", the one
// GEMM; "separate", the GEMMs an unmerged step issues; for DSFF also
// "merged+copies", the merged GEMM with the copies the model's separate
// ga/ua/ub tensors would need (the forward's output split into them; the
// backward's three gradients joined first; the weight GEMM reads the join
// the data GEMM made, its copies counted in both). Before it is timed each
// case runs once from zeroed outputs, separate against the merged form with
// separate's output layout, max relative difference within 1e-2 (bf16
// outputs) or 1e-3 (fp32); one that fails is not timed. One JSON line per
// case: each variant's median and speedup = separate / merged (> 1: merging
// pays).
struct MergeCase {
  std::string name;
  long per_step;                                             // calls per step
  DType out;                                                 // the output's storage type
  size_t out_elems;                                          // what the check compares
  double flops;                                              // one call's
  std::function<void(Ptr)> merged, separate, merged_copies;  // merged_copies: DSFF only
};

// The operands of the merge cases at the step's shapes. X: the first
// activation operand (dkvc [N, nc 2 kvd]; the joined DSFF gradient [N, u];
// the merged forward's output before its split); Y: the second ([N, d]: a
// summary, X-half normed); S: DSFF's three separate gradients [N, dA], [N,
// dA], [N, dB] back to back; W: [wkc; wvc] or [G_A; U_A; U_B]; C1, C2:
// outputs.
struct MergeOperands {
  int N, d, kvd, nc, kv2, dA, dB, u;  // u: DSFF's merged up-projection width
  long ctx_rows = 0, layers;          // calls per step: context rows over the layers; layers
  DynBuffer<float> X, Y, S, W;
  Buffer<float, unsigned char> C1, C2;

  MergeOperands(Ops<float>& g, const Shapes& sh)
      : N(sh.N()),
        d(sh.cfg.d),
        kvd(sh.cfg.Hkv * sh.cfg.dh()),
        nc(sh.cfg.Lambda),
        kv2(2 * kvd),
        dA(sh.cfg.dA),
        dB(sh.cfg.dB),
        u(2 * dA + dB),
        layers(sh.cfg.L) {
    for (int l = 0; l < sh.cfg.L; ++l) ctx_rows += sh.cfg.n_ctx(l);
    const size_t nN = size_t(N);
    const size_t nx = nN * size_t(std::max(nc * kv2, u)), nw = size_t(std::max(kv2, u)) * d;
    const size_t c_bytes = std::max({nN * nc * kv2 * 2, nN * d * 4, nN * u * 2, size_t(u) * d * 4});
    const DType bf = DType::BF16;
    X = DynBuffer<float>(g, bf, nx);
    Y = DynBuffer<float>(g, bf, nN * d);
    S = DynBuffer<float>(g, bf, nN * u);
    W = DynBuffer<float>(g, bf, nw);
    C1 = Buffer<float, unsigned char>(g, c_bytes);
    C2 = Buffer<float, unsigned char>(g, c_bytes);
    fill(g, X.data(), X.size(), 51);
    fill(g, Y.data(), Y.size(), 52);
    fill(g, S.data(), S.size(), 53);
    fill(g, W.data(), W.size(), 54);
  }
};

// The cases: the context K|V and DSFF's up-projections, each direction.
std::vector<MergeCase> merge_cases(Ops<float>& g, MergeOperands& op) {
  const int N = op.N, d = op.d, kvd = op.kvd, nc = op.nc, kv2 = op.kv2, dA = op.dA, dB = op.dB, u = op.u;
  const long ctx_rows = op.ctx_rows;
  const DType bf = DType::BF16, f32 = DType::F32;
  const size_t nN = size_t(N);
  const Trans n_ = Trans::N, t_ = Trans::T;
  const CPtr x = op.X.data(), y = op.Y.data(), s = op.S.data(), w = op.W.data();
  const Ptr xw = op.X.data();
  const CPtr sa = s, su = s + nN * dA, sb = s + 2 * nN * dA;  // dga, dua, dub
  // The join of S into X as the merged DSFF GEMMs read it ([N, u]).
  auto join = [=, &g] {
    g.copy_block(xw, u, sa, dA, N, dA);
    g.copy_block(xw + dA, u, su, dA, N, dA);
    g.copy_block(xw + 2 * dA, u, sb, dB, N, dB);
  };
  return {
      {"ctx k|v fwd",
       ctx_rows,
       bf,
       nN * nc * kv2,
       2.0 * N * kv2 * d,
       [=, &g](Ptr out) { g.gemm(n_, t_, N, kv2, d, 1.f, y, d, w, d, 0.f, out, nc * kv2); },
       [=, &g](Ptr out) {
         g.gemm(n_, t_, N, kvd, d, 1.f, y, d, w, d, 0.f, out, nc * kv2);
         g.gemm(n_, t_, N, kvd, d, 1.f, y, d, w + size_t(kvd) * d, d, 0.f, out + kvd, nc * kv2);
       },
       {}},
      {"ctx k|v bwd data",
       ctx_rows,
       f32,
       nN * d,
       2.0 * N * kv2 * d,
       [=, &g](Ptr out) { g.gemm(n_, n_, N, d, kv2, 1.f, x, nc * kv2, w, d, 1.f, out, d); },
       [=, &g](Ptr out) {
         g.gemm(n_, n_, N, d, kvd, 1.f, x, nc * kv2, w, d, 1.f, out, d);
         g.gemm(n_, n_, N, d, kvd, 1.f, x + kvd, nc * kv2, w + size_t(kvd) * d, d, 1.f, out, d);
       },
       {}},
      {"ctx k|v bwd weight",
       ctx_rows,
       f32,
       size_t(kv2) * d,
       2.0 * N * kv2 * d,
       [=, &g](Ptr out) { g.gemm(t_, n_, kv2, d, N, 1.f, x, nc * kv2, y, d, 1.f, out, d); },
       [=, &g](Ptr out) {
         g.gemm(t_, n_, kvd, d, N, 1.f, x, nc * kv2, y, d, 1.f, out, d);
         g.gemm(t_, n_, kvd, d, N, 1.f, x + kvd, nc * kv2, y, d, 1.f, out + size_t(kvd) * d, d);
       },
       {}},
      // Separate: ga, ua, ub contiguous one after the other in out.
      {"dsff up fwd", op.layers, bf, nN * u, 2.0 * N * u * d,
       [=, &g](Ptr out) { g.gemm(n_, t_, N, u, d, 1.f, y, d, w, d, 0.f, out, u); },
       [=, &g](Ptr out) {
         g.gemm(n_, t_, N, dA, d, 1.f, y, d, w, d, 0.f, out, dA);
         g.gemm(n_, t_, N, dA, d, 1.f, y, d, w + size_t(dA) * d, d, 0.f, out + nN * dA, dA);
         g.gemm(n_, t_, N, dB, d, 1.f, y, d, w + size_t(2 * dA) * d, d, 0.f, out + 2 * nN * dA, dB);
       },
       [=, &g](Ptr out) {
         g.gemm(n_, t_, N, u, d, 1.f, y, d, w, d, 0.f, xw, u);
         g.copy_block(out, dA, x, u, N, dA);
         g.copy_block(out + nN * dA, dA, x + dA, u, N, dA);
         g.copy_block(out + 2 * nN * dA, dB, x + 2 * dA, u, N, dB);
       }},
      // As model/layer.cpp: U_B's first (overwrites), then G_A's and U_A's.
      {"dsff up bwd data", op.layers, f32, nN * d, 2.0 * N * u * d,
       [=, &g](Ptr out) { g.gemm(n_, n_, N, d, u, 1.f, x, u, w, d, 0.f, out, d); },
       [=, &g](Ptr out) {
         g.gemm(n_, n_, N, d, dB, 1.f, sb, dB, w + size_t(2 * dA) * d, d, 0.f, out, d);
         g.gemm(n_, n_, N, d, dA, 1.f, sa, dA, w, d, 1.f, out, d);
         g.gemm(n_, n_, N, d, dA, 1.f, su, dA, w + size_t(dA) * d, d, 1.f, out, d);
       },
       [=, &g](Ptr out) {
         join();
         g.gemm(n_, n_, N, d, u, 1.f, x, u, w, d, 0.f, out, d);
       }},
      {"dsff up bwd weight", op.layers, f32, size_t(u) * d, 2.0 * N * u * d,
       [=, &g](Ptr out) { g.gemm(t_, n_, u, d, N, 1.f, x, u, y, d, 1.f, out, d); },
       [=, &g](Ptr out) {
         g.gemm(t_, n_, dA, d, N, 1.f, sa, dA, y, d, 1.f, out, d);
         g.gemm(t_, n_, dA, d, N, 1.f, su, dA, y, d, 1.f, out + size_t(dA) * d, d);
         g.gemm(t_, n_, dB, d, N, 1.f, sb, dB, y, d, 1.f, out + size_t(2 * dA) * d, d);
       },
       [=, &g](Ptr out) {
         join();
         g.gemm(t_, n_, u, d, N, 1.f, x, u, y, d, 1.f, out, d);
       }},
  };
}

// Runs case m once from zeroed outputs, separate against the merged form
// with separate's output layout, into j["check"]; then, if within bounds,
// times each form. Returns what stdout shows.
std::string run_merge_case(Ops<float>& g, const Options& o, MergeOperands& op, const MergeCase& m, json& j) {
  const DType bf = DType::BF16;
  const auto& check = m.merged_copies ? m.merged_copies : m.merged;
  const Ptr o1(op.C1.data(), m.out), o2(op.C2.data(), m.out);
  g.zero(op.C1.data(), op.C1.bytes());
  g.zero(op.C2.data(), op.C2.bytes());
  m.separate(o1);
  check(o2);
  const Vec r1 = m.out == bf ? download_bf16(g, o1, m.out_elems) : download_vec(g, o1.as<float>(), m.out_elems);
  const Vec r2 = m.out == bf ? download_bf16(g, o2, m.out_elems) : download_vec(g, o2.as<float>(), m.out_elems);
  const double err = rel(r1, r2), tol = m.out == bf ? 1e-2 : 1e-3;
  j["check"] = {{"max_rel", err}, {"tol", tol}, {"against", m.merged_copies ? "merged+copies" : "merged"}};
  j["ok"] = err < tol;
  char buf[256];
  if (!(err < tol)) {
    std::snprintf(buf, sizeof buf, "FAILED its check (not timed): max_rel %.3g >= %.3g", err, tol);
    return buf;
  }
  const Timing tm = time_op(g, o, [&] { m.merged(o1); });
  const Timing ts = time_op(g, o, [&] { m.separate(o1); });
  put_timing(j, tm);  // ms: the merged GEMM's
  j["merged_ms"] = tm.ms;
  j["separate_ms"] = ts.ms;
  j["speedup"] = ts.ms / tm.ms;
  j["tflops"] = m.flops / (tm.ms * 1e-3) / 1e12;
  std::snprintf(buf, sizeof buf, "merged %8.3f ms, separate %8.3f ms (x%.2f)", tm.ms, ts.ms, ts.ms / tm.ms);
  std::string line = buf;
  if (m.merged_copies) {
    const Timing tc = time_op(g, o, [&] { m.merged_copies(o1); });
    j["merged_copies_ms"] = tc.ms;
    j["speedup_with_copies"] = ts.ms / tc.ms;
    std::snprintf(buf, sizeof buf, ", merged+copies %8.3f ms (x%.2f)", tc.ms, ts.ms / tc.ms);
    line += buf;
  }
  return line;
}

}  // namespace

void run_merges(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  MergeOperands op(g, sh);
  for (const MergeCase& m : merge_cases(g, op)) {
    json j{{"section", "gemm merge"},
           {"name", "gemm merge " + m.name},
           {"per_step", m.per_step},
           {"N", op.N},
           {"d", op.d},
           {"out", dtype_short(m.out)},
           {"flops", m.flops}};
    if (m.name.rfind("ctx", 0) == 0) {
      j["kvd"] = op.kvd;
      j["nc"] = op.nc;
    } else {
      j["dA"] = op.dA;
      j["dB"] = op.dB;
    }
    std::string line;
    try {
      line = run_merge_case(g, o, op, m, j);
    } catch (const std::exception& e) {
      line = put_error(g, j, e);
    }
    rep.emit(j);
    std::printf("gemm merge %-20s x%-3ld: %s\n", m.name.c_str(), m.per_step, line.c_str());
  }
}

}  // namespace kernel_bench
