// The CUDA backend's flat elementwise ops (kernels/cuda/elementwise.cu,
// optimizer.cu) against the CPU backend: each op's forward and backward in
// the fp32 mode, and the 16-byte vectorised paths against the scalar ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/scalar.h"
#include "tests/gpu/cuda_test_util.h"

namespace wiola {
namespace {

using namespace cuda_test;

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
    return std::vector<Vec>{r.out(f, n),  r.out(fr, n),  r.out(dp, n),  r.out(da, n),  r.out(db, n),  r.out(g, n),
                            r.out(gp, n), r.out(gx, n),  r.out(bl, n),  r.out(bs, n),  r.out(bc, n),  Vec{float(dph)},
                            r.out(fo, n), r.out(fog, n), r.out(fdp, n), r.out(fds, n), r.out(fdc, n), Vec{float(fdph)}};
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
    return std::vector<Vec>{r.out(p, n), r.out(m, n), r.out(v, n), Vec{float(h[0]), float(h[1])},
                            r.out(w, n), r.out(g, n)};
  });
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
    cases.push_back(
        {"add" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6, [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
           o.add(p[0], p[1], p[2], n);
         }});
    cases.push_back({"axpy" + s, {{t, In}, {t, InOut}}, 2e-6, [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.axpy(0.75f, p[0], p[1], n);
                     }});
    cases.push_back({"scale" + s, {{t, InOut}}, 2e-6, [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.scale(p[0], -1.25f, n);
                     }});
    cases.push_back(
        {"accumulate" + s,
         {{DType::F64, In}, {t, InOut}},
         2e-6,
         [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.accumulate(p[0].as<double>(), p[1], n); }});
    cases.push_back(
        {"swiglu_fwd" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6, [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
           o.swiglu_fwd(p[0], p[1], n, p[2]);
         }});
    cases.push_back(
        {"swiglu_bwd" + s,
         {{t, In}, {t, In}, {t, In}, {t, Out}, {t, Out}},
         2e-6,
         [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.swiglu_bwd(p[0], p[1], p[2], n, p[3], p[4]); }});
    cases.push_back({"gelu_fwd" + s, {{t, In}, {t, Out}}, 2e-6, [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.gelu_fwd(p[0], n, p[1]);
                     }});
    cases.push_back(
        {"gelu_bwd" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6, [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
           o.gelu_bwd(p[0], p[1], n, p[2]);
         }});
    cases.push_back(
        {"sigmoid_gate_fwd" + s,
         {{t, In}, {t, In}, {t, Out}},
         2e-6,
         [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.sigmoid_gate_fwd(p[0], p[1], n, p[2]); }});
    cases.push_back({"sigmoid_gate_bwd" + s,
                     {{t, In}, {t, In}, {t, In}, {t, Out}, {t, Out}},
                     2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.sigmoid_gate_bwd(p[0], p[1], p[2], n, p[3], p[4]);
                     }});
    // phi: one fp32 scalar (the kernel's beta), not a mapped operand.
    cases.push_back(
        {"blend_fwd" + s, {{t, In}, {t, In}, {t, Out}}, 2e-6, [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
           Buffer<float> phi(o, 1);
           const float v = -0.7f;
           o.upload(phi.data(), &v, sizeof v);
           o.blend_fwd(p[0], p[1], phi.data(), n, p[2]);
         }});
    cases.push_back({"blend_gate_fwd" + s,
                     {{t, In}, {t, In}, {t, In}, {t, Out}, {t, Out}},
                     2e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       Buffer<float> phi(o, 1);
                       const float v = -0.7f;
                       o.upload(phi.data(), &v, sizeof v);
                       o.blend_gate_fwd(p[0], p[1], phi.data(), p[2], n, p[3], p[4]);
                     }});
    // AdamW writing the weight copy (of type t) and zeroing the gradient.
    cases.push_back({"adamw+copy" + s,
                     {{F, InOut}, {F, InOut}, {F, InOut}, {F, InOut, true}, {t, Out}},
                     1e-6,
                     [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                       o.adamw(p[0], p[1], p[2], p[3], n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, p[4], true);
                     }});
    for (DType d : {F, H}) {
      const std::string sd = s + (d == F ? "->f32" : "->bf16");
      cases.push_back(
          {"convert" + sd, {{t, In}, {d, Out}}, 2e-6, [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
             o.convert(p[0], p[1], n);
           }});
      // fusion: pre, a, b (and da, db, dpre) of type t, res / dout / out of type d.
      cases.push_back({"fusion_fwd" + sd,
                       {{t, In}, {t, In}, {t, In}, {d, Out}},
                       2e-6,
                       [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                         o.fusion_fwd(p[0], p[1], p[2], nullptr, n, p[3]);
                       }});
      cases.push_back(
          {"fusion_fwd+res" + sd,
           {{t, In}, {t, In}, {t, In}, {d, In}, {d, Out}},
           2e-6,
           [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) { o.fusion_fwd(p[0], p[1], p[2], p[3], n, p[4]); }});
      cases.push_back({"fusion_bwd" + sd,
                       {{t, In}, {t, In}, {t, In}, {d, In}, {t, Out}, {t, Out}, {t, Out}},
                       2e-6,
                       [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                         o.fusion_bwd(p[0], p[1], p[2], p[3], n, p[4], p[5], p[6]);
                       }});
    }
  }
  cases.push_back({"adamw",
                   {{F, InOut}, {F, In}, {F, InOut}, {F, InOut, true}},
                   1e-6,
                   [](Ops<float>& o, const std::vector<Ptr>& p, size_t n) {
                     o.adamw(p[0], p[1], p[2], p[3], n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, nullptr, false);
                   }});
  cases.push_back({"adamw+zero",
                   {{F, InOut}, {F, InOut}, {F, InOut}, {F, InOut, true}},
                   1e-6,
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

}  // namespace
}  // namespace wiola
