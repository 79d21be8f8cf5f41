// The CUDA emulator's own checks (tests/cuda_emu/emu.h), in CUDA: the build
// rewrites this file as it rewrites kernels/cuda/*.cu. First that it runs
// kernels as a GPU does (block reductions over shuffles and shared memory,
// wmma's documented layouts, cub's sort, cuBLAS's column-major GemmEx); then
// that each fault it claims to catch is reported, with what and where.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mma.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cub/cub.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas_lib.cuh"

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

}  // namespace
