// The CUDA emulator's own checks (tools/cuda_emu/emu.h), in CUDA: the build
// rewrites this file as it rewrites kernels/cuda/*.cu. First that it runs
// kernels as a GPU does (block reductions over shuffles and shared memory,
// wmma's documented layouts, cub's sort, cuBLAS's column-major GemmEx); then
// that each fault it claims to catch is reported, with what and where; last
// the warp-level PTX instructions of kernels/cuda/ptx.cuh (emu_ptx.cpp)
// against a reference written from the PTX ISA's fragment layouts, and the
// kit's ptx_probe against the same reference.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <cub/cub.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas_lib.cuh"
#include "kernels/cuda/ptx.cuh"

namespace {

using wiola::cuda::bf16_t;

// ---- kernels -----------------------------------------------------------------------
// out[block] = sum of x over the block's threads, through warp shuffles and
// shared memory (the backend's own block_sum).
__global__ void k_block_sums(const float* x, double* out) {
  const double s = wiola::cuda::block_sum(double(x[blockIdx.x * blockDim.x + threadIdx.x]));
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Each thread writes its global index: covers 2-D grids and 3-D blocks.
__global__ void k_coords(int* out) {
  const unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const unsigned thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = int(block * per_block + thread);
}

// Reverses 256 floats through shared memory: correct only with the barrier.
__global__ void k_reverse(const float* in, float* out) {
  __shared__ float tile[256];
  tile[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = tile[255 - threadIdx.x];
}

// One warp: D = A B with A of layout LA and B of layout LB (16 x 16 x 16).
template <class LA, class LB>
__global__ void k_wmma(const bf16_t* a, const bf16_t* b, float* d) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, LA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

// Half of warp 0 waits at a warp barrier, the other half at __syncthreads.
__global__ void k_split_warp() {
  if (threadIdx.x < 16) __syncwarp();
  else __syncthreads();
}

// Lanes 16..31 exit; lanes 0..15 then read them with a full-mask shuffle.
__global__ void k_shuffle_exited(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 16);
}

// A bug: thread 0 publishes v and the others read it with no barrier between.
__global__ void k_missing_barrier(float value, float* out) {
  __shared__ float v;
  if (threadIdx.x == 0) v = value;
  out[threadIdx.x] = v;
}

// Reads dynamic shared memory that nothing wrote.
__global__ void k_read_unwritten_smem(float* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  out[threadIdx.x] = reinterpret_cast<const float*>(smem)[threadIdx.x];
}

// ---- helpers --------------------------------------------------------------------------
template <class T>
T* device(const std::vector<T>& h) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(p);
}
template <class T>
std::vector<T> host(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
// The launch error and the emulator's message for it (clears it).
std::string last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// ---- runs as a GPU does ---------------------------------------------------------------
TEST(CudaEmu, BlockSumOverShufflesAndSharedMemory) {
  for (int threads : {32, 96, 256, 1024}) {
    const int blocks = 3;
    std::vector<float> x(size_t(blocks) * threads);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) - 2.5f;
    float* dx = device(x);
    double* dout = device(std::vector<double>(blocks, 0.0));
    k_block_sums<<<blocks, threads>>>(dx, dout);
    ASSERT_EQ(last_error(), "");
    const auto out = host(dout, blocks);
    for (int b = 0; b < blocks; ++b) {
      double want = 0;
      for (int t = 0; t < threads; ++t) want += x[size_t(b) * threads + t];
      EXPECT_EQ(out[size_t(b)], want) << threads << " threads, block " << b;
    }
    cudaFree(dx);
    cudaFree(dout);
  }
}

TEST(CudaEmu, GridAndBlockCoordinates) {
  const dim3 grid(3, 2, 2), block(8, 4, 2);
  const size_t n = 3 * 2 * 2 * 8 * 4 * 2;
  int* d = device(std::vector<int>(n, -1));
  k_coords<<<grid, block>>>(d);
  ASSERT_EQ(last_error(), "");
  const auto h = host(d, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(h[i], int(i));
  cudaFree(d);
}

TEST(CudaEmu, SharedMemoryAcrossABarrier) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[size_t(i)] = float(i);
  float *din = device(x), *dout = device(std::vector<float>(256, 0.f));
  k_reverse<<<1, 256>>>(din, dout);
  ASSERT_EQ(last_error(), "");
  const auto h = host(dout, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(h[size_t(i)], float(255 - i));
  cudaFree(din);
  cudaFree(dout);
}

// CUDA's layouts: row_major puts element (r, c) at p[r * ldm + c], col_major
// at p[c * ldm + r].
template <class LA, class LB>
void check_wmma(bool a_row, bool b_row) {
  std::mt19937 g(3);
  std::uniform_int_distribution<int> u(-4, 4);  // small integers: every product exact
  std::vector<bf16_t> a(256), b(256);
  for (auto& v : a) v = __float2bfloat16(float(u(g)));
  for (auto& v : b) v = __float2bfloat16(float(u(g)));
  auto A = [&](int r, int c) { return __bfloat162float(a_row ? a[size_t(r * 16 + c)] : a[size_t(c * 16 + r)]); };
  auto B = [&](int r, int c) { return __bfloat162float(b_row ? b[size_t(r * 16 + c)] : b[size_t(c * 16 + r)]); };
  bf16_t *da = device(a), *db = device(b);
  float* dd = device(std::vector<float>(256, 0.f));
  k_wmma<LA, LB><<<1, 32>>>(da, db, dd);
  ASSERT_EQ(last_error(), "");
  const auto d = host(dd, 256);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      float want = 0;
      for (int k = 0; k < 16; ++k) want += A(r, k) * B(k, c);
      ASSERT_EQ(d[size_t(r * 16 + c)], want) << r << "," << c << " a_row " << a_row << " b_row " << b_row;
    }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dd);
}
TEST(CudaEmu, WmmaLayouts) {
  using namespace nvcuda;
  check_wmma<wmma::row_major, wmma::row_major>(true, true);
  check_wmma<wmma::row_major, wmma::col_major>(true, false);
  check_wmma<wmma::col_major, wmma::row_major>(false, true);
  check_wmma<wmma::col_major, wmma::col_major>(false, false);
}

TEST(CudaEmu, RadixSortIsStableOnSignedKeys) {
  const std::vector<int32_t> keys = {5, -3, 5, 0, -3, 2, 5, -7};
  std::vector<int32_t> vals(keys.size());
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = int32_t(i);
  int32_t *dk = device(keys), *dv = device(vals), *dk2 = device(keys), *dv2 = device(vals);
  size_t bytes = 0;
  ASSERT_EQ(cub::DeviceRadixSort::SortPairs(nullptr, bytes, dk, dk2, dv, dv2, int(keys.size())), cudaSuccess);
  std::vector<char> tmp(bytes);
  ASSERT_EQ(cub::DeviceRadixSort::SortPairs(tmp.data(), bytes, dk, dk2, dv, dv2, int(keys.size())), cudaSuccess);
  EXPECT_EQ(host(dk2, keys.size()), (std::vector<int32_t>{-7, -3, -3, 0, 2, 5, 5, 5}));
  EXPECT_EQ(host(dv2, keys.size()), (std::vector<int32_t>{7, 1, 4, 3, 5, 0, 2, 6}));
  for (void* p : {static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(dk2), static_cast<void*>(dv2)})
    cudaFree(p);
}

// Column-major C (2 x 3) = A^T (2 x 4) B (4 x 3) + C, as cuBLAS defines it.
TEST(CudaEmu, GemmExIsColumnMajor) {
  const auto& blas = wiola::cuda::cublas();
  cublasHandle_t h = nullptr;
  ASSERT_EQ(blas.create(&h), CUBLAS_STATUS_SUCCESS);
  std::vector<float> a(8), b(12), c(6, 1.f);
  for (int i = 0; i < 8; ++i) a[size_t(i)] = float(i + 1);  // A: 4 x 2, column-major, lda 4
  for (int i = 0; i < 12; ++i) b[size_t(i)] = float(i % 5 - 2);  // B: 4 x 3, ldb 4
  float *da = device(a), *db = device(b), *dc = device(c);
  const float alpha = 1.f, beta = 1.f;
  ASSERT_EQ(blas.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 4, &alpha, da, CUDA_R_32F, 4, db, CUDA_R_32F, 4, &beta,
                         dc, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  const auto out = host(dc, 6);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      float want = 1.f;
      for (int k = 0; k < 4; ++k) want += a[size_t(k + i * 4)] * b[size_t(k + j * 4)];
      EXPECT_EQ(out[size_t(i + j * 2)], want) << i << "," << j;
    }
  // An operand reaching past its allocation is refused.
  EXPECT_EQ(blas.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 3, 5, &alpha, da, CUDA_R_32F, 5, db, CUDA_R_32F, 5, &beta,
                         dc, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  blas.destroy(h);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

// ---- reports what a GPU would not forgive ---------------------------------------------
TEST(CudaEmu, ThreadsOfOneWarpAtDifferentBarriers) {
  k_split_warp<<<1, 64>>>();
  const std::string e = last_error();
  EXPECT_NE(e.find("cudaErrorLaunchFailure"), std::string::npos) << e;
  EXPECT_NE(e.find("k_split_warp"), std::string::npos) << e;
  EXPECT_NE(e.find("threads 0..15 at a warp operation; threads 16..63 at __syncthreads"), std::string::npos) << e;
}

TEST(CudaEmu, ShuffleFromAnExitedLane) {
  float* d = device(std::vector<float>(32, 0.f));
  k_shuffle_exited<<<1, 32>>>(d);
  const std::string e = last_error();
  // The first reader names its source: lane 0 reads 16 (lane 15 reads 31 in reverse order).
  EXPECT_NE(e.find("which did not take part in this shuffle: it has exited"), std::string::npos) << e;
  cudaFree(d);
}

// Why the GPU tests run in both orders: in one, the reader runs after the
// writer and the missing barrier goes unseen; in the other it reads the
// value of the launch before.
TEST(CudaEmu, MissingBarrierShowsInOneOrder) {
  float* d = device(std::vector<float>(64, 0.f));
  wiola_emu::set_reverse_order(false);
  k_missing_barrier<<<1, 64>>>(1.f, d);
  ASSERT_EQ(last_error(), "");
  for (float v : host(d, 64)) EXPECT_EQ(v, 1.f);  // warp 0 wrote before warp 1 read: unseen
  wiola_emu::set_reverse_order(true);
  k_missing_barrier<<<1, 64>>>(2.f, d);
  ASSERT_EQ(last_error(), "");
  const auto h = host(d, 64);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(h[size_t(i)], 1.f) << i;  // warp 1 ran first: the old value
  EXPECT_EQ(h[0], 2.f);                                              // the writer itself
  wiola_emu::set_reverse_order(false);
  cudaFree(d);
}

TEST(CudaEmu, LaunchLimits) {
  float* d = device(std::vector<float>(2048, 0.f));
  k_read_unwritten_smem<<<1, 2048, 0>>>(d);
  EXPECT_NE(last_error().find("cudaErrorInvalidConfiguration"), std::string::npos);
  // 64 KiB of dynamic shared memory needs the opt-in.
  k_read_unwritten_smem<<<1, 32, 64 << 10>>>(d);
  const std::string e = last_error();
  EXPECT_NE(e.find("no cudaFuncSetAttribute opt-in"), std::string::npos) << e;
  ASSERT_EQ(cudaFuncSetAttribute(k_read_unwritten_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10),
            cudaSuccess);
  k_read_unwritten_smem<<<1, 32, 64 << 10>>>(d);
  EXPECT_EQ(last_error(), "");
  cudaFree(d);
}

TEST(CudaEmu, UnwrittenMemoryReadsAsNaN) {
  float* d = device(std::vector<float>(32, 0.f));
  k_read_unwritten_smem<<<1, 32, 32 * sizeof(float)>>>(d);
  ASSERT_EQ(last_error(), "");
  for (float v : host(d, 32)) EXPECT_TRUE(std::isnan(v));
  void* fresh = nullptr;
  ASSERT_EQ(cudaMalloc(&fresh, 16 * sizeof(float)), cudaSuccess);
  for (float v : host(static_cast<const float*>(fresh), 16)) EXPECT_TRUE(std::isnan(v));
  cudaFree(d);
  cudaFree(fresh);
}

TEST(CudaEmu, CopiesOutsideAnAllocation) {
  float* d = device(std::vector<float>(8, 0.f));
  std::vector<float> h(16, 0.f);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 16 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  const std::string e = last_error();
  EXPECT_NE(e.find("not inside one device allocation"), std::string::npos) << e;
  EXPECT_EQ(cudaMemsetAsync(d + 4, 0, 8 * sizeof(float)), cudaErrorInvalidValue);
  last_error();
  EXPECT_EQ(cudaFree(h.data()), cudaErrorInvalidValue);
  last_error();
  cudaFree(d);
}

// ---- CUDA Graphs: a capture records, a launch replays, host work is refused ----------------
__global__ void k_twice_plus_one(float* x) { x[threadIdx.x] = 2.f * x[threadIdx.x] + 1.f; }

TEST(CudaEmu, GraphRecordsThenReplaysInOrder) {
  float* a = device(std::vector<float>(32, 1.f));
  float* b = device(std::vector<float>(32, 0.f));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  k_twice_plus_one<<<1, 32, 0, s>>>(a);                                         // a = 2a + 1
  ASSERT_EQ(cudaMemcpyAsync(b, a, 32 * sizeof(float), cudaMemcpyDeviceToDevice, s), cudaSuccess);  // b = a
  k_twice_plus_one<<<1, 32, 0, s>>>(b);                                         // b = 2b + 1
  ASSERT_EQ(cudaMemsetAsync(a, 0, 16 * sizeof(float), s), cudaSuccess);          // a[0, 16) = 0
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  ASSERT_EQ(last_error(), "");
  // Recorded, not run.
  EXPECT_EQ(host(a, 32), std::vector<float>(32, 1.f));
  EXPECT_EQ(host(b, 32), std::vector<float>(32, 0.f));
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(g, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 4u);
  cudaGraphExec_t e = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(g), cudaSuccess);  // the executable keeps its copy
  auto halves = [](float lo, float hi) {
    std::vector<float> v(32, hi);
    std::fill(v.begin(), v.begin() + 16, lo);
    return v;
  };
  ASSERT_EQ(cudaGraphLaunch(e, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(host(a, 32), halves(0.f, 3.f));
  EXPECT_EQ(host(b, 32), std::vector<float>(32, 7.f));
  ASSERT_EQ(cudaGraphLaunch(e, s), cudaSuccess);  // again, on what the first launch left
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(host(a, 32), halves(0.f, 7.f));
  EXPECT_EQ(host(b, 32), halves(3.f, 15.f));
  EXPECT_EQ(cudaGraphExecDestroy(e), cudaSuccess);
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
}

TEST(CudaEmu, GraphCaptureRefusesHostWork) {
  float* a = device(std::vector<float>(32, 1.f));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> h(32, 0.f);
  cudaGraph_t g = nullptr;
  // A read-back and a synchronisation inside a capture: each refused, and
  // the capture invalidated, naming the first.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  k_twice_plus_one<<<1, 32, 0, s>>>(a);
  EXPECT_EQ(cudaMemcpyAsync(h.data(), a, 32 * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(s, &status);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  const std::string why = cudaGetErrorString(cudaErrorStreamCaptureInvalidated);
  EXPECT_NE(why.find("invalidated by cudaMemcpyAsync to or from host memory"), std::string::npos) << why;
  EXPECT_EQ(host(a, 32), std::vector<float>(32, 1.f));  // the recorded kernel never ran
  // cudaMalloc: refused in global mode, allowed in relaxed mode.
  void* p = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  cudaFree(p);
  // An event recorded in a capture is a point of the graph: the host cannot
  // wait for it.
  cudaEvent_t ev = nullptr;
  ASSERT_EQ(cudaEventCreate(&ev), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(ev, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaEventSynchronize(ev), cudaErrorCapturedEvent);
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphDestroy(g);
  last_error();
  // The stream works as before after all of it.
  k_twice_plus_one<<<1, 32, 0, s>>>(a);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(host(a, 32), std::vector<float>(32, 3.f));
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  cudaFree(a);
}

}  // namespace

// ---- warp-level PTX (kernels/cuda/ptx.cuh) ------------------------------------------------
// The reference is the PTX ISA's own statement of each layout ("Matrix
// Fragments for mma.m16n8k16", "ldmatrix"), lane by lane: lane l, g = l / 4,
// t = l % 4. emu_ptx.cpp maps elements to lanes instead.
namespace {

namespace ptx = wiola::cuda::ptx;

// One warp: D (16 x 8) = A (16 x 16) B (16 x 8) + C, row-major fp32 in
// memory (A and B rounded to bf16 by the packing).
__global__ void k_mma(const float* A, const float* B, const float* C, float* D) {
  const int l = int(threadIdx.x), g = l / 4, t = l % 4;
  const uint32_t a[4] = {ptx::pack_bf16(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]),
                         ptx::pack_bf16(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                         ptx::pack_bf16(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                         ptx::pack_bf16(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t b[2] = {ptx::pack_bf16(B[2 * t * 8 + g], B[(2 * t + 1) * 8 + g]),
                         ptx::pack_bf16(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
  const float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  ptx::mma_bf16_16816(d, a, b, c);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// A tile row for lane l: a permutation, so that matrix i's rows are not
// consecutive in memory.
__host__ __device__ int tile_row(int l) { return (7 * l + 3) % 32; }

// One warp, a shared tile of 32 rows of 8 bf16 (from src); lane l gives the
// address of row tile_row(l). out[(variant * 32 + lane) * 4 + i]: register i
// of x1, x2, x4, x2.trans, x4.trans. Lanes whose address ldmatrix ignores
// (8 and up for x1, 16 and up for x2) give a misaligned one.
__global__ void k_ldmatrix(const bf16_t* src, uint32_t* out) {
  __shared__ __align__(16) bf16_t tile[32 * 8];
  const int l = int(threadIdx.x);
  for (int c = 0; c < 8; ++c) tile[l * 8 + c] = src[l * 8 + c];
  __syncwarp();
  const void* row = &tile[tile_row(l) * 8];
  const void* bogus = reinterpret_cast<const char*>(tile) + 1;
  uint32_t r[5][4] = {};
  uint32_t x1[1], x2[2], x2t[2];
  ptx::ldmatrix_x1(x1, l < 8 ? row : bogus);
  ptx::ldmatrix_x2(x2, l < 16 ? row : bogus);
  ptx::ldmatrix_x4(r[2], row);
  ptx::ldmatrix_x2_trans(x2t, l < 16 ? row : bogus);
  ptx::ldmatrix_x4_trans(r[4], row);
  r[0][0] = x1[0];
  r[1][0] = x2[0], r[1][1] = x2[1];
  r[3][0] = x2t[0], r[3][1] = x2t[1];
  for (int v = 0; v < 5; ++v)
    for (int i = 0; i < 4; ++i) out[(v * 32 + l) * 4 + i] = r[v][i];
}

// Lane l copies chunk l (4 floats) of src into shared memory. out[l * 8 ..]:
// the chunk before the wait, then after.
__global__ void k_cp_async_arrives_at_wait(const float* src, float* out) {
  __shared__ __align__(16) float sm[32 * 4];
  const int l = int(threadIdx.x);
  ptx::cp_async_16(&sm[l * 4], &src[l * 4]);
  for (int j = 0; j < 4; ++j) out[l * 8 + j] = sm[l * 4 + j];
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  for (int j = 0; j < 4; ++j) out[l * 8 + 4 + j] = sm[l * 4 + j];
}

// Two groups (chunks l and 32 + l); out[l * 12 ..]: after wait<1> the first
// chunk and the second, then the second after wait<0>. An empty group
// committed in between counts as a group.
__global__ void k_cp_async_groups(const float* src, float* out) {
  __shared__ __align__(16) float sm[64 * 4];
  const int l = int(threadIdx.x);
  ptx::cp_async_16(&sm[l * 4], &src[l * 4]);
  ptx::cp_async_commit();
  ptx::cp_async_16(&sm[(32 + l) * 4], &src[(32 + l) * 4]);
  ptx::cp_async_commit();
  ptx::cp_async_wait<1>();
  for (int j = 0; j < 4; ++j) out[l * 12 + j] = sm[l * 4 + j];
  for (int j = 0; j < 4; ++j) out[l * 12 + 4 + j] = sm[(32 + l) * 4 + j];
  ptx::cp_async_commit();  // empty: wait<1> now completes the second
  ptx::cp_async_wait<1>();
  for (int j = 0; j < 4; ++j) out[l * 12 + 8 + j] = sm[(32 + l) * 4 + j];
}

// Odd lanes copy nothing (zfill) from a null source.
__global__ void k_cp_async_zfill(const float* src, float* out) {
  __shared__ __align__(16) float sm[32 * 4];
  const int l = int(threadIdx.x);
  ptx::cp_async_16_zfill(&sm[l * 4], l % 2 ? nullptr : &src[l * 4], l % 2 == 0);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  for (int j = 0; j < 4; ++j) out[l * 4 + j] = sm[l * 4 + j];
}

// Faults, one per mode.
enum class PtxFault {
  CpAsyncMisalignedDst,
  CpAsyncMisalignedSrc,
  CpAsyncLeftInFlight,
  CpAsyncNotCommitted,
  CpAsyncSourceChanged,
  LdmatrixMisaligned,
  LdmatrixGlobal,
  MmaHalfWarp,
  MmaBesideLdmatrix
};
__global__ void k_ptx_fault(PtxFault mode, float* global) {
  __shared__ __align__(16) float sm[32 * 8];
  const int l = int(threadIdx.x);
  float* mine = &sm[l * 8];
  switch (mode) {
    case PtxFault::CpAsyncMisalignedDst: ptx::cp_async_16(mine + 1, global); break;
    case PtxFault::CpAsyncMisalignedSrc: ptx::cp_async_16(mine, global + 1); break;
    case PtxFault::CpAsyncLeftInFlight: ptx::cp_async_16(mine, global + 4 * l); ptx::cp_async_commit(); break;
    case PtxFault::CpAsyncNotCommitted: ptx::cp_async_16(mine, global + 4 * l); break;
    case PtxFault::CpAsyncSourceChanged:
      ptx::cp_async_16(mine, global + 4 * l);
      ptx::cp_async_commit();
      global[4 * l] += 1.f;
      ptx::cp_async_wait<0>();
      break;
    case PtxFault::LdmatrixMisaligned: {
      uint32_t r[1];
      ptx::ldmatrix_x1(r, l == 3 ? static_cast<const void*>(mine + 2) : mine);
      break;
    }
    case PtxFault::LdmatrixGlobal: {
      uint32_t r[4];
      ptx::ldmatrix_x4(r, global + 4 * l);
      break;
    }
    case PtxFault::MmaHalfWarp:
    case PtxFault::MmaBesideLdmatrix: {
      if (l >= 16) {
        if (mode == PtxFault::MmaHalfWarp) return;
        uint32_t r[4];
        ptx::ldmatrix_x4(r, mine);
        break;
      }
      const uint32_t a[4] = {}, b[2] = {};
      const float c[4] = {};
      float d[4];
      ptx::mma_bf16_16816(d, a, b, c);
      break;
    }
  }
}

float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// D = A B + C on random bf16 A, B and fp32 C, against a double-precision
// product: within fp32 accumulation's error.
TEST(CudaEmu, MmaM16n8k16MatchesAMatmul) {
  std::mt19937 gen(11);
  std::normal_distribution<float> nd;
  for (int round = 0; round < 3; ++round) {
    std::vector<float> a(256), b(128), c(128);
    for (auto& v : a) v = round_bf16(nd(gen));
    for (auto& v : b) v = round_bf16(nd(gen));
    for (auto& v : c) v = round == 0 ? 0.f : nd(gen);
    float *da = device(a), *db = device(b), *dc = device(c), *dd = device(std::vector<float>(128, 0.f));
    k_mma<<<1, 32>>>(da, db, dc, dd);
    ASSERT_EQ(last_error(), "");
    const auto d = host(dd, 128);
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) {
        double want = c[size_t(r * 8 + n)], scale = std::fabs(want);
        for (int k = 0; k < 16; ++k) {
          want += double(a[size_t(r * 16 + k)]) * b[size_t(k * 8 + n)];
          scale += std::fabs(double(a[size_t(r * 16 + k)]) * b[size_t(k * 8 + n)]);
        }
        EXPECT_NEAR(d[size_t(r * 8 + n)], want, 1e-6 * scale + 1e-30) << "D[" << r << "][" << n << "] round " << round;
      }
    for (float* p : {da, db, dc, dd}) cudaFree(p);
  }
}

// Register i of lane l, when tile row s holds 8 s + c in column c and lane k
// gives the address of tile row tile_row_of(k): matrix i's row r is tile row
// tile_row_of(8 i + r).
uint32_t ldmatrix_want(int l, int i, bool trans, int (*tile_row_of)(int)) {
  const int g = l / 4, t = l % 4;
  auto elem = [&](int row, int col) {
    return uint32_t(__float2bfloat16(float(8 * tile_row_of(8 * i + row) + col)).bits);
  };
  // Not transposed: row g, columns 2t, 2t + 1; transposed: column g, rows 2t, 2t + 1.
  const uint32_t lo = trans ? elem(2 * t, g) : elem(g, 2 * t), hi = trans ? elem(2 * t + 1, g) : elem(g, 2 * t + 1);
  return lo | hi << 16;
}

TEST(CudaEmu, LdmatrixLayouts) {
  std::vector<bf16_t> tile(256);
  for (int i = 0; i < 256; ++i) tile[size_t(i)] = __float2bfloat16(float(i));  // row s, column c: 8 s + c
  bf16_t* dt = device(tile);
  uint32_t* dout = device(std::vector<uint32_t>(5 * 32 * 4, 0));
  k_ldmatrix<<<1, 32>>>(dt, dout);
  ASSERT_EQ(last_error(), "");
  const auto out = host(dout, 5 * 32 * 4);
  const int regs[5] = {1, 2, 4, 2, 4};
  const bool trans[5] = {false, false, false, true, true};
  for (int v = 0; v < 5; ++v)
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < regs[v]; ++i)
        EXPECT_EQ(out[size_t((v * 32 + l) * 4 + i)], ldmatrix_want(l, i, trans[v], tile_row))
            << "variant " << v << " lane " << l << " register " << i;
  cudaFree(dt);
  cudaFree(dout);
}

std::vector<float> chunks(int n) {  // n chunks of 4 floats: 4 k + j
  std::vector<float> v(size_t(n) * 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  return v;
}

TEST(CudaEmu, CpAsyncArrivesAtTheWait) {
  float *src = device(chunks(32)), *dout = device(std::vector<float>(32 * 8, 0.f));
  k_cp_async_arrives_at_wait<<<1, 32>>>(src, dout);
  ASSERT_EQ(last_error(), "");
  const auto out = host(dout, 32 * 8);
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < 4; ++j) {
      EXPECT_TRUE(std::isnan(out[size_t(l * 8 + j)])) << "lane " << l << ": read before the wait";
      EXPECT_EQ(out[size_t(l * 8 + 4 + j)], float(l * 4 + j)) << "lane " << l;
    }
  cudaFree(src);
  cudaFree(dout);
}

TEST(CudaEmu, CpAsyncWaitLeavesTheNewestGroups) {
  float *src = device(chunks(64)), *dout = device(std::vector<float>(32 * 12, 0.f));
  k_cp_async_groups<<<1, 32>>>(src, dout);
  ASSERT_EQ(last_error(), "");
  const auto out = host(dout, 32 * 12);
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(out[size_t(l * 12 + j)], float(l * 4 + j)) << "lane " << l << ": the older group after wait<1>";
      EXPECT_TRUE(std::isnan(out[size_t(l * 12 + 4 + j)])) << "lane " << l << ": the newer group after wait<1>";
      EXPECT_EQ(out[size_t(l * 12 + 8 + j)], float((32 + l) * 4 + j)) << "lane " << l << ": behind an empty group";
    }
  cudaFree(src);
  cudaFree(dout);
}

TEST(CudaEmu, CpAsyncZfill) {
  float *src = device(chunks(32)), *dout = device(std::vector<float>(32 * 4, -1.f));
  k_cp_async_zfill<<<1, 32>>>(src, dout);
  ASSERT_EQ(last_error(), "");
  const auto out = host(dout, 32 * 4);
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(out[size_t(l * 4 + j)], l % 2 ? 0.f : float(l * 4 + j)) << "lane " << l;
  cudaFree(src);
  cudaFree(dout);
}

TEST(CudaEmu, PtxFaults) {
  const std::pair<PtxFault, const char*> cases[] = {
      {PtxFault::CpAsyncMisalignedDst, "cp.async: destination"},
      {PtxFault::CpAsyncMisalignedSrc, "is not 16-byte aligned"},
      {PtxFault::CpAsyncLeftInFlight, "cp.async still in flight at exit: 1 copies, 1 committed groups"},
      {PtxFault::CpAsyncNotCommitted, "cp.async still in flight at exit: 1 copies, 0 committed groups"},
      {PtxFault::CpAsyncSourceChanged, "changed while its copy was in flight"},
      {PtxFault::LdmatrixMisaligned, "ldmatrix.x1: lane 3's row address"},
      {PtxFault::LdmatrixGlobal, "is in global memory (ldmatrix reads shared memory)"},
      {PtxFault::MmaHalfWarp, "mma.sync.m16n8k16 needs the whole warp, converged: lane 16 has exited"},
      {PtxFault::MmaBesideLdmatrix, "is at another warp operation (the warp is not converged)"},
  };
  float* global = device(chunks(33));
  for (const auto& [mode, want] : cases) {
    k_ptx_fault<<<1, 32>>>(mode, global);
    const std::string e = last_error();
    EXPECT_NE(e.find("cudaErrorLaunchFailure"), std::string::npos) << e;
    EXPECT_NE(e.find("k_ptx_fault"), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << "fault " << int(mode) << ": " << e;
  }
  // The next launch starts clean: no copy of the failed block is left over.
  float *src = device(chunks(32)), *dout = device(std::vector<float>(32 * 4, 0.f));
  k_cp_async_zfill<<<1, 32>>>(src, dout);
  EXPECT_EQ(last_error(), "");
  for (float* p : {global, src, dout}) cudaFree(p);
}

std::string line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string line(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// The lines tests/gpu/ptx_probe.cu must print, from the inputs its header
// states and the ISA's layouts.
std::vector<std::string> probe_want() {
  std::vector<std::string> want;
  auto A = [](int r, int k) { return double(16 * r + k); };
  auto B = [](int k, int n) { return double(8 * k + n); };
  auto C = [](int r, int n) { return -double(8 * r + n + 1); };
  auto I = [](int k, int n) { return k == n ? 1.0 : 0.0; };
  auto I8 = [](int k, int n) { return k == n + 8 ? 1.0 : 0.0; };
  auto zero = [](int, int) { return 0.0; };
  struct Case {
    const char* name;
    double (*a)(int, int);
    double (*b)(int, int);
    double (*c)(int, int);
  };
  const Case cases[] = {{"mma.a_cols_0_7", A, I, zero},
                        {"mma.a_cols_8_15", A, I8, zero},
                        {"mma.b", I, B, zero},
                        {"mma.c", zero, zero, C},
                        {"mma.sum", A, B, C}};
  for (const Case& cs : cases)
    for (int l = 0; l < 32; ++l) {
      double d[4];
      for (int i = 0; i < 4; ++i) {  // d[0..1]: row g, columns 2t, 2t + 1; d[2..3]: row g + 8
        const int r = l / 4 + (i < 2 ? 0 : 8), n = 2 * (l % 4) + i % 2;
        d[i] = cs.c(r, n);
        for (int k = 0; k < 16; ++k) d[i] += cs.a(r, k) * cs.b(k, n);
      }
      want.push_back(line("%s lane %d d0 %.9g d1 %.9g d2 %.9g d3 %.9g", cs.name, l, d[0], d[1], d[2], d[3]));
    }
  // ldmatrix: lane l gives tile row l; matrix i's element (r, c) is 64 i + 8 r + c.
  const char* names[5] = {"ldmatrix.x1", "ldmatrix.x2", "ldmatrix.x4", "ldmatrix.x2.trans", "ldmatrix.x4.trans"};
  const int regs[5] = {1, 2, 4, 2, 4};
  for (int v = 0; v < 5; ++v)
    for (int l = 0; l < 32; ++l) {
      std::string s = line("%s lane %d", names[v], l);
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < regs[v]; ++i) {
        const bool trans = v >= 3;
        const int lo = trans ? 64 * i + 8 * (2 * t) + g : 64 * i + 8 * g + 2 * t;
        const int hi = trans ? lo + 8 : lo + 1;
        s += line(" r%d %d,%d", i, lo, hi);
      }
      want.push_back(s);
    }
  // cp.async: chunk k holds 4 k + j; lanes l % 4 == 3 zero-fill their second chunk.
  for (int l = 0; l < 32; ++l) {
    auto chunk = [](int k, bool zero) {
      return zero ? std::string("0 0 0 0") : line("%d %d %d %d", 4 * k, 4 * k + 1, 4 * k + 2, 4 * k + 3);
    };
    want.push_back(line("cp.async lane %d group0 %s group1 %s next %s", l, chunk(l, false).c_str(),
                        chunk(32 + l, l % 4 == 3).c_str(), chunk((l + 1) % 32, false).c_str()));
  }
  return want;
}

// The kit's probe (ptx_probe_emu --dump), line for line against the reference
// above: the file the GPU's ptx_probe compares itself with is the ISA's.
TEST(CudaEmu, PtxProbeMatchesTheIsaLayouts) {
  const std::string path = testing::TempDir() + "ptx_probe_emu_self_test.txt";
  const std::string cmd = std::string("'") + PTX_PROBE_EMU + "' --dump '" + path + "' >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(path);
  std::vector<std::string> got;
  for (std::string s; std::getline(f, s);) got.push_back(s);
  const std::vector<std::string> want = probe_want();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "line " << i + 1;
  std::remove(path.c_str());
}

}  // namespace
