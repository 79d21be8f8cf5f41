// Row-wise ops on the GPU: WiolaRMSNorm, the vocab-parallel embedding and
// the three-phase cross-entropy. One block per row; row statistics in double
// (norm) or fp32 (softmax); parameter gradients reduced over rows in a fixed
// order (no atomics).
#include <cub/cub.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace wiola::cuda {
namespace {

// ---- WiolaRMSNorm ----------------------------------------------------------------
// b null: the norm of x. Otherwise first the residual add sum = x + b (sum
// may be x or b: each element is read and written by one thread), written
// out as the add op would, and the norm of what was written. y_op (may be
// null): y again in storage O, as convert(y, y_op) would round it.
template <class R, class A, class O>
__global__ void k_rms_fwd(const R* x, const R* b, R* sum, const float* gamma, const float* delta, int d,
                          double eps, A* y, float* rstd, O* y_op) {
  const size_t row = blockIdx.x;
  const R* xr = x + row * d;
  if (b) {
    for (int j = threadIdx.x; j < d; j += blockDim.x) st(sum + row * d + j, ld(xr + j) + ld(b + row * d + j));
    xr = sum + row * d;
  }
  double s = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const double z = double(ld(xr + j)) + double(delta[j]);
    s += z * z;
  }
  s = block_sum(s);
  const double r = 1.0 / sqrt(s / d + eps);
  if (threadIdx.x == 0) rstd[row] = float(r);
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = float(double(gamma[j]) * (double(ld(xr + j)) + double(delta[j])) * r);
    st(y + row * d + j, v);
    if (y_op) st(y_op + row * d + j, as_stored<A>(v));
  }
}

// dz_j = r γ_j dy_j - c z_j with c = (r³/d) Σ_k γ_k dy_k z_k; dx = dres + dz
// (dres may be dx, or null: dx = dz). The row constant c goes to crow for the column reduction.
template <class R, class A>
__global__ void k_rms_bwd_dx(const R* x, const float* gamma, const float* delta, const float* rstd,
                             const A* dy, int d, const R* dres, R* dx, float* crow) {
  const size_t row = blockIdx.x;
  const double r = rstd[row];
  double s = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const double z = double(ld(x + row * d + j)) + double(delta[j]);
    s += double(gamma[j]) * double(ld(dy + row * d + j)) * z;
  }
  s = block_sum(s);
  const double cc = r * r * r * s / d;
  if (threadIdx.x == 0) crow[row] = float(cc);
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const double z = double(ld(x + row * d + j)) + double(delta[j]);
    const double dz = r * double(gamma[j]) * double(ld(dy + row * d + j)) - cc * z;
    st(dx + row * d + j, float(dres ? double(ld(dres + row * d + j)) + dz : dz));
  }
}
// Partial column sums over a chunk of rows: dgamma (dy z r) and ddelta (dz).
constexpr int kRowChunk = 256;
template <class R, class A>
__global__ void k_rms_bwd_cols(const R* x, const float* gamma, const float* delta, const float* rstd,
                               const A* dy, const float* crow, int N, int d, float* pg, float* pd) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (j >= d) return;
  double sg = 0, sd = 0;
  const int r0 = chunk * kRowChunk, r1 = min(N, r0 + kRowChunk);
  for (int row = r0; row < r1; ++row) {
    const double r = rstd[row];
    const double z = double(ld(x + size_t(row) * d + j)) + double(delta[j]);
    const double g = double(ld(dy + size_t(row) * d + j));
    sg += g * z * r;
    sd += r * double(gamma[j]) * g - double(crow[row]) * z;
  }
  pg[size_t(chunk) * d + j] = float(sg);
  pd[size_t(chunk) * d + j] = float(sd);
}
__global__ void k_rms_bwd_finish(const float* pg, const float* pd, int chunks, int d, float* dgamma,
                                 float* ddelta) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  double sg = 0, sd = 0;
  for (int c = 0; c < chunks; ++c) {
    sg += pg[size_t(c) * d + j];
    sd += pd[size_t(c) * d + j];
  }
  dgamma[j] += float(sg);
  ddelta[j] += float(sd);
}

// ---- embedding -----------------------------------------------------------------------
template <class W, class R>
__global__ void k_embed_fwd(const int32_t* ids, int N, const W* E, int v0, int V, int d, R* out) {
  const size_t n = size_t(N) * d;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / d;
    const int j = int(i % d);
    const int id = ids[row] - v0;
    st(out + i, (id >= 0 && id < V) ? ld(E + size_t(id) * d + j) : 0.f);
  }
}
__global__ void k_iota(int32_t* v, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = i;
}
// One block per sorted position that starts a run of equal ids: the run's
// rows of dout are summed in token order (the sort is stable) and added once.
template <class R>
__global__ void k_embed_bwd_runs(const int32_t* sid, const int32_t* sidx, int N, const R* dout, int v0, int V,
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
__global__ void k_ce_max(const A* logits, int V, float* row_max) {
  const size_t row = blockIdx.x;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, ld(logits + row * V + j));
  m = block_max(m);
  if (threadIdx.x == 0) row_max[row] = m;
}
template <class A>
__global__ void k_ce_sumexp(const A* logits, const int32_t* targets, int V, int v0, const float* row_max,
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
template <class A, bool Grad>
__global__ void k_ce_loss(A* logits, const int32_t* targets, int V, int v0, const float* row_max,
                          const float* sumexp, const float* tgt, float scale, float* loss) {
  const size_t row = blockIdx.x;
  const float m = row_max[row], se = sumexp[row];
  if (threadIdx.x == 0) loss[row] = logf(se) + m - tgt[row];
  if (!Grad) return;
  const float inv = 1.f / se;
  const int t = targets[row] - v0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    A* p = logits + row * V + j;
    const float sm = __expf(ld(p) - m) * inv;
    st(p, scale * (sm - (j == t ? 1.f : 0.f)));
  }
}

}  // namespace

void add_rmsnorm_fwd(Ctx c, CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y,
                     Ptr rstd, Ptr y_op) {
  if (N <= 0) return;
  const char* op = b ? "add_rmsnorm_fwd" : "rmsnorm_fwd";
  dispatch(a.dtype(), op, [&](auto er) {
    dispatch(y.dtype(), op, [&](auto ea) {
      dispatch(y_op ? y_op.dtype() : y.dtype(), op, [&](auto eo) {
        using R = decltype(er);
        using A = decltype(ea);
        using O = decltype(eo);
        k_rms_fwd<R, A, O><<<N, kThreads, 0, c.s>>>(dev<R>(a), dev<R>(b), dev<R>(s), dev<float>(gamma),
                                                    dev<float>(delta), d, eps, dev<A>(y), dev<float>(rstd),
                                                    dev<O>(y_op));
      });
    });
  });
  after_launch(op);
}

void rmsnorm_fwd(Ctx c, CPtr x, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd, Ptr y_op) {
  add_rmsnorm_fwd(c, x, nullptr, nullptr, gamma, delta, N, d, eps, y, rstd, y_op);
}

void rmsnorm_bwd(Ctx c, CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres, Ptr dx,
                 Ptr dgamma, Ptr ddelta) {
  if (N <= 0) return;
  const int chunks = (N + kRowChunk - 1) / kRowChunk;
  DeviceTemp crow(c.mem, size_t(N) * sizeof(float), "rmsnorm_bwd row constants");
  DeviceTemp pg(c.mem, size_t(chunks) * d * sizeof(float), "rmsnorm_bwd partials");
  DeviceTemp pd(c.mem, size_t(chunks) * d * sizeof(float), "rmsnorm_bwd partials");
  dispatch(x.dtype(), "rmsnorm_bwd", [&](auto er) {
    dispatch(dy.dtype(), "rmsnorm_bwd", [&](auto ea) {
      using R = decltype(er);
      using A = decltype(ea);
      k_rms_bwd_dx<R, A><<<N, kThreads, 0, c.s>>>(dev<R>(x), dev<float>(gamma), dev<float>(delta),
                                                  dev<float>(rstd), dev<A>(dy), d, dev<R>(dres), dev<R>(dx),
                                                  crow.as<float>());
      const dim3 grid((d + 127) / 128, chunks);
      k_rms_bwd_cols<R, A><<<grid, 128, 0, c.s>>>(dev<R>(x), dev<float>(gamma), dev<float>(delta),
                                                  dev<float>(rstd), dev<A>(dy), crow.as<float>(), N, d,
                                                  pg.as<float>(), pd.as<float>());
    });
  });
  k_rms_bwd_finish<<<(d + 127) / 128, 128, 0, c.s>>>(pg.as<float>(), pd.as<float>(), chunks, d,
                                                     dev<float>(dgamma), dev<float>(ddelta));
  after_launch("rmsnorm_bwd");
}

void embedding_fwd(Ctx c, const int32_t* ids, int N, CPtr E, int v0, int V_local, int d, Ptr out) {
  dispatch(E.dtype(), "embedding_fwd", [&](auto ew) {
    dispatch(out.dtype(), "embedding_fwd", [&](auto er) {
      using W = decltype(ew);
      using R = decltype(er);
      k_embed_fwd<W, R><<<grid_for(size_t(N) * d), kThreads, 0, c.s>>>(ids, N, dev<W>(E), v0, V_local, d,
                                                                       dev<R>(out));
    });
  });
  after_launch("embedding_fwd");
}

void embedding_bwd(Ctx c, const int32_t* ids, int N, CPtr dout, int v0, int V_local, int d, Ptr dE) {
  if (N <= 0) return;
  // Stable sort of (id, token index): equal ids become runs in token order.
  DeviceTemp idx(c.mem, size_t(N) * 4, "embedding_bwd"), sid(c.mem, size_t(N) * 4, "embedding_bwd"),
      sidx(c.mem, size_t(N) * 4, "embedding_bwd");
  k_iota<<<(N + 255) / 256, 256, 0, c.s>>>(idx.as<int32_t>(), N);
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
    k_embed_bwd_runs<R><<<N, kThreads, 0, c.s>>>(sid.as<int32_t>(), sidx.as<int32_t>(), N, dev<R>(dout), v0,
                                                  V_local, d, dev<float>(dE));
  });
  after_launch("embedding_bwd");
}

void ce_row_max(Ctx c, CPtr logits, int N, int V_local, Ptr row_max) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_row_max", [&](auto e) {
    using A = decltype(e);
    k_ce_max<A><<<N, kThreads, 0, c.s>>>(dev<A>(logits), V_local, dev<float>(row_max));
  });
  after_launch("ce_row_max");
}
void ce_sumexp_target(Ctx c, CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max,
                      Ptr sumexp, Ptr tgt) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_sumexp_target", [&](auto e) {
    using A = decltype(e);
    k_ce_sumexp<A><<<N, kThreads, 0, c.s>>>(dev<A>(logits), targets, V_local, v0, dev<float>(row_max),
                                            dev<float>(sumexp), dev<float>(tgt));
  });
  after_launch("ce_sumexp_target");
}
void ce_loss_grad(Ctx c, Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max,
                  CPtr sumexp, CPtr tgt, double scale, Ptr loss) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_loss_grad", [&](auto e) {
    using A = decltype(e);
    k_ce_loss<A, true><<<N, kThreads, 0, c.s>>>(dev<A>(logits), targets, V_local, v0, dev<float>(row_max),
                                                dev<float>(sumexp), dev<float>(tgt), float(scale),
                                                dev<float>(loss));
  });
  after_launch("ce_loss_grad");
}
void ce_loss(Ctx c, CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max,
             CPtr sumexp, CPtr tgt, Ptr loss) {
  if (N <= 0) return;
  dispatch(logits.dtype(), "ce_loss", [&](auto e) {
    using A = decltype(e);
    k_ce_loss<A, false><<<N, kThreads, 0, c.s>>>(const_cast<A*>(dev<A>(logits)), targets, V_local, v0,
                                                 dev<float>(row_max), dev<float>(sumexp), dev<float>(tgt),
                                                 0.f, dev<float>(loss));
  });
  after_launch("ce_loss");
}

}  // namespace wiola::cuda
