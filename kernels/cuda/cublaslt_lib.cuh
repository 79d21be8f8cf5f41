// cuBLASLt, loaded like cuBLAS (cublas_lib.cuh): dlopen by SONAME
// (libcublasLt.so.13, which libcublas.so.13 loads anyway) the first time a
// backend takes the cuBLASLt GEMM path (kernels/cuda/gemm_lt.cuh); the CUDA
// emulator stands in for it (tools/cuda_emu/cublaslt_emu.cpp).
#pragma once

#include <cublasLt.h>

namespace wiola::cuda {

// The cuBLASLt entry points the backend uses.
struct CublasLt {
  cublasStatus_t (*create)(cublasLtHandle_t*);
  cublasStatus_t (*destroy)(cublasLtHandle_t);
  size_t (*get_version)();
  cublasStatus_t (*matmul_desc_create)(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t);
  cublasStatus_t (*matmul_desc_destroy)(cublasLtMatmulDesc_t);
  cublasStatus_t (*matmul_desc_set_attribute)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*,
                                              size_t);
  cublasStatus_t (*matrix_layout_create)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t, uint64_t, int64_t);
  cublasStatus_t (*matrix_layout_destroy)(cublasLtMatrixLayout_t);
  cublasStatus_t (*preference_create)(cublasLtMatmulPreference_t*);
  cublasStatus_t (*preference_destroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*preference_set_attribute)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                             const void*, size_t);
  cublasStatus_t (*algo_get_heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                       cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t[], int*);
  cublasStatus_t (*algo_check)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                               cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                               const cublasLtMatmulAlgo_t*, cublasLtMatmulHeuristicResult_t*);
  cublasStatus_t (*algo_config_get_attribute)(const cublasLtMatmulAlgo_t*, cublasLtMatmulAlgoConfigAttributes_t,
                                              void*, size_t, size_t*);
  cublasStatus_t (*algo_config_set_attribute)(cublasLtMatmulAlgo_t*, cublasLtMatmulAlgoConfigAttributes_t,
                                              const void*, size_t);
  cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t,
                           const void*, cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t,
                           void*, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t);
};

// Loads cuBLASLt on the first call (thread-safe); a missing library or
// symbol is a wiola::Error naming it and the loader's message.
const CublasLt& cublaslt();

}  // namespace wiola::cuda
