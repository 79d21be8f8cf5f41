// DSFF pieces on the GPU: SwiGLU and GELU, and the stream fusion
// out = res + sigma(pre) a + (1 - sigma(pre)) b (fused with the residual
// add), forward and backward. Math in fp32; flat per-element maps through
// vec_map (common.cuh): 16-byte loads and stores, the same per-element
// formula as element by element, so the same bits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace wiola::cuda {
namespace {

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

}  // namespace

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
