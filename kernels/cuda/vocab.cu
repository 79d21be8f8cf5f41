// The vocab-parallel embedding and the three-phase cross-entropy on the GPU.
// The embedding's backward sums the rows of equal ids in token order (a
// stable sort, no atomics); the cross-entropy takes one block per row, its
// statistics in fp32; a negative target (masked) adds no loss or gradient.
#include <cub/cub.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace wiola::cuda {
namespace {

// ---- embedding -----------------------------------------------------------------------
template <class W, class R>
__global__ void k_embedding_fwd(const int32_t* ids, int N, const W* E, int v0, int V, int d, R* out) {
  const size_t n = size_t(N) * d;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / d;
    const int j = int(i % d);
    const int id = ids[row] - v0;
    st(out + i, (id >= 0 && id < V) ? ld(E + size_t(id) * d + j) : 0.f);
  }
}
__global__ void k_embedding_bwd_iota(int32_t* v, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = i;
}
// One block per sorted position that starts a run of equal ids: the run's
// rows of dout are summed in token order (the sort is stable) and added once.
template <class R>
__global__ void k_embedding_bwd_runs(const int32_t* sid, const int32_t* sidx, int N, const R* dout, int v0, int V,
                                     int d, float* dE) {
  const int i = blockIdx.x;
  if (i > 0 && sid[i] == sid[i - 1]) return;
  const int id = sid[i] - v0;
  if (id < 0 || id >= V) return;
  int end = i + 1;
  while (end < N && sid[end] == sid[i]) ++end;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0.f;
    for (int t = i; t < end; ++t) acc += ld(dout + size_t(sidx[t]) * d + j);
    dE[size_t(id) * d + j] += acc;
  }
}

// ---- cross-entropy -----------------------------------------------------------------------
template <class A>
__global__ void k_ce_row_max(const A* logits, int V, float* row_max) {
  const size_t row = blockIdx.x;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, ld(logits + row * V + j));
  m = block_max(m);
  if (threadIdx.x == 0) row_max[row] = m;
}
template <class A>
__global__ void k_ce_sumexp_target(const A* logits, const int32_t* targets, int V, int v0, const float* row_max,
                                   float* sumexp, float* tgt) {
  const size_t row = blockIdx.x;
  const float m = row_max[row];
  float s = 0.f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += __expf(ld(logits + row * V + j) - m);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    sumexp[row] = s;
    const int t = targets[row] - v0;
    tgt[row] = (t >= 0 && t < V) ? ld(logits + row * V + t) : 0.f;
  }
}
// A negative target is a masked position (documents: an EOS's target,
// docs/model.md §2): loss 0, and with Grad a zero gradient row.
template <class A, bool Grad>
__global__ void k_ce_loss(A* logits, const int32_t* targets, int V, int v0, const float* row_max, const float* sumexp,
                          const float* tgt, float scale, float* loss) {
  const size_t row = blockIdx.x;
  const float m = row_max[row], se = sumexp[row];
  const bool masked = targets[row] < 0;
  if (threadIdx.x == 0) loss[row] = masked ? 0.f : logf(se) + m - tgt[row];
  if (!Grad) return;
  if (masked) {
    for (int j = threadIdx.x; j < V; j += blockDim.x) st(logits + row * V + j, 0.f);
    return;
  }
  const float inv = 1.f / se;
  const int t = targets[row] - v0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    A* p = logits + row * V + j;
    const float sm = __expf(ld(p) - m) * inv;
    st(p, scale * (sm - (j == t ? 1.f : 0.f)));
  }
}

// ce_loss_grad with z-loss: lse = log(sumexp) + row_max, zloss = z lse^2,
// the gradient scale * ((1 + 2 z lse) softmax - onehot); a masked target
// (negative) gives zeros.
template <class A>
__global__ void k_ce_loss_grad_z(A* logits, const int32_t* targets, int V, int v0, const float* row_max,
                                 const float* sumexp, const float* tgt, float scale, float z, float* loss,
                                 float* zloss) {
  const size_t row = blockIdx.x;
  if (targets[row] < 0) {
    if (threadIdx.x == 0) loss[row] = zloss[row] = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) st(logits + row * V + j, 0.f);
    return;
  }
  const float m = row_max[row], se = sumexp[row], lse = logf(se) + m;
  if (threadIdx.x == 0) {
    loss[row] = lse - tgt[row];
    zloss[row] = z * lse * lse;
  }
  const float f = (1.f + 2.f * z * lse) / se;
  const int t = targets[row] - v0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    A* p = logits + row * V + j;
    st(p, scale * (__expf(ld(p) - m) * f - (j == t ? 1.f : 0.f)));
  }
}

}  // namespace

void embedding_fwd(Ctx c, const int32_t* ids, int N, CPtr E, int v0, int V_local, int d, Ptr out) {
  dispatch(E.dtype(), "embedding_fwd", [&](auto ew) {
    dispatch(out.dtype(), "embedding_fwd", [&](auto er) {
      using W = decltype(ew);
      using R = decltype(er);
      k_embedding_fwd<W, R>
          <<<grid_for(size_t(N) * d), kThreads, 0, c.s>>>(ids, N, dev<W>(E), v0, V_local, d, dev<R>(out));
    });
  });
  after_launch("embedding_fwd");
}

void embedding_bwd(Ctx c, const int32_t* ids, int N, CPtr dout, int v0, int V_local, int d, Ptr dE) {
  if (N <= 0) return;
  // Stable sort of (id, token index): equal ids become runs in token order.
  DeviceTemp idx(c.mem, size_t(N) * 4, "embedding_bwd"), sid(c.mem, size_t(N) * 4, "embedding_bwd"),
      sidx(c.mem, size_t(N) * 4, "embedding_bwd");
  k_embedding_bwd_iota<<<(N + 255) / 256, 256, 0, c.s>>>(idx.as<int32_t>(), N);
  size_t tmp_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, tmp_bytes, ids, sid.as<int32_t>(), idx.as<int32_t>(),
                                        sidx.as<int32_t>(), N, 0, 32, c.s),
        "embedding_bwd sort (size)");
  DeviceTemp tmp(c.mem, tmp_bytes, "embedding_bwd sort");
  check(cub::DeviceRadixSort::SortPairs(tmp.as<void>(), tmp_bytes, ids, sid.as<int32_t>(), idx.as<int32_t>(),
                                        sidx.as<int32_t>(), N, 0, 32, c.s),
        "embedding_bwd sort");
  dispatch(dout.dtype(), "embedding_bwd", [&](auto er) {
    using R = decltype(er);
    k_embedding_bwd_runs<R><<<N, kThreads, 0, c.s>>>(sid.as<int32_t>(), sidx.as<int32_t>(), N, dev<R>(dout), v0,
                                                     V_local, d, dev<float>(dE));
  });
  after_launch("embedding_bwd");
}

void ce_row_max(Ctx c, CPtr logits, int N, int V_local, Ptr row_max) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_row_max", [&](auto e) {
    using A = decltype(e);
    k_ce_row_max<A><<<N, kThreads, 0, c.s>>>(dev<A>(logits), V_local, dev<float>(row_max));
  });
  after_launch("ce_row_max");
}
void ce_sumexp_target(Ctx c, CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, Ptr sumexp,
                      Ptr tgt) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_sumexp_target", [&](auto e) {
    using A = decltype(e);
    k_ce_sumexp_target<A><<<N, kThreads, 0, c.s>>>(dev<A>(logits), targets, V_local, v0, dev<float>(row_max),
                                                   dev<float>(sumexp), dev<float>(tgt));
  });
  after_launch("ce_sumexp_target");
}
void ce_loss_grad(Ctx c, Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp,
                  CPtr tgt, double scale, Ptr loss) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_loss_grad", [&](auto e) {
    using A = decltype(e);
    k_ce_loss<A, true><<<N, kThreads, 0, c.s>>>(dev<A>(logits), targets, V_local, v0, dev<float>(row_max),
                                                dev<float>(sumexp), dev<float>(tgt), float(scale), dev<float>(loss));
  });
  after_launch("ce_loss_grad");
}
void ce_loss_grad_z(Ctx c, Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp,
                    CPtr tgt, double scale, double z, Ptr loss, Ptr zloss) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_loss_grad_z", [&](auto e) {
    using A = decltype(e);
    k_ce_loss_grad_z<A><<<N, kThreads, 0, c.s>>>(dev<A>(logits), targets, V_local, v0, dev<float>(row_max),
                                                 dev<float>(sumexp), dev<float>(tgt), float(scale), float(z),
                                                 dev<float>(loss), dev<float>(zloss));
  });
  after_launch("ce_loss_grad_z");
}
void ce_loss(Ctx c, CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp,
             CPtr tgt, Ptr loss) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_loss", [&](auto e) {
    using A = decltype(e);
    k_ce_loss<A, false><<<N, kThreads, 0, c.s>>>(const_cast<A*>(dev<A>(logits)), targets, V_local, v0,
                                                 dev<float>(row_max), dev<float>(sumexp), dev<float>(tgt), 0.f,
                                                 dev<float>(loss));
  });
  after_launch("ce_loss");
}

}  // namespace wiola::cuda
