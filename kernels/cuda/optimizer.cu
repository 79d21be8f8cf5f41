// AdamW on the GPU, fused with the weight copy's refresh and the gradient's
// zeroing. The update in double (the reference formula, kernels/scalar.h);
// a flat per-element map through vec_map (common.cuh): 16-byte loads and
// stores, the same per-element formula as element by element, so the same
// bits.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/scalar.h"

namespace wiola::cuda {
namespace {

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

}  // namespace

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

}  // namespace wiola::cuda
