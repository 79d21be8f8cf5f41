// cuBLAS for the CUDA emulator (tools/cuda_emu/emu.h): the entry points of
// kernels/cuda/cublas_lib.cuh, replacing the library the real build loads.
// GemmEx checks what cuBLAS checks (types, leading dimensions) and, beyond
// it, that every operand lies inside one device allocation; the product is
// OpenBLAS's sgemm on fp32 copies of the operands (bf16 widened exactly),
// then C = alpha AB + beta C rounded once to C's type.
#include <cblas.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>

#include <string>
#include <vector>

#include "kernels/cuda/cublas_lib.cuh"
#include "tools/cuda_emu/blas_emu.h"

namespace wiola::cuda {
namespace {

struct Handle {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

cublasStatus_t create(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(new Handle);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t destroy(cublasHandle_t h) {
  delete reinterpret_cast<Handle*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t set_stream(cublasHandle_t h, cudaStream_t s) {
  reinterpret_cast<Handle*>(h)->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t set_math_mode(cublasHandle_t h, cublasMath_t m) {
  reinterpret_cast<Handle*>(h)->math = m;
  return CUBLAS_STATUS_SUCCESS;
}
const char* status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (see the cuda-emu message above)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (see the cuda-emu message above)";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

size_t type_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
float load(const void* p, cudaDataType t, size_t i) {
  return t == CUDA_R_32F ? static_cast<const float*>(p)[i] : float(static_cast<const __nv_bfloat16*>(p)[i]);
}
void store(void* p, cudaDataType t, size_t i, float v) {
  if (t == CUDA_R_32F) static_cast<float*>(p)[i] = v;
  else static_cast<__nv_bfloat16*>(p)[i] = __nv_bfloat16(v);
}

// Column-major op(X) of rows x cols from X with leading dimension ld, into
// a row-major fp32 copy.
std::vector<float> widen(const void* X, cudaDataType t, cublasOperation_t op, int rows, int cols, int ld) {
  std::vector<float> out(size_t(rows) * size_t(cols));
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      out[size_t(i) * size_t(cols) + size_t(j)] =
          load(X, t, op == CUBLAS_OP_N ? size_t(i) + size_t(j) * size_t(ld) : size_t(j) + size_t(i) * size_t(ld));
  return out;
}

// Bytes spanned by a column-major matrix of `rows` x `cols` stored with ld.
size_t span_bytes(int rows, int cols, int ld, cudaDataType t) {
  return rows > 0 && cols > 0 ? ((size_t(cols) - 1) * size_t(ld) + size_t(rows)) * type_bytes(t) : 0;
}

}  // namespace

cublasStatus_t refuse(cublasStatus_t s, const std::string& why, const char* who) {
  std::fprintf(stderr, "cuda-emu: %s: %s\n", who, why.c_str());
  return s;
}

cublasStatus_t gemm_one(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A,
                        cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb, float beta, void* C,
                        cudaDataType ct, int ldc, const char* who) {
  auto refuse = [who](cublasStatus_t s, const std::string& why) { return ::wiola::cuda::refuse(s, why, who); };
  const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (k > 0 && !wiola_emu::in_device_memory(A, span_bytes(a_rows, a_cols, lda, at)))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "A (" + std::to_string(a_rows) + " x " + std::to_string(a_cols) +
                                                   ", ld " + std::to_string(lda) +
                                                   ") is not inside one device allocation");
  if (k > 0 && !wiola_emu::in_device_memory(B, span_bytes(b_rows, b_cols, ldb, bt)))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "B (" + std::to_string(b_rows) + " x " + std::to_string(b_cols) +
                                                   ", ld " + std::to_string(ldb) +
                                                   ") is not inside one device allocation");
  if (!wiola_emu::in_device_memory(C, span_bytes(m, n, ldc, ct)))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "C (" + std::to_string(m) + " x " + std::to_string(n) + ", ld " +
                                                   std::to_string(ldc) + ") is not inside one device allocation");
  std::vector<float> ab(size_t(m) * size_t(n), 0.f);  // row-major m x n
  // One OpenBLAS thread, as in the CPU backend: the emulator runs on one core,
  // and OpenBLAS's idle workers spin in sched_yield between calls, taking the
  // core of whatever runs beside it (measured: a quarter of an emulated
  // training test's CPU time, in the kernel's sched_yield).
  static const bool one_thread = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)one_thread;
  if (k > 0) {
    const std::vector<float> a = widen(A, at, ta, m, k, lda), b = widen(B, bt, tb, k, n, ldb);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, ab.data(), n);
  }
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const size_t c = size_t(i) + size_t(j) * size_t(ldc);
      const float prod = alpha * ab[size_t(i) * size_t(n) + size_t(j)];
      store(C, ct, c, beta == 0.f ? prod : prod + beta * load(C, ct, c));  // beta = 0: C is not read
    }
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

// Runs the GEMM g on the handle's stream, after the stream's work; while
// the stream captures a graph, records it instead (its status then shows
// only when the graph runs: a refusal becomes an error of the launch).
template <class G>
cublasStatus_t run_on(cublasHandle_t h, const char* who, G g) {
  const cudaStream_t s = reinterpret_cast<Handle*>(h)->stream;
  if (!::wiola_emu::capturing(s)) {
    ::wiola_emu::stream_ready(s);
    return g();
  }
  ::wiola_emu::issue(s, who, [g, who] {
    if (g() != CUBLAS_STATUS_SUCCESS)
      ::wiola_emu::device_error(std::string(who) + " in a graph refused its operands (the message above)");
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_args(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                          cudaDataType at, int lda, cudaDataType bt, int ldb, cudaDataType ct, int ldc,
                          cublasComputeType_t compute) {
  if (!h) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "no handle", "cublasGemmEx");
  if (reinterpret_cast<Handle*>(h)->math != CUBLAS_DEFAULT_MATH)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "only CUBLAS_DEFAULT_MATH is emulated", "cublasGemmEx");
  return check_shape(ta, tb, m, n, k, at, lda, bt, ldb, ct, ldc, compute, "cublasGemmEx");
}

}  // namespace

cublasStatus_t check_shape(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, cudaDataType at, int lda,
                           cudaDataType bt, int ldb, cudaDataType ct, int ldc, cublasComputeType_t compute,
                           const char* who) {
  auto refuse = [who](cublasStatus_t s, const std::string& why) { return ::wiola::cuda::refuse(s, why, who); };
  if (m < 0 || n < 0 || k < 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, "negative size");
  if (at != bt) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A and B of different types");
  if (compute != CUBLAS_COMPUTE_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "compute type other than 32F");
  if ((at != CUDA_R_32F && at != CUDA_R_16BF) || (ct != CUDA_R_32F && ct != CUDA_R_16BF) ||
      (at == CUDA_R_32F && ct != CUDA_R_32F))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "type combination");
  if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k) || ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) ||
      ldc < std::max(1, m))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "leading dimension below the rows (lda " + std::to_string(lda) +
                                                   ", ldb " + std::to_string(ldb) + ", ldc " + std::to_string(ldc) +
                                                   "; m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                                                   std::to_string(k) + ")");
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

cublasStatus_t gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                       const void* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt,
                       int ldb, const void* beta, void* C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                       cublasGemmAlgo_t) {
  if (const auto st = check_args(h, ta, tb, m, n, k, at, lda, bt, ldb, ct, ldc, compute); st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);  // host scalars: now
  return run_on(h, "cublasGemmEx",
                [=] { return gemm_one(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc, "cublasGemmEx"); });
}

cublasStatus_t gemm_strided_batched_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                       int k, const void* alpha, const void* A, cudaDataType at, int lda, long long sA,
                                       const void* B, cudaDataType bt, int ldb, long long sB, const void* beta, void* C,
                                       cudaDataType ct, int ldc, long long sC, int batch, cublasComputeType_t compute,
                                       cublasGemmAlgo_t) {
  if (const auto st = check_args(h, ta, tb, m, n, k, at, lda, bt, ldb, ct, ldc, compute); st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (batch < 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, "negative batch", "cublasGemmStridedBatchedEx");
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  return run_on(h, "cublasGemmStridedBatchedEx", [=] {
    for (int i = 0; i < batch; ++i) {
      const auto st = gemm_one(
          ta, tb, m, n, k, al, static_cast<const char*>(A) + size_t(i) * size_t(sA) * type_bytes(at), at, lda,
          static_cast<const char*>(B) + size_t(i) * size_t(sB) * type_bytes(bt), bt, ldb, be,
          static_cast<char*>(C) + size_t(i) * size_t(sC) * type_bytes(ct), ct, ldc, "cublasGemmStridedBatchedEx");
      if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
  });
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c{create, destroy, set_stream, set_math_mode, status_string, gemm_ex, gemm_strided_batched_ex};
  return c;
}

}  // namespace wiola::cuda
