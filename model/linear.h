// y = x W^T with W in PyTorch [out, in] layout, and its two backward products.
#pragma once

#include "kernels/ops.h"

namespace wiola {

// y[N, out] = x[N, in] W[out, in]^T  (beta = 1 accumulates into y)
template <class T>
void linear_fwd(Ops<T>& ops, CPtr x, CPtr W, int N, int in, int out, Ptr y,
                T beta = T(0)) {
  ops.gemm(Trans::N, Trans::T, N, out, in, T(1), x, in, W, in, beta, y, out);
}
// dx[N, in] (=, or += with beta 1) dy[N, out] W[out, in]
template <class T>
void linear_bwd_x(Ops<T>& ops, CPtr dy, CPtr W, int N, int in, int out, Ptr dx,
                  T beta = T(0)) {
  ops.gemm(Trans::N, Trans::N, N, in, out, T(1), dy, out, W, in, beta, dx, in);
}
// dW[out, in] += dy[N, out]^T x[N, in]
template <class T>
void linear_bwd_w(Ops<T>& ops, CPtr dy, CPtr x, int N, int in, int out, Ptr dW) {
  ops.gemm(Trans::T, Trans::N, out, in, N, T(1), dy, out, x, in, T(1), dW, in);
}

}  // namespace wiola
