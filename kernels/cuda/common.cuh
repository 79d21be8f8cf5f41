// Device helpers shared by the CUDA op files: error checks that name the op,
// element loads/stores for fp32 and bf16 storage, launch sizes, and warp /
// block reductions in a fixed order (deterministic results).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/ptr.h"

namespace wiola::cuda {

using bf16_t = __nv_bfloat16;

// Throws wiola::Error "CUDA error in WHAT: message".
void check(cudaError_t e, const char* what);
// After a kernel launch: launch errors now; with WIOLA_CUDA_SYNC=1 also
// synchronises so an asynchronous fault is reported with the op that caused it.
void after_launch(const char* op);

// Typed device pointer of a storage element type (float or bf16_t).
template <class E>
E* dev(Ptr p) {
  if constexpr (std::is_same_v<E, bf16_t>) return reinterpret_cast<bf16_t*>(p.as<wiola::bf16>());
  else return p.as<E>();
}
template <class E>
const E* dev(CPtr p) {
  if constexpr (std::is_same_v<E, bf16_t>) return reinterpret_cast<const bf16_t*>(p.as<wiola::bf16>());
  else return p.as<E>();
}

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const bf16_t* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16_t* p, float v) { *p = __float2bfloat16(v); }

// Calls f(E{}) with E the storage type of `t` (fp32 or bf16).
[[noreturn]] void unsupported_dtype(DType t, const char* op);
template <class F>
void dispatch(DType t, const char* op, F&& f) {
  if (t == DType::F32) f(float{});
  else if (t == DType::BF16) f(bf16_t{});
  else unsupported_dtype(t, op);
}

constexpr int kThreads = 256;
inline int grid_for(size_t n, int threads = kThreads) {
  const size_t b = (n + size_t(threads) - 1) / size_t(threads);
  return int(std::min<size_t>(std::max<size_t>(b, 1), 65535u * 8u));
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. The order is fixed: deterministic.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T part[32];
  __shared__ T total;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    T s = lane < int(blockDim.x >> 5) ? part[lane] : T(0);
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const T r = total;
  __syncthreads();
  return r;
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  v = warp_max(v);
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    float s = lane < int(blockDim.x >> 5) ? part[lane] : -INFINITY;
    s = warp_max(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

}  // namespace wiola::cuda
