// What the emulated cuBLAS (cublas_emu.cpp) shares with the emulated
// cuBLASLt (cublaslt_emu.cpp): the argument checks of a GEMM and the GEMM
// itself, column-major as cuBLAS has it.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace wiola::cuda {

// Reports "cuda-emu: WHO: WHY" on stderr and returns s.
cublasStatus_t refuse(cublasStatus_t s, const std::string& why, const char* who);

// What cuBLAS checks of a GEMM's sizes, types and leading dimensions.
cublasStatus_t check_shape(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, cudaDataType at,
                           int lda, cudaDataType bt, int ldb, cudaDataType ct, int ldc, cublasComputeType_t compute,
                           const char* who);

// C = alpha op(A) op(B) + beta C, each operand checked against its device
// allocation's bounds; OpenBLAS on fp32 copies, rounded once to C's type.
cublasStatus_t gemm_one(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A,
                        cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb, float beta, void* C,
                        cudaDataType ct, int ldc, const char* who);

}  // namespace wiola::cuda
