// cuBLAS, loaded when the first CUDA backend is made (dlopen by SONAME,
// libcublas.so.13) instead of at program start: a CPU run of a CUDA build
// then never maps cuBLAS and cuBLASLt, which cost ~200 MiB of resident
// memory just by being loaded (measured: `wiola --version` 215 MiB linked,
// docs/cpu.md). Found through LD_LIBRARY_PATH or the binary's RUNPATH.
#pragma once

#include <cublas_v2.h>

namespace wiola::cuda {

// The cuBLAS entry points the backend uses (exported names: cublas_v2.h
// maps cublasCreate to cublasCreate_v2, ...).
struct Cublas {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
  const char* (*status_string)(cublasStatus_t);
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*, cudaDataType,
                                            int, long long, const void*, cudaDataType, int,
                                            long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t,
                                            cublasGemmAlgo_t);
};

// Loads cuBLAS on the first call (thread-safe); a missing library or symbol
// is a wiola::Error naming it and the loader's message.
const Cublas& cublas();

}  // namespace wiola::cuda
