// Elementwise ops, deterministic reductions, dtype conversion and AdamW on
// the GPU (AdamW fused with the weight copy's refresh and the gradient's
// zeroing; the blend fused with the output gate). Elementwise math in fp32 (double where the reference formula
// needs it: AdamW, reductions); grid-stride loops. The flat per-element
// maps (every kernel but the reductions and blend_bwd, whose per-thread
// partial sums fix the order of its sum) run through vec_map (common.cuh):
// 16-byte loads and stores, the same per-element formula as element by
// element, so the same bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/scalar.h"

namespace wiola::cuda {
namespace {

#define GRID_LOOP(i, n) \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

__device__ __forceinline__ float sigm(float x) {
  const float e = __expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

template <class E>
__global__ void k_add(const E* a, const E* b, E* out, size_t n) {
  vec_map(n, [](float a, float b, float& o) { o = a + b; }, MapIn{a}, MapIn{b}, MapOut{out});
}
template <class E>
__global__ void k_axpy(float alpha, const E* x, E* y, size_t n) {
  vec_map(n, [alpha](float x, float& y) { y = y + alpha * x; }, MapIn{x}, MapInOut{y});
}
template <class E>
__global__ void k_scale(E* x, float s, size_t n) {
  vec_map(n, [s](float& x) { x = x * s; }, MapInOut{x});
}
template <class S, class D>
__global__ void k_convert(const S* s, D* d, size_t n) {
  vec_map(n, [](float s, float& d) { d = s; }, MapIn{s}, MapOut{d});
}
template <class E>
__global__ void k_accumulate(const double* x, E* y, size_t n) {
  vec_map(n, [](double x, float& y) { y = float(double(y) + x); }, MapIn{x}, MapInOut{y});
}

// Reductions: a fixed grid of blocks, each summing a fixed strided subset in
// double, then one block adds the partials in order: deterministic for a
// fixed n.
constexpr int kRedBlocks = 512;
template <class E, bool Square>
__global__ void k_reduce_partials(const E* x, size_t n, double* part) {
  double s = 0;
  GRID_LOOP(i, n) {
    const double v = double(ld(x + i));
    s += Square ? v * v : v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
// out[0] = scale * sum(part) (+ out[0] when add)
__global__ void k_reduce_finish(const double* part, int n, double* out, double scale, bool add) {
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = (add ? out[0] : 0.0) + scale * s;
}

int red_blocks(size_t n) { return std::min(kRedBlocks, grid_for(n)); }

template <bool Square>
void reduce_into(Ctx c, CPtr x, size_t n, double* acc, const char* op) {
  DeviceTemp part(c.mem, kRedBlocks * sizeof(double), op);
  const int nb = red_blocks(n);
  dispatch(x.dtype(), op, [&](auto e) {
    using E = decltype(e);
    k_reduce_partials<E, Square><<<nb, kThreads, 0, c.s>>>(dev<E>(x), n, part.as<double>());
  });
  k_reduce_finish<<<1, kThreads, 0, c.s>>>(part.as<double>(), nb, acc, 1.0, true);
  after_launch(op);
}

struct AdamHyper {
  double lr, beta1, beta2, eps, wd, bc1, bc2;
};
// AdamW on the fp32 master p and moments m, v, fused with what follows an
// update: w (W = void: none) gets the new p in its storage type, as
// k_convert would round it, and with ZeroGrad the gradient is zeroed once
// read (g is then read and written, otherwise only read).
template <class W, bool ZeroGrad>
__global__ void k_adamw(float* p, float* g, float* m, float* v, W* w, size_t n, AdamHyper h) {
  const auto update = [h](float& p, auto& g, float& m, float& v, auto&... w) {
    double pi = p, mi = m, vi = v;
    ref::adamw(pi, double(g), mi, vi, h.lr, h.beta1, h.beta2, h.eps, h.wd, h.bc1, h.bc2);
    p = float(pi);
    m = float(mi);
    v = float(vi);
    ((w = p), ...);
    if constexpr (ZeroGrad) g = 0.f;
  };
  const auto grad = [g] {
    if constexpr (ZeroGrad) return MapInOut{g};
    else return MapIn{static_cast<const float*>(g)};
  }();
  if constexpr (std::is_void_v<W>) vec_map(n, update, MapInOut{p}, grad, MapInOut{m}, MapInOut{v});
  else vec_map(n, update, MapInOut{p}, grad, MapInOut{m}, MapInOut{v}, MapOut{w});
}

template <class E>
__global__ void k_swiglu_fwd(const E* g, const E* u, size_t n, E* h) {
  vec_map(n, [](float gv, float uv, float& h) { h = gv * sigm(gv) * uv; }, MapIn{g}, MapIn{u}, MapOut{h});
}
template <class E>
__global__ void k_swiglu_bwd(const E* g, const E* u, const E* dh, size_t n, E* dg, E* du) {
  vec_map(
      n,
      [](float gv, float uv, float d, float& dg, float& du) {
        const float s = sigm(gv);
        dg = d * uv * s * (1.f + gv * (1.f - s));
        du = d * gv * s;
      },
      MapIn{g}, MapIn{u}, MapIn{dh}, MapOut{dg}, MapOut{du});
}
template <class E>
__global__ void k_gelu_fwd(const E* x, size_t n, E* y) {
  vec_map(
      n, [](float v, float& y) { y = 0.5f * v * (1.f + erff(v * 0.70710678118654752440f)); }, MapIn{x},
      MapOut{y});
}
template <class E>
__global__ void k_gelu_bwd(const E* x, const E* dy, size_t n, E* dx) {
  vec_map(
      n,
      [](float v, float dy, float& dx) {
        const float d = 0.5f * (1.f + erff(v * 0.70710678118654752440f)) +
                        v * 0.39894228040143267794f * __expf(-0.5f * v * v);
        dx = dy * d;
      },
      MapIn{x}, MapIn{dy}, MapOut{dx});
}
// out = res + F (res null: F), added in fp32 before out's one rounding.
template <class A, class R>
__global__ void k_fusion_fwd(const A* pre, const A* a, const A* b, const R* res, size_t n, R* out) {
  const auto F = [](float p, float a, float b) {
    const float s = sigm(p);
    return s * a + (1.f - s) * b;
  };
  // res is the same for every thread: one map or the other, never a null operand.
  if (res)
    vec_map(
        n, [&](float p, float a, float b, float r, float& o) { o = r + F(p, a, b); }, MapIn{pre}, MapIn{a},
        MapIn{b}, MapIn{res}, MapOut{out});
  else
    vec_map(n, [&](float p, float a, float b, float& o) { o = F(p, a, b); }, MapIn{pre}, MapIn{a}, MapIn{b},
            MapOut{out});
}
template <class A, class R>
__global__ void k_fusion_bwd(const A* pre, const A* a, const A* b, const R* dout, size_t n, A* dpre, A* da,
                             A* db) {
  vec_map(
      n,
      [](float p, float a, float b, float d, float& dp, float& da, float& db) {
        const float s = sigm(p), c = 1.f - s;
        dp = d * (a - b) * s * c;
        da = d * s;
        db = d * c;
      },
      MapIn{pre}, MapIn{a}, MapIn{b}, MapIn{dout}, MapOut{dpre}, MapOut{da}, MapOut{db});
}
// One element of the output gate and of the blend, forward and backward:
// the unfused kernels and the fused blend + gate share them (the same bits).
__device__ __forceinline__ float gate_fwd(float p, float x) { return sigm(p) * x; }
__device__ __forceinline__ void gate_bwd(float p, float x, float d, float& dp, float& dx) {
  const float s = sigm(p);
  dp = d * x * s * (1.f - s);
  dx = d * s;
}
__device__ __forceinline__ float blend_beta(const float* phi) { return float(ref::sigmoid(double(phi[0]))); }
__device__ __forceinline__ float blend(float beta, float s, float c) { return (1.f - beta) * s + beta * c; }
// d_self, d_ctx of element i from its dout d; returns its term of the dL/dφ sum.
template <class E>
__device__ __forceinline__ double blend_bwd_at(float beta, float d, const E* os, const E* oc, size_t i, E* ds,
                                               E* dc) {
  st(ds + i, (1.f - beta) * d);
  st(dc + i, beta * d);
  return double(d) * (double(ld(oc + i)) - double(ld(os + i)));
}

template <class E>
__global__ void k_gate_fwd(const E* pre, const E* x, size_t n, E* out) {
  vec_map(n, [](float p, float x, float& o) { o = gate_fwd(p, x); }, MapIn{pre}, MapIn{x}, MapOut{out});
}
template <class E>
__global__ void k_gate_bwd(const E* pre, const E* x, const E* dout, size_t n, E* dpre, E* dx) {
  vec_map(
      n, [](float p, float x, float d, float& dp, float& dx) { gate_bwd(p, x, d, dp, dx); }, MapIn{pre}, MapIn{x},
      MapIn{dout}, MapOut{dpre}, MapOut{dx});
}
template <class E>
__global__ void k_blend_fwd(const E* os, const E* oc, const float* phi, size_t n, E* out) {
  const float beta = blend_beta(phi);
  vec_map(n, [beta](float s, float c, float& o) { o = blend(beta, s, c); }, MapIn{os}, MapIn{oc}, MapOut{out});
}
// d_self, d_ctx, and per-block partial sums of dout (o_ctx - o_self).
template <class E>
__global__ void k_blend_bwd(const E* os, const E* oc, const float* phi, const E* dout, size_t n, E* ds,
                            E* dc, double* part) {
  const float beta = blend_beta(phi);
  double s = 0;
  GRID_LOOP(i, n) s += blend_bwd_at(beta, ld(dout + i), os, oc, i, ds, dc);
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
// The blend, then the gate on o as stored (its one rounding), in one pass.
template <class E>
__global__ void k_blend_gate_fwd(const E* os, const E* oc, const float* phi, const E* pre, size_t n, E* o,
                                 E* og) {
  const float beta = blend_beta(phi);
  vec_map(
      n,
      [beta](float s, float c, float p, float& o, float& og) {
        o = blend(beta, s, c);
        og = gate_fwd(p, as_stored<E>(o));
      },
      MapIn{os}, MapIn{oc}, MapIn{pre}, MapOut{o}, MapOut{og});
}
// The gate's backward, then the blend's on dL/do as d_o would store it, in
// k_blend_bwd's order (its grid and loop: the same partial sums of dL/dφ).
template <class E>
__global__ void k_blend_gate_bwd(const E* os, const E* oc, const float* phi, const E* pre, const E* o,
                                 const E* dog, size_t n, E* dpre, E* ds, E* dc, double* part) {
  const float beta = blend_beta(phi);
  double s = 0;
  GRID_LOOP(i, n) {
    float dp, d_o;
    gate_bwd(ld(pre + i), ld(o + i), ld(dog + i), dp, d_o);
    st(dpre + i, dp);
    s += blend_bwd_at(beta, as_stored<E>(d_o), os, oc, i, ds, dc);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ void k_blend_finish(const double* part, int nb, const float* phi, double* dphi) {
  double s = 0;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const double b = ref::sigmoid(double(phi[0]));
    dphi[0] = s * b * (1.0 - b);
  }
}

}  // namespace

void add(Ctx c, CPtr a, CPtr b, Ptr out, size_t n) {
  dispatch(out.dtype(), "add", [&](auto e) {
    using E = decltype(e);
    // The grid is named first: the emulator's rewrite of a launch takes no '>' in its configuration.
    const int grid = map_grid<E>(n);
    k_add<E><<<grid, kThreads, 0, c.s>>>(dev<E>(a), dev<E>(b), dev<E>(out), n);
  });
  after_launch("add");
}
void axpy(Ctx c, float alpha, CPtr x, Ptr y, size_t n) {
  dispatch(y.dtype(), "axpy", [&](auto e) {
    using E = decltype(e);
    const int grid = map_grid<E>(n);
    k_axpy<E><<<grid, kThreads, 0, c.s>>>(alpha, dev<E>(x), dev<E>(y), n);
  });
  after_launch("axpy");
}
void scale(Ctx c, Ptr x, float s, size_t n) {
  dispatch(x.dtype(), "scale", [&](auto e) {
    using E = decltype(e);
    const int grid = map_grid<E>(n);
    k_scale<E><<<grid, kThreads, 0, c.s>>>(dev<E>(x), s, n);
  });
  after_launch("scale");
}
void sum_squares(Ctx c, CPtr x, size_t n, double* acc) { reduce_into<true>(c, x, n, acc, "sum_squares"); }
void sum(Ctx c, CPtr x, size_t n, double* acc) { reduce_into<false>(c, x, n, acc, "sum"); }
void accumulate(Ctx c, const double* x, Ptr y, size_t n) {
  dispatch(y.dtype(), "accumulate", [&](auto e) {
    using E = decltype(e);
    const int grid = map_grid<double, E>(n);
    k_accumulate<E><<<grid, kThreads, 0, c.s>>>(x, dev<E>(y), n);
  });
  after_launch("accumulate");
}
void convert(Ctx c, CPtr src, Ptr dst, size_t n) {
  dispatch(src.dtype(), "convert", [&](auto es) {
    dispatch(dst.dtype(), "convert", [&](auto ed) {
      using S = decltype(es);
      using D = decltype(ed);
      const int grid = map_grid<S, D>(n);
      k_convert<S, D><<<grid, kThreads, 0, c.s>>>(dev<S>(src), dev<D>(dst), n);
    });
  });
  after_launch("convert");
}
void adamw(Ctx c, Ptr p, Ptr g, Ptr m, Ptr v, size_t n, double lr, double beta1, double beta2, double eps,
           double wd, double bc1, double bc2, Ptr w, bool zero_grad) {
  const AdamHyper h{lr, beta1, beta2, eps, wd, bc1, bc2};
  // W: the weight copy's storage type (void: no copy).
  const auto launch = [&](auto* wp) {
    using W = std::remove_pointer_t<decltype(wp)>;
    const int grid = map_grid<float, std::conditional_t<std::is_void_v<W>, float, W>>(n);
    if (zero_grad)
      k_adamw<W, true><<<grid, kThreads, 0, c.s>>>(dev<float>(p), dev<float>(g), dev<float>(m), dev<float>(v), wp, n, h);
    else
      k_adamw<W, false><<<grid, kThreads, 0, c.s>>>(dev<float>(p), dev<float>(g), dev<float>(m), dev<float>(v), wp, n, h);
  };
  if (w) dispatch(w.dtype(), "adamw", [&](auto e) { launch(dev<decltype(e)>(w)); });
  else launch(static_cast<void*>(nullptr));
  after_launch("adamw");
}

// `launch` names `grid`: map_grid's blocks for storage E.
#define WIOLA_UNARY_A(NAME, op, launch)                     \
  dispatch(op.dtype(), NAME, [&](auto e) {                  \
    using E = decltype(e);                                  \
    const int grid = map_grid<E>(n);                        \
    launch;                                                 \
  });                                                       \
  after_launch(NAME)

void swiglu_fwd(Ctx c, CPtr g, CPtr u, size_t n, Ptr h) {
  WIOLA_UNARY_A("swiglu_fwd", h, (k_swiglu_fwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(g), dev<E>(u), n, dev<E>(h))));
}
void swiglu_bwd(Ctx c, CPtr g, CPtr u, CPtr dh, size_t n, Ptr dg, Ptr du) {
  WIOLA_UNARY_A("swiglu_bwd", dg, (k_swiglu_bwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(g), dev<E>(u), dev<E>(dh), n, dev<E>(dg), dev<E>(du))));
}
void gelu_fwd(Ctx c, CPtr x, size_t n, Ptr y) {
  WIOLA_UNARY_A("gelu_fwd", y, (k_gelu_fwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(x), n, dev<E>(y))));
}
void gelu_bwd(Ctx c, CPtr x, CPtr dy, size_t n, Ptr dx) {
  WIOLA_UNARY_A("gelu_bwd", dx, (k_gelu_bwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(x), dev<E>(dy), n, dev<E>(dx))));
}
void sigmoid_gate_fwd(Ctx c, CPtr pre, CPtr x, size_t n, Ptr out) {
  WIOLA_UNARY_A("sigmoid_gate_fwd", out, (k_gate_fwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(pre), dev<E>(x), n, dev<E>(out))));
}
void sigmoid_gate_bwd(Ctx c, CPtr pre, CPtr x, CPtr dout, size_t n, Ptr dpre, Ptr dx) {
  WIOLA_UNARY_A("sigmoid_gate_bwd", dx, (k_gate_bwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(pre), dev<E>(x), dev<E>(dout), n, dev<E>(dpre), dev<E>(dx))));
}
void blend_fwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out) {
  WIOLA_UNARY_A("blend_fwd", out, (k_blend_fwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(o_self), dev<E>(o_ctx), dev<float>(phi), n, dev<E>(out))));
}
void blend_bwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx,
               double* dphi) {
  DeviceTemp part(c.mem, kRedBlocks * sizeof(double), "blend_bwd");
  const int nb = red_blocks(n);
  dispatch(dout.dtype(), "blend_bwd", [&](auto e) {
    using E = decltype(e);
    k_blend_bwd<E><<<nb, kThreads, 0, c.s>>>(dev<E>(o_self), dev<E>(o_ctx), dev<float>(phi), dev<E>(dout), n,
                                             dev<E>(d_self), dev<E>(d_ctx), part.as<double>());
  });
  k_blend_finish<<<1, kThreads, 0, c.s>>>(part.as<double>(), nb, dev<float>(phi), dphi);
  after_launch("blend_bwd");
}
void blend_gate_fwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, size_t n, Ptr o, Ptr og) {
  WIOLA_UNARY_A("blend_gate_fwd", og,
                (k_blend_gate_fwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(o_self), dev<E>(o_ctx), dev<float>(phi),
                                                                 dev<E>(pre), n, dev<E>(o), dev<E>(og))));
}
void blend_gate_bwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, CPtr o, CPtr dog, size_t n, Ptr dpre,
                    Ptr d_self, Ptr d_ctx, double* dphi) {
  DeviceTemp part(c.mem, kRedBlocks * sizeof(double), "blend_gate_bwd");
  const int nb = red_blocks(n);
  dispatch(dog.dtype(), "blend_gate_bwd", [&](auto e) {
    using E = decltype(e);
    k_blend_gate_bwd<E><<<nb, kThreads, 0, c.s>>>(dev<E>(o_self), dev<E>(o_ctx), dev<float>(phi), dev<E>(pre),
                                                  dev<E>(o), dev<E>(dog), n, dev<E>(dpre), dev<E>(d_self),
                                                  dev<E>(d_ctx), part.as<double>());
  });
  k_blend_finish<<<1, kThreads, 0, c.s>>>(part.as<double>(), nb, dev<float>(phi), dphi);
  after_launch("blend_gate_bwd");
}
void fusion_fwd(Ctx c, CPtr pre, CPtr a, CPtr b, CPtr res, size_t n, Ptr out) {
  dispatch(a.dtype(), "fusion_fwd", [&](auto ea) {
    dispatch(out.dtype(), "fusion_fwd", [&](auto er) {
      using A = decltype(ea);
      using R = decltype(er);
      const int grid = map_grid<A, R>(n);
      k_fusion_fwd<A, R><<<grid, kThreads, 0, c.s>>>(dev<A>(pre), dev<A>(a), dev<A>(b), dev<R>(res), n,
                                                            dev<R>(out));
    });
  });
  after_launch("fusion_fwd");
}
void fusion_bwd(Ctx c, CPtr pre, CPtr a, CPtr b, CPtr dout, size_t n, Ptr dpre, Ptr da, Ptr db) {
  dispatch(a.dtype(), "fusion_bwd", [&](auto ea) {
    dispatch(dout.dtype(), "fusion_bwd", [&](auto er) {
      using A = decltype(ea);
      using R = decltype(er);
      const int grid = map_grid<A, R>(n);
      k_fusion_bwd<A, R><<<grid, kThreads, 0, c.s>>>(dev<A>(pre), dev<A>(a), dev<A>(b), dev<R>(dout), n,
                                                           dev<A>(dpre), dev<A>(da), dev<A>(db));
    });
  });
  after_launch("fusion_bwd");
}

}  // namespace wiola::cuda
