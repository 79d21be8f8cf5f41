// ATM on the GPU: neighbour similarity (sums in double), the plan
// (kernels/atm_plan.h, one thread per sequence, each document planned alone)
// and the merged rows, forward and backward.
#include <cstdint>

#include "kernels/atm_plan.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace wiola::cuda {
namespace {

// One block per neighbour pair (b, t), t < Tn-1; sums in double.
template <class E>
__global__ void k_atm_similarity(const E* x, int Tn, int d, double* rho) {
  const int b = blockIdx.y, t = blockIdx.x;
  const E* a = x + (size_t(b) * Tn + t) * d;
  const E* c = a + d;
  double s = 0, na = 0, nb = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const double u = ld(a + j), v = ld(c + j);
    s += u * v;
    na += u * u;
    nb += v * v;
  }
  s = block_sum(s);
  na = block_sum(na);
  nb = block_sum(nb);
  if (threadIdx.x == 0) {
    const double n0 = sqrt(na), n1 = sqrt(nb);
    rho[size_t(b) * (Tn - 1) + t] = (n0 > 0 && n1 > 0) ? s / (n0 * n1) : 0.0;
  }
}
// doc_start (may be null: one document per sequence): no pair crosses a
// document's start (atm_greedy_row).
__global__ void k_atm_plan(const double* rho, int B, int Tn, double tau, const int32_t* doc_start, uint8_t* open,
                           int32_t* group_first, int32_t* key_end, int32_t* n_groups) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  uint8_t* ob = open + size_t(b) * Tn;
  atm_greedy_row(rho + size_t(b) * (Tn - 1), Tn, tau, ob, doc_start ? doc_start + size_t(b) * Tn : nullptr);
  n_groups[b] = atm_layout_row(ob, Tn, group_first + size_t(b) * Tn, key_end + size_t(b) * Tn);
}
template <class E>
__global__ void k_atm_merge_rows(const E* x, int B, int Tn, int w, const int32_t* gf, const int32_t* ke,
                                 const int32_t* ng, E* out) {
  const size_t n = size_t(B) * Tn * w;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / w;
    const int c = int(i % w), b = int(r / Tn), j = int(r % Tn);
    if (j >= ng[b]) {
      st(out + i, 0.f);
      continue;
    }
    const int f = gf[r], e = ke[r];
    float s = 0.f;
    for (int t = f; t <= e; ++t) s += ld(x + (size_t(b) * Tn + t) * w + c);
    st(out + i, s / float(e - f + 1));
  }
}
template <class E>
__global__ void k_atm_merge_rows_bwd(const E* dout, int B, int Tn, int w, const int32_t* gf, const int32_t* ke,
                                     const int32_t* ng, E* dx) {
  const size_t n = size_t(B) * Tn * w;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / w;
    const int c = int(i % w), b = int(r / Tn), j = int(r % Tn);
    if (j >= ng[b]) continue;
    const int f = gf[r], e = ke[r];
    const float v = ld(dout + i) / float(e - f + 1);
    for (int t = f; t <= e; ++t) {  // each member row belongs to exactly one group
      E* p = dx + (size_t(b) * Tn + t) * w + c;
      st(p, ld(p) + v);
    }
  }
}

}  // namespace

void atm_similarity(Ctx c, CPtr x, int B, int Tn, int d, double* rho) {
  if (Tn < 2 || B <= 0) return;
  dispatch(x.dtype(), "atm_similarity", [&](auto e) {
    using E = decltype(e);
    k_atm_similarity<E><<<dim3(Tn - 1, B), kThreads, 0, c.s>>>(dev<E>(x), Tn, d, rho);
  });
  after_launch("atm_similarity");
}
void atm_plan(Ctx c, const double* rho, int B, int Tn, double tau, const int32_t* doc_start, uint8_t* open,
              int32_t* group_first, int32_t* key_end, int32_t* n_groups) {
  k_atm_plan<<<(B + 63) / 64, 64, 0, c.s>>>(rho, B, Tn, tau, doc_start, open, group_first, key_end, n_groups);
  after_launch("atm_plan");
}
void atm_merge_rows(Ctx c, CPtr x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                    const int32_t* n_groups, Ptr out) {
  dispatch(x.dtype(), "atm_merge_rows", [&](auto e) {
    using E = decltype(e);
    k_atm_merge_rows<E><<<grid_for(size_t(B) * Tn * w), kThreads, 0, c.s>>>(dev<E>(x), B, Tn, w, group_first, key_end,
                                                                            n_groups, dev<E>(out));
  });
  after_launch("atm_merge_rows");
}
void atm_merge_rows_bwd(Ctx c, CPtr dout, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                        const int32_t* n_groups, Ptr dx) {
  dispatch(dx.dtype(), "atm_merge_rows_bwd", [&](auto e) {
    using E = decltype(e);
    k_atm_merge_rows_bwd<E><<<grid_for(size_t(B) * Tn * w), kThreads, 0, c.s>>>(dev<E>(dout), B, Tn, w, group_first,
                                                                                key_end, n_groups, dev<E>(dx));
  });
  after_launch("atm_merge_rows_bwd");
}

}  // namespace wiola::cuda
