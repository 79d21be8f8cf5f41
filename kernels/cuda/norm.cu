// WiolaRMSNorm on the GPU, alone or fused with the residual add before it
// (add_rmsnorm_fwd), forward and backward. One block per row; row
// statistics in double; the parameter gradients reduced over rows in a
// fixed order (no atomics).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace wiola::cuda {
namespace {

// b null: the norm of x. Otherwise first the residual add sum = x + b (sum
// may be x or b: each element is read and written by one thread), written
// out as the add op would, and the norm of what was written. y_op (may be
// null): y again in storage O, as convert(y, y_op) would round it.
template <class R, class A, class O>
__global__ void k_rmsnorm_fwd(const R* x, const R* b, R* sum, const float* gamma, const float* delta, int d, double eps,
                              A* y, float* rstd, O* y_op) {
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
__global__ void k_rmsnorm_bwd_dx(const R* x, const float* gamma, const float* delta, const float* rstd, const A* dy,
                                 int d, const R* dres, R* dx, float* crow) {
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
__global__ void k_rmsnorm_bwd_cols(const R* x, const float* gamma, const float* delta, const float* rstd, const A* dy,
                                   const float* crow, int N, int d, float* pg, float* pd) {
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
__global__ void k_rmsnorm_bwd_finish(const float* pg, const float* pd, int chunks, int d, float* dgamma,
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

}  // namespace

// s = a + b, then the norm of s (b null: the norm of a, s unused); y_op (may
// be null) gets y's GEMM operand copy.
void add_rmsnorm_fwd(Ctx c, CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd,
                     Ptr y_op) {
  if (N <= 0) return;
  const char* op = b ? "add_rmsnorm_fwd" : "rmsnorm_fwd";
  dispatch(a.dtype(), op, [&](auto er) {
    dispatch(y.dtype(), op, [&](auto ea) {
      dispatch(y_op ? y_op.dtype() : y.dtype(), op, [&](auto eo) {
        using R = decltype(er);
        using A = decltype(ea);
        using O = decltype(eo);
        k_rmsnorm_fwd<R, A, O><<<N, kThreads, 0, c.s>>>(dev<R>(a), dev<R>(b), dev<R>(s), dev<float>(gamma),
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

void rmsnorm_bwd(Ctx c, CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres, Ptr dx, Ptr dgamma,
                 Ptr ddelta) {
  if (N <= 0) return;
  const int chunks = (N + kRowChunk - 1) / kRowChunk;
  DeviceTemp crow(c.mem, size_t(N) * sizeof(float), "rmsnorm_bwd row constants");
  DeviceTemp pg(c.mem, size_t(chunks) * d * sizeof(float), "rmsnorm_bwd partials");
  DeviceTemp pd(c.mem, size_t(chunks) * d * sizeof(float), "rmsnorm_bwd partials");
  dispatch(x.dtype(), "rmsnorm_bwd", [&](auto er) {
    dispatch(dy.dtype(), "rmsnorm_bwd", [&](auto ea) {
      using R = decltype(er);
      using A = decltype(ea);
      k_rmsnorm_bwd_dx<R, A><<<N, kThreads, 0, c.s>>>(dev<R>(x), dev<float>(gamma), dev<float>(delta), dev<float>(rstd),
                                                      dev<A>(dy), d, dev<R>(dres), dev<R>(dx), crow.as<float>());
      const dim3 grid((d + 127) / 128, chunks);
      k_rmsnorm_bwd_cols<R, A><<<grid, 128, 0, c.s>>>(dev<R>(x), dev<float>(gamma), dev<float>(delta), dev<float>(rstd),
                                                      dev<A>(dy), crow.as<float>(), N, d, pg.as<float>(),
                                                      pd.as<float>());
    });
  });
  k_rmsnorm_bwd_finish<<<(d + 127) / 128, 128, 0, c.s>>>(pg.as<float>(), pd.as<float>(), chunks, d, dev<float>(dgamma),
                                                         dev<float>(ddelta));
  after_launch("rmsnorm_bwd");
}

}  // namespace wiola::cuda
