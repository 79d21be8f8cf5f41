// CpuOps: host (or opaque) memory, OpenBLAS matrix products, and forwards to
// the op bodies in kernels/cpu/*.cpp (declared in kernels/cpu/kernels.h) and
// the attention kernels (kernels/cpu/attention.h). Each op opens the opaque
// memory for its duration (a no-op for host memory) and reads its typed
// pointers with as<T>(), which rejects a buffer of another dtype.
#include "kernels/cpu/cpu_ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/kernels.h"
#include "kernels/op_info.h"
#include "kernels/cpu/simd.h"
#include "util/error.h"

namespace wiola {
namespace {

CBLAS_TRANSPOSE cblas_trans(Trans t) { return t == Trans::N ? CblasNoTrans : CblasTrans; }

void blas_gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
               float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void blas_gemm(Trans ta, Trans tb, int m, int n, int k, double alpha, const double* A, int lda, const double* B,
               int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

// C = op(A) op(B) split into one block of rows (or columns) per OpenMP
// thread, each a single-threaded BLAS call. OpenBLAS runs with one thread:
// its own pthread pool next to OpenMP's spinning workers oversubscribes the
// cores (measured: 15 % of a step in sched_yield). The split only depends on
// the thread count, so results are deterministic for a fixed count.
template <class T>
void parallel_gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
                   T* C, int ldc) {
  const int nt = omp_get_max_threads();
  const double work = double(m) * n * std::max(k, 1);
  if (nt <= 1 || work < 64.0 * 64 * 64 || omp_in_parallel()) {
    blas_gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_rows = m >= n;
  const int len = split_rows ? m : n;
  const int parts = std::min(nt, std::max(1, len / 16));
  // Blocks of whole 16-row (column) panels, as even as possible.
  const int panels = (len + 15) / 16;
#pragma omp parallel for num_threads(parts) schedule(static, 1)
  for (int p = 0; p < parts; ++p) {
    const int b0 = std::min(len, int(int64_t(panels) * p / parts) * 16);
    const int b1 = std::min(len, int(int64_t(panels) * (p + 1) / parts) * 16);
    if (b1 <= b0) continue;
    if (split_rows) {
      const T* a = ta == Trans::N ? A + size_t(b0) * lda : A + b0;
      blas_gemm(ta, tb, b1 - b0, n, k, alpha, a, lda, B, ldb, beta, C + size_t(b0) * ldc, ldc);
    } else {
      const T* b = tb == Trans::N ? B + b0 : B + size_t(b0) * ldb;
      blas_gemm(ta, tb, m, b1 - b0, k, alpha, A, lda, b, ldb, beta, C + b0, ldc);
    }
  }
}

// The typed pointers of an op, checked against the backend's compute type.
template <class T>
const T* in(CPtr p) {
  return p.as<T>();
}
template <class T>
T* out(Ptr p) {
  return p.as<T>();
}

// An op's argument as its CPU kernel takes it: a typed buffer as a host
// pointer of T (checked against T), every other argument as it is.
template <class T, class A>
auto host(const A& a) {
  if constexpr (std::is_same_v<A, CPtr>) return in<T>(a);
  else if constexpr (std::is_same_v<A, Ptr>) return out<T>(a);
  else return a;
}
template <class T, class Kernel, class... A>
void on_host(Kernel kernel, const A&... a) {
  kernel(host<T>(a)...);
}

}  // namespace

#define OPEN const cpu::OpenGuard open_guard_(opaque())
#define I(p) in<T>(p)
#define O(p) out<T>(p)

template <class T>
CpuOps<T>::CpuOps(CpuMemory memory) {
  cpu::simd_init();  // WIOLA_SIMD: a bad value fails here, before any kernel runs
  cpu::blas_init();  // OpenBLAS's kernels for this CPU, before any product (kernels/cpu/blas.h)
  openblas_set_num_threads(1);
  if (memory == CpuMemory::Opaque) mem_ = std::make_unique<cpu::OpaqueMemory>();
}

template <class T>
CpuOps<T>::~CpuOps() = default;

template <class T>
const char* CpuOps<T>::name() const {
  if (mem_) return sizeof(T) == 4 ? "cpu-opaque-f32" : "cpu-opaque-f64";
  return sizeof(T) == 4 ? "cpu-f32" : "cpu-f64";
}

// ---- memory ----------------------------------------------------------------
template <class T>
void* CpuOps<T>::alloc_bytes(size_t bytes) {
  if (mem_) return mem_->alloc(bytes);
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  return p;
}
template <class T>
void CpuOps<T>::free_bytes(void* p) {
  if (mem_) mem_->free(p);
  else std::free(p);
}
template <class T>
void CpuOps<T>::upload(void* dst, const void* host_src, size_t bytes) {
  OPEN;
  if (bytes) std::memcpy(dst, host_src, bytes);
}
template <class T>
void CpuOps<T>::download(void* host_dst, const void* src, size_t bytes) {
  OPEN;
  if (bytes) std::memcpy(host_dst, src, bytes);
}
template <class T>
void CpuOps<T>::copy(void* dst, const void* src, size_t bytes) {
  OPEN;
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}
template <class T>
void CpuOps<T>::zero(void* p, size_t bytes) {
  OPEN;
  if (bytes) std::memset(p, 0, bytes);
}
template <class T>
bool CpuOps<T>::host_accessible() const {
  return !mem_;
}
// cpu-opaque keeps GEMM weights in a separate copy, as a GPU in bf16 does, so
// its suite proves the model refreshes the copy after every update.
template <class T>
Precision CpuOps<T>::precision() const {
  return {dtype_of<T>(), dtype_of<T>(), dtype_of<T>(), mem_ != nullptr};
}
template <class T>
void CpuOps<T>::convert(CPtr src, Ptr dst, size_t n) {
  OPEN;
  const T* s = I(src);
  T* d = O(dst);
  if (n && d != s) std::memmove(d, s, n * sizeof(T));
}

template <class T>
void CpuOps<T>::copy_block(Ptr dst, int ld_dst, CPtr src, int ld_src, int rows, int cols) {
  OPEN;
  if (rows <= 0 || cols <= 0) return;
  WIOLA_CHECK(ld_dst >= cols && ld_src >= cols, "copy_block: ", cols, " columns in rows of ", ld_dst, " and ", ld_src);
  const T* s = I(src);
  T* d = O(dst);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) std::memcpy(d + size_t(r) * ld_dst, s + size_t(r) * ld_src, size_t(cols) * sizeof(T));
}

// ---- BLAS ------------------------------------------------------------------
template <class T>
void CpuOps<T>::gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, CPtr B, int ldb, T beta, Ptr C,
                     int ldc) {
  OPEN;
  if (m <= 0 || n <= 0) return;
  if (gemm_log_) gemm_log_->push_back({ta, tb, m, n, k});
  parallel_gemm(ta, tb, m, n, k, alpha, I(A), lda, I(B), ldb, beta, O(C), ldc);
}
template <class T>
void CpuOps<T>::gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, long sA, CPtr B,
                                     int ldb, long sB, T beta, Ptr C, int ldc, long sC, int batch) {
  OPEN;
  if (m <= 0 || n <= 0) return;
  const T* a = I(A);
  const T* b = I(B);
  T* c = O(C);
  for (int i = 0; i < batch; ++i) {
    if (gemm_log_) gemm_log_->push_back({ta, tb, m, n, k});
    parallel_gemm(ta, tb, m, n, k, alpha, a + i * sA, lda, b + i * sB, ldb, beta, c + i * sC, ldc);
  }
}

// ---- every other op: cpu::NAME on host pointers ---------------------------------
// Its CPU kernel of the same name and arguments (kernels/cpu/kernels.h), each
// typed buffer as a host pointer of T.
#define WIOLA_BACKEND_OP(name, cls, params, args)
#define WIOLA_OP(name, cls, params, args) \
  template <class T> \
  void CpuOps<T>::name params { \
    OPEN; \
    on_host<T>([](auto... host_args) { cpu::name(host_args...); }, WIOLA_OP_ARGS args); \
  }
#include "kernels/op_list.h"

#undef OPEN
#undef I
#undef O

template class CpuOps<float>;
template class CpuOps<double>;

template <class T>
std::unique_ptr<Ops<T>> make_cpu_ops(CpuMemory memory) {
  return std::make_unique<CpuOps<T>>(memory);
}
template std::unique_ptr<Ops<float>> make_cpu_ops<float>(CpuMemory);
template std::unique_ptr<Ops<double>> make_cpu_ops<double>(CpuMemory);

}  // namespace wiola
