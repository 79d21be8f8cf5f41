// The CUDA emulator: runs the CUDA backend's own kernel sources
// (kernels/cuda/*.cu) on the CPU, so that their index math, masking, shared
// memory, barriers and warp exchanges are tested on machines without a GPU
// (docs/gpu.md, "The CUDA emulator"). It is a test tool, not a backend: one
// CPU thread runs the blocks of a launch one after another, and the threads of
// a block as fibers that switch only at __syncthreads, warp operations and
// exit. A launch is checked as the hardware would (block size, dynamic shared
// memory against its opt-in limit); a block whose threads wait at different
// barriers, a shuffle that reads an exited lane, and a read of dynamic shared
// memory the block never wrote (it starts as NaN bytes) show up as errors or
// NaNs instead of passing silently.
//
// The build (WIOLA_CUDA_EMU=ON) compiles each .cu file as C++ with this
// header forced in first and tools/cuda_emu/include ahead of the toolkit, after
// rewriting its launches `k<<<grid, block, smem, stream>>>(args)` into
// `::wiola_emu::Launch("k", grid, block, smem, stream).run(k)(args)` and its
// `extern __shared__` array into a pointer to the block's dynamic shared
// memory (tools/cuda_emu/CMakeLists.txt). The tests run it in two thread
// orders (WIOLA_EMU_ORDER=reverse) and once more under AddressSanitizer.
//
// What it cannot tell: timing, memory coalescing, bank conflicts, register
// pressure, races that neither thread order exposes, and the tensor cores'
// own rounding (wmma and mma.sync accumulate here in fp32 in a fixed order).
#pragma once

// Code that must differ under the emulator tests this (kernels/cuda/ptx.cuh:
// its inline PTX becomes calls of emu_ptx.cpp).
#define WIOLA_CUDA_EMULATOR 1

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers ----------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// GCC's attribute, not alignas: CUDA's `__shared__ __align__(16) T x[n]`
// puts it after `static`, where alignas may not stand.
#define __align__(n) __attribute__((aligned(n)))
// Blocks run one at a time, so a function-local static is the block's shared
// memory. (Static shared arrays keep their contents between blocks; dynamic
// shared memory is poisoned per block.)
#define __shared__ static

struct uint3 {
  unsigned x, y, z;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace wiola_emu {

// The running thread's coordinates.
struct ThreadCoords {
  uint3 tid, bid;    // threadIdx, blockIdx
  dim3 bdim, gdim;   // blockDim, gridDim
};
const ThreadCoords& coords();

void syncthreads();
void syncwarp(unsigned mask);
// The warp's lanes exchange a 64-bit word: returns lane src_lane's.
uint64_t shuffle(unsigned mask, uint64_t in, int src_lane);
template <class T>
T shuffle_as(unsigned mask, T v, int src_lane) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  uint64_t w = 0;
  std::memcpy(&w, &v, sizeof(T));
  w = shuffle(mask, w, src_lane);
  std::memcpy(&v, &w, sizeof(T));
  return v;
}
int lane_id();
unsigned char* dynamic_smem();
// Warps of a block and lanes of a warp run last to first (the emulator's own
// tests; WIOLA_EMU_ORDER=reverse sets it for a whole run).
void set_reverse_order(bool reverse);
// True if [p, p + bytes) lies inside one live cudaMalloc allocation.
bool in_device_memory(const void* p, size_t bytes);

// ---- for the warp-level PTX instructions (emu_ptx.cpp) ----
// Reports an error of the running thread (named in the message): the launch
// fails with the block's first.
void thread_error(const std::string& msg);
// A warp-collective exchange: each lane gives `bytes` (at most 64) at `in`,
// and every lane receives all 32 lanes' in `out` (lane l's at out + l *
// bytes), all given before any lane goes on. `what` names the operation;
// lanes must all be at the same one. Needs the whole warp, converged: a lane
// that exited or is elsewhere is reported (and false returned).
bool warp_all_gather(const char* what, const void* in, size_t bytes, void* out);
// Per-thread state of emu_ptx.cpp (the cp.async copies in flight), created
// there on first use, fresh for every block; emu.cpp only keeps it and asks,
// at the thread's exit, what is left unfinished.
struct PtxThreadState;
PtxThreadState& ptx_thread_state();
std::shared_ptr<PtxThreadState> new_ptx_thread_state();             // emu_ptx.cpp
std::string ptx_unfinished_at_exit(const PtxThreadState& state);    // emu_ptx.cpp: "" if nothing

// Work that a stream holds until it completes: the emulated NCCL's messages
// (nccl_emu.cpp). Kernels, copies and GEMMs run when they are issued, after
// their stream's held work; held work completes, in stream order, when later
// work on its stream needs it, when a stream that waits on one of its events
// does, on a synchronisation, or when cudaEventQuery finds it done. So the
// host blocks only where the GPU would make later work wait, never where a
// real host would go on.
struct Held {
  virtual ~Held() = default;
  // Completes the work if it can (block: until it can); true once done.
  // Only the thread that issues work calls it.
  virtual bool progress(bool block) = 0;
};
void hold(cudaStream_t s, std::unique_ptr<Held> work);
// Completes everything issued to s so far, and what that waits for.
void stream_ready(cudaStream_t s);

// The launch `name<<<grid, block, smem, stream>>>(args...)`; body owns the
// launch's arguments (a captured launch runs again at every graph launch).
void launch(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            std::function<void()> body);

// ---- CUDA Graphs (cudaStreamBeginCapture ... cudaGraphLaunch) ----
// Device work issued to stream s (`what` names it: a kernel, a copy, a
// GEMM): runs now, after the stream's held work, or, while s captures a
// graph, is recorded into the graph instead and runs, in issue order, at
// every cudaGraphLaunch of it.
void issue(cudaStream_t s, const char* what, std::function<void()> work);
// True while s captures (cudaStreamBeginCapture until cudaStreamEndCapture).
bool capturing(cudaStream_t s);
// A call that a capture of s does not allow (a synchronisation, a copy to or
// from host memory, held NCCL work): reports it, invalidates the capture
// (cudaStreamEndCapture then fails with cudaErrorStreamCaptureInvalidated)
// and returns the error the call returns, cudaErrorStreamCaptureUnsupported.
int capture_violation(cudaStream_t s, const std::string& call);
// An error found while running issued work (a GEMM whose operand is no
// longer allocated when its graph runs): reported by the next
// cudaGetLastError or synchronisation, as a kernel's fault is.
void device_error(const std::string& msg);

// Launch(name, grid, block, smem, stream).run(kernel)(args...) is the
// rewritten `kernel<<<grid, block, smem, stream>>>(args...)`.
class Launch {
 public:
  Launch(const char* name, dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr)
      : name_(name), grid_(grid), block_(block), smem_(smem), stream_(stream) {}
  template <class... P>
  auto run(void (*kernel)(P...)) const {
    return [l = *this, kernel](auto&&... args) {
      static_assert(sizeof...(P) == sizeof...(args), "kernel launched with the wrong number of arguments");
      // Arguments converted to the parameter types once, as a launch copies them.
      auto params = std::tuple<std::decay_t<P>...>(std::forward<decltype(args)>(args)...);
      launch(l.name_, reinterpret_cast<const void*>(kernel), l.grid_, l.block_, l.smem_, l.stream_,
             [kernel, params = std::move(params)] { std::apply(kernel, params); });
    };
  }

 private:
  const char* name_;
  dim3 grid_, block_;
  size_t smem_;
  cudaStream_t stream_;
};

}  // namespace wiola_emu

#define threadIdx (::wiola_emu::coords().tid)
#define blockIdx (::wiola_emu::coords().bid)
#define blockDim (::wiola_emu::coords().bdim)
#define gridDim (::wiola_emu::coords().gdim)

inline void __syncthreads() { ::wiola_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::wiola_emu::syncwarp(mask); }

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::wiola_emu::lane_id();
  return ::wiola_emu::shuffle_as(mask, v, lane / width * width + src % width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::wiola_emu::lane_id(), src = lane ^ lane_mask;
  // A source outside the lane's segment of `width` lanes returns its own value.
  return ::wiola_emu::shuffle_as(mask, v, src / width == lane / width ? src : lane);
}

// ---- device math (the fast intrinsics as their accurate forms) ---------------------
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
// Round-to-nearest arithmetic that nvcc never contracts into an FMA.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }

// Device min/max take mixed integer types; the result is their common type.
template <class A, class B>
constexpr std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return C(b) < C(a) ? C(b) : C(a);
}
template <class A, class B>
constexpr std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return C(a) < C(b) ? C(b) : C(a);
}
