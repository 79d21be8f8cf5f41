// wiola_kernel_bench's memory section: the memory-bound ops of the step
// (norms, a residual add, DSFF activations, SRPE with the Q|K|V|gate split,
// AdamW over the parameters, the fp32 -> bf16 weight refresh) in GB/s of the
// bytes each must read and write.
#include <cstdio>
#include <string>

#include "bench/kernel_bench.h"

namespace kernel_bench {

void run_memory(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  const size_t N = size_t(sh.N()), d = size_t(sh.cfg.d), nd = N * d;
  const size_t nA = N * size_t(sh.cfg.dA), nB = N * size_t(sh.cfg.dB);
  const size_t P = size_t(sh.cfg.param_count());
  auto report = [&](const std::string& name, const std::string& what, const std::string& bytes_rule, double bytes,
                    const std::function<void()>& f) {
    json j{{"section", "memory"},     {"name", name}, {"what", what}, {"bytes", bytes}, {"bytes_rule", bytes_rule},
           {"peak_gbps", o.peak_gbps}};
    const Rated r = time_rated(g, o, j, kGbps, bytes, o.peak_gbps, f);
    rep.emit(j);
    std::printf("memory %-18s %-36s: %s\n", name.c_str(), what.c_str(), r.line.c_str());
  };
  const std::string rows = "[" + std::to_string(N) + ", " + std::to_string(d) + "]";
  {
    // The norms (model/layer.cpp): ln1 fp32 -> fp32 (X-tilde stays fp32),
    // ln2 fused with the residual add, fp32 in -> bf16 out; backward all fp32.
    Buffer<float> x(g, nd), x2(g, nd), s(g, nd), dy(g, nd), dx(g, nd), y32(g, nd), gamma(g, d), delta(g, d),
        dgamma(g, d), ddelta(g, d), rstd(g, N);
    DynBuffer<float> y16(g, DType::BF16, nd);
    fill(g, x.data(), nd, 21);
    fill(g, x2.data(), nd, 22);
    fill(g, dy.data(), nd, 23);
    fill(g, gamma.data(), d, 24, true);
    fill(g, delta.data(), d, 25);
    g.zero(dgamma.data(), dgamma.bytes());
    g.zero(ddelta.data(), ddelta.bytes());
    const double eps = sh.cfg.eps, D = double(nd);
    report("rmsnorm_fwd", rows + " f32 -> f32", "read x 4 + write y 4 B/elem (+ rstd)", D * 8 + 4.0 * N, [&] {
      g.rmsnorm_fwd(x.data(), gamma.data(), delta.data(), int(N), int(d), eps, y32.data(), rstd.data(), nullptr);
    });
    report("add_rmsnorm_fwd", rows + " f32 + f32 -> f32, bf16", "read a, b 4+4 + write s 4, y 2 B/elem (+ rstd)",
           D * 14 + 4.0 * N, [&] {
             g.add_rmsnorm_fwd(x.data(), x2.data(), s.data(), gamma.data(), delta.data(), int(N), int(d), eps,
                               y16.data(), rstd.data(), nullptr);
           });
    report("rmsnorm_bwd", rows + " f32",
           "read x, dy, dres 4+4+4 + write dx 4 B/elem (+ rstd; the minimum: "
           "the kernel reads x and dy again for dgamma, ddelta)",
           D * 16 + 4.0 * N, [&] {
             g.rmsnorm_bwd(x.data(), gamma.data(), delta.data(), rstd.data(), dy.data(), int(N), int(d), x2.data(),
                           dx.data(), dgamma.data(), ddelta.data());
           });
    report("add", rows + " f32", "read a, b 4+4 + write 4 B/elem", D * 12,
           [&] { g.add(x.data(), x2.data(), s.data(), nd); });
  }
  {
    // DSFF activations in bf16.
    DynBuffer<float> ga(g, DType::BF16, nA), ua(g, DType::BF16, nA), ha(g, DType::BF16, nA);
    fill(g, ga.data(), nA, 31);
    fill(g, ua.data(), nA, 32);
    report("swiglu_fwd", "[" + std::to_string(N) + ", " + std::to_string(sh.cfg.dA) + "] bf16",
           "read g, u 2+2 + write h 2 B/elem", double(nA) * 6,
           [&] { g.swiglu_fwd(ga.data(), ua.data(), nA, ha.data()); });
  }
  {
    DynBuffer<float> ub(g, DType::BF16, nB), hb(g, DType::BF16, nB);
    fill(g, ub.data(), nB, 33);
    report("gelu_fwd", "[" + std::to_string(N) + ", " + std::to_string(sh.cfg.dB) + "] bf16",
           "read x 2 + write y 2 B/elem", double(nB) * 4, [&] { g.gelu_fwd(ub.data(), nB, hb.data()); });
  }
  {
    // SRPE fused with the split of the fused Q|K|V|gate projection output, and its backward (the
    // gradients joined), in bf16: rows read once, q, k (rotated), v, gate written once (small table).
    const int H = sh.cfg.H, Hkv = sh.cfg.Hkv, dh = sh.dh();
    const size_t hd = size_t(H) * dh, kvd = size_t(Hkv) * dh, width = 2 * hd + 2 * kvd, nw = N * width;
    DynBuffer<float> proj(g, DType::BF16, nw), q(g, DType::BF16, N * hd), k(g, DType::BF16, N * kvd),
        v(g, DType::BF16, N * kvd), gate(g, DType::BF16, N * hd);
    Buffer<float> table(g, size_t(sh.T) * dh);
    fill(g, proj.data(), nw, 34);
    fill(g, table.data(), size_t(sh.T) * dh, 35);
    const std::string what = "[" + std::to_string(N) + ", " + std::to_string(width) + "] bf16";
    report("srpe_split_fwd", what, "read 2 + write 2 B/elem (+ the table)", double(nw) * 4, [&] {
      g.srpe_split_fwd(proj.data(), sh.B, sh.T, H, Hkv, dh, table.data(), nullptr, q.data(), k.data(), v.data(),
                       gate.data());
    });
    report("srpe_split_bwd", what, "read 2 + write 2 B/elem (+ the table)", double(nw) * 4, [&] {
      g.srpe_split_bwd(q.data(), k.data(), v.data(), gate.data(), sh.B, sh.T, H, Hkv, dh, table.data(), nullptr,
                       proj.data());
    });
  }
  {
    // The optimizer over every parameter (fp32 p, g, m, v) and the weight
    // copy's refresh after it (fp32 -> bf16).
    Buffer<float> p(g, P), gr(g, P), m(g, P), v(g, P);
    DynBuffer<float> w(g, DType::BF16, P);
    fill(g, p.data(), P, 41);
    fill(g, gr.data(), P, 42);
    fill(g, m.data(), P, 43);
    fill(g, v.data(), P, 44, true);
    const std::string params = std::to_string(P) + " params (" + sh.cfg.name + ")";
    int t = 0;
    report("adamw", params + " f32", "read p, g, m, v 16 + write p, m, v 12 B/param", double(P) * 28, [&] {
      ++t;
      g.adamw(p.data(), gr.data(), m.data(), v.data(), P, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1 - std::pow(0.9, t),
              1 - std::pow(0.95, t), nullptr, false);
    });
    report("convert f32->bf16", params, "read 4 + write 2 B/elem", double(P) * 6,
           [&] { g.convert(p.data(), w.data(), P); });
  }
}

}  // namespace kernel_bench
