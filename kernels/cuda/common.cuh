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
#include "util/error.h"

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
// v as storage E holds it: what ld reads back after st (bf16: rounded to
// nearest even). A fused kernel passes on a value it also stores this way,
// so the next step reads the bits the unfused op would have loaded.
template <class E>
__device__ __forceinline__ float as_stored(float v) {
  if constexpr (std::is_same_v<E, bf16_t>) return __bfloat162float(__float2bfloat16(v));
  else return v;
}
// fp64 operands (accumulate's double gradients) move unchanged.
__device__ __forceinline__ double ld(const double* p) { return *p; }
__device__ __forceinline__ void st(double* p, double v) { *p = v; }

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

// A grid-stride loop over i < n.
#define GRID_LOOP(i, n) \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

// Reductions (sum, sum_squares, blend_bwd's dL/dphi): a fixed grid of at
// most kRedBlocks blocks, whose partial sums one block then adds in order.
constexpr int kRedBlocks = 512;
inline int red_blocks(size_t n) { return std::min(kRedBlocks, grid_for(n)); }

// The logistic function in fp32 (SwiGLU, the stream fusion, the output gate).
__device__ __forceinline__ float sigm(float x) {
  const float e = __expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

// The launcher of a one-storage-type per-element map: dispatches on op's
// dtype; `launch` names `grid`: map_grid's blocks for storage E.
#define WIOLA_UNARY_A(NAME, op, launch) \
  dispatch(op.dtype(), NAME, [&](auto e) { \
    using E = decltype(e); \
    const int grid = map_grid<E>(n); \
    launch; \
  }); \
  after_launch(NAME)

// ---- Flat per-element maps at 16 bytes per access ------------------------------
// A memory-bound elementwise kernel that moves one 2- or 4-byte scalar per
// thread per access reaches a fraction of the GPU's bandwidth; 16-byte
// loads and stores (one LDG.128 / STG.128 per operand) reach it.
// vec_map(n, f, operands...) runs f on every element i < n of its operands,
// each a MapIn (read), MapOut (written) or MapInOut (read, then written)
// of fp32, bf16 or fp64 storage:
//   f(a, b, o) with a, b the elements of the MapIns converted by ld (fp32
//   registers; fp64 for fp64 storage) and o a reference to the MapOut's
//   register, which st rounds into storage after f returns.
// The elements go through the same ld, f and st as a scalar loop calling f
// element by element, so the results are the same bits; only the way memory
// is moved differs. The threads of the grid stride over packs of W
// elements, W = 16 bytes of the narrowest operand (4 fp32, 8 bf16; the wider
// operands move W elements as several 16-byte pieces); the elements before
// the narrowest operand's first 16-byte boundary (the head) and after the
// last whole pack (the tail) go element by element. Where the operands'
// misalignments differ (no one head aligns them all, e.g. a view one element
// into a buffer against another at its start), every element goes the
// scalar way: a 16-byte access to an address not a multiple of 16 faults on
// the GPU, so the pack loop never issues one (under the emulator each such
// access is also checked and reported as an error of the thread).
// Launch it with map_grid<E...>(n) blocks of kThreads: any grid is correct
// (grid-stride loops), that one has a thread per pack.
template <class E>
struct MapIn {
  const E* p;
};
template <class E>
struct MapOut {
  E* p;
};
template <class E>
struct MapInOut {
  E* p;
};
template <class E>
MapIn(const E*) -> MapIn<E>;
template <class E>
MapOut(E*) -> MapOut<E>;
template <class E>
MapInOut(E*) -> MapInOut<E>;

// Elements per pack: 16 bytes of the narrowest storage type.
template <class... E>
constexpr int map_width() {
  return int(16 / std::min({sizeof(E)...}));
}
template <class... E>
inline int map_grid(size_t n) {
  return grid_for(n / size_t(map_width<E...>()) + 1);
}

namespace map_detail {

template <class Op>
struct Role;
template <class E>
struct Role<MapIn<E>> {
  using Elem = E;
  static constexpr bool kLoad = true, kStore = false;
};
template <class E>
struct Role<MapOut<E>> {
  using Elem = E;
  static constexpr bool kLoad = false, kStore = true;
};
template <class E>
struct Role<MapInOut<E>> {
  using Elem = E;
  static constexpr bool kLoad = true, kStore = true;
};

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Under the emulator a misaligned 16-byte access is reported (the GPU would
// fault with a misaligned address) and not made (undefined on the CPU).
__device__ __forceinline__ bool vector_access_ok(const void* p) {
#ifdef WIOLA_CUDA_EMULATOR
  if (!aligned16(p)) {
    ::wiola_emu::thread_error("vec_map: 16-byte access at a misaligned address");
    return false;
  }
#else
  (void)p;
#endif
  return true;
}

// K elements of storage E: their bytes as 16-byte pieces, or as elements.
template <class E, int K>
union Pack {
  static_assert(K * sizeof(E) % 16 == 0, "a pack is whole 16-byte pieces");
  uint4 u[K * sizeof(E) / 16];
  E e[K];
};

// One operand's registers for K consecutive elements starting at i: K == 1
// is the scalar path, K == W the pack path (i a multiple of 16 bytes).
template <class Op, int K>
struct Regs {
  using R = Role<Op>;
  using E = typename R::Elem;
  using V = decltype(ld(static_cast<const E*>(nullptr)));
  Op op;
  V v[K];

  __device__ __forceinline__ void load(size_t i) {
    if constexpr (!R::kLoad) {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = V(0);
    } else if constexpr (K == 1) {
      v[0] = ld(op.p + i);
    } else {
      Pack<E, K> b;
      const uint4* src = reinterpret_cast<const uint4*>(op.p + i);
      if (!vector_access_ok(src)) return;
#pragma unroll
      for (int c = 0; c < int(sizeof b.u / 16); ++c) b.u[c] = src[c];
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = ld(&b.e[k]);
    }
  }
  __device__ __forceinline__ void store(size_t i) {
    if constexpr (!R::kStore) {
      return;
    } else if constexpr (K == 1) {
      st(op.p + i, v[0]);
    } else {
      Pack<E, K> b;
#pragma unroll
      for (int k = 0; k < K; ++k) st(&b.e[k], v[k]);
      uint4* dst = reinterpret_cast<uint4*>(op.p + i);
      if (!vector_access_ok(dst)) return;
#pragma unroll
      for (int c = 0; c < int(sizeof b.u / 16); ++c) dst[c] = b.u[c];
    }
  }
  // What f gets: a read-only operand's value, a written one's register.
  __device__ __forceinline__ decltype(auto) arg(int k) {
    if constexpr (R::kStore) return (v[k]);
    else return static_cast<const V&>(v[k]);
  }
};

// Loads all operands' K elements at i, runs f on each element, stores.
template <int K, class F, class... Ops>
__device__ __forceinline__ void run_at(const F& f, size_t i, Regs<Ops, K>... r) {
  (r.load(i), ...);
#pragma unroll
  for (int k = 0; k < K; ++k) f(r.arg(k)...);
  (r.store(i), ...);
}

// Elements from the narrowest operand's address p to its next 16-byte boundary.
template <class E>
__device__ __forceinline__ size_t head_of(const E* p) {
  return (16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / sizeof(E);
}

}  // namespace map_detail

template <class F, class... Ops>
__device__ __forceinline__ void vec_map(size_t n, const F& f, Ops... ops) {
  using namespace map_detail;
  constexpr int W = map_width<typename Role<Ops>::Elem...>();
  // The head: from the first operand of the narrowest type (the one with W
  // elements in 16 bytes); it must align every operand.
  size_t head = ~size_t(0);
  ((sizeof(typename Role<Ops>::Elem) * W == 16 && head == ~size_t(0) ? void(head = head_of(ops.p)) : void()), ...);
  const bool same = (aligned16(ops.p + head) && ...);
  head = same && head < n ? head : n;  // differing misalignments: all scalar
  const size_t packs = (n - head) / W, tail = head + packs * W;
  const size_t t0 = size_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = t0; i < head; i += stride) run_at<1>(f, i, Regs<Ops, 1>{ops, {}}...);
  for (size_t j = t0; j < packs; j += stride) run_at<W>(f, head + j * W, Regs<Ops, W>{ops, {}}...);
  for (size_t i = tail + t0; i < n; i += stride) run_at<1>(f, i, Regs<Ops, 1>{ops, {}}...);
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
