// The backend's GEMMs through cuBLASLt (cublaslt_lib.cuh): one handle, a
// workspace of kWorkspace bytes from the backend's allocator, the
// heuristic's candidates for a GEMM and a GEMM with a given candidate. Same
// semantics as the cublasGemmEx call of cuda_ops.cu (column-major, fp32
// compute and scale, C = alpha op(A) op(B) + beta C in place).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/cuda/memory.cuh"

namespace wiola::cuda {

// A cuBLASLt algorithm in a named type: nvcc's front end fails on standard
// containers of the header's unnamed struct types.
struct LtAlgo {
  cublasLtMatmulAlgo_t algo;
};

// One GEMM as cublasGemmEx takes it (column-major).
struct BlasGemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  float alpha;
  const void* A;
  cudaDataType at;
  int lda;
  const void* B;
  cudaDataType bt;
  int ldb;
  float beta;
  void* C;
  cudaDataType ct;
  int ldc;
  size_t c_bytes() const;  // bytes C spans
};

class GemmLt {
 public:
  static constexpr size_t kWorkspace = size_t(32) << 20;  // cuBLAS's recommendation for Hopper
  static constexpr int kMaxCandidates = 32;
  GemmLt(CachingAllocator& mem, cudaStream_t stream);
  ~GemmLt();
  GemmLt(const GemmLt&) = delete;
  GemmLt& operator=(const GemmLt&) = delete;

  // Up to n of the heuristic's candidates for g, best first, for operands
  // aligned to `align` bytes; where g has fewer output tiles (of 128 x 128)
  // than the device has SMs (`sms`: the weight-gradient GEMMs, whose k is
  // the tokens), split-K forms of the first two (k split 2, 4, 8 and 16
  // ways, each part at least 256 deep) that cublasLtMatmulAlgoCheck accepts
  // are appended, so that they are timed even where the heuristic ranks
  // them lower.
  std::vector<LtAlgo> candidates(const BlasGemm& g, int align, int n, int sms);
  cublasStatus_t run(const BlasGemm& g, const cublasLtMatmulAlgo_t& algo);
  // "id 6 tile 20 splitk 4 reduction 2 swizzle 1 custom 0 stages 11".
  static std::string describe(const cublasLtMatmulAlgo_t& algo);
  static size_t version();

 private:
  struct Descs;
  CachingAllocator& mem_;
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

// Throws wiola::Error "cuBLASLt error in WHAT: status".
void check_lt(cublasStatus_t st, const char* what);

}  // namespace wiola::cuda
