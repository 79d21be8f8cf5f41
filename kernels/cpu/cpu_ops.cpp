// CpuOps: host memory, OpenBLAS matrix products, and forwards to the op
// bodies in kernels/cpu/*.cpp (declared in kernels/cpu/kernels.h) and the
// attention kernels (kernels/cpu/attention.h).
#include "kernels/cpu/cpu_ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernels.h"
#include "util/error.h"

namespace wiola {
namespace {

CBLAS_TRANSPOSE cblas_trans(Trans t) {
  return t == Trans::N ? CblasNoTrans : CblasTrans;
}

void blas_gemm(Trans ta, Trans tb, int m, int n, int k, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta,
               float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), m, n, k, alpha,
              A, lda, B, ldb, beta, C, ldc);
}

void blas_gemm(Trans ta, Trans tb, int m, int n, int k, double alpha,
               const double* A, int lda, const double* B, int ldb, double beta,
               double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), m, n, k, alpha,
              A, lda, B, ldb, beta, C, ldc);
}

// C = op(A) op(B) split into one block of rows (or columns) per OpenMP
// thread, each a single-threaded BLAS call. OpenBLAS runs with one thread:
// its own pthread pool next to OpenMP's spinning workers oversubscribes the
// cores (measured: 15 % of a step in sched_yield). The split only depends on
// the thread count, so results are deterministic for a fixed count.
template <class T>
void parallel_gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, const T* A,
                   int lda, const T* B, int ldb, T beta, T* C, int ldc) {
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

}  // namespace

template <class T>
CpuOps<T>::CpuOps() {
  openblas_set_num_threads(1);
}

template <class T>
const char* CpuOps<T>::name() const {
  return sizeof(T) == 4 ? "cpu-f32" : "cpu-f64";
}

// ---- memory ----------------------------------------------------------------
template <class T>
void* CpuOps<T>::alloc_bytes(size_t bytes) {
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return p;
}
template <class T>
void CpuOps<T>::free_bytes(void* p) {
  std::free(p);
}
template <class T>
void CpuOps<T>::upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}
template <class T>
void CpuOps<T>::download(void* host_dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}
template <class T>
void CpuOps<T>::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memcpy(dst, src, bytes);
}
template <class T>
void CpuOps<T>::zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}

// ---- BLAS ------------------------------------------------------------------
template <class T>
void CpuOps<T>::gemm(Trans ta, Trans tb, int m, int n, int k, T alpha,
                     const T* A, int lda, const T* B, int ldb, T beta, T* C,
                     int ldc) {
  if (m <= 0 || n <= 0) return;
  parallel_gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
template <class T>
void CpuOps<T>::gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k,
                                     T alpha, const T* A, int lda, long sA,
                                     const T* B, int ldb, long sB, T beta,
                                     T* C, int ldc, long sC, int batch) {
  if (m <= 0 || n <= 0) return;
  for (int i = 0; i < batch; ++i)
    parallel_gemm(ta, tb, m, n, k, alpha, A + i * sA, lda, B + i * sB, ldb, beta,
                  C + i * sC, ldc);
}

// ---- elementwise and reductions ----------------------------------------------
template <class T>
void CpuOps<T>::add(const T* a, const T* b, T* out, size_t n) {
  cpu::add(a, b, out, n);
}
template <class T>
void CpuOps<T>::axpy(T alpha, const T* x, T* y, size_t n) {
  cpu::axpy(alpha, x, y, n);
}
template <class T>
void CpuOps<T>::scale(T* x, T s, size_t n) {
  cpu::scale(x, s, n);
}
template <class T>
double CpuOps<T>::sum_squares(const T* x, size_t n) {
  return cpu::sum_squares(x, n);
}
template <class T>
double CpuOps<T>::sum(const T* x, size_t n) {
  return cpu::sum(x, n);
}

// ---- embedding -----------------------------------------------------------------
template <class T>
void CpuOps<T>::embedding_fwd(const int32_t* ids, int N, const T* E, int v0,
                              int V_local, int d, T* out) {
  cpu::embedding_fwd(ids, N, E, v0, V_local, d, out);
}
template <class T>
void CpuOps<T>::embedding_bwd(const int32_t* ids, int N, const T* dout,
                              int v0, int V_local, int d, T* dE) {
  cpu::embedding_bwd(ids, N, dout, v0, V_local, d, dE);
}

// ---- RMSNorm, SRPE -----------------------------------------------------------------
template <class T>
void CpuOps<T>::rmsnorm_fwd(const T* x, const T* gamma, const T* delta, int N,
                            int d, double eps, T* y, T* rstd) {
  cpu::rmsnorm_fwd(x, gamma, delta, N, d, eps, y, rstd);
}
template <class T>
void CpuOps<T>::rmsnorm_bwd(const T* x, const T* gamma, const T* delta,
                            const T* rstd, const T* dy, int N, int d, T* dx,
                            T* dgamma, T* ddelta) {
  cpu::rmsnorm_bwd(x, gamma, delta, rstd, dy, N, d, dx, dgamma, ddelta);
}
template <class T>
void CpuOps<T>::srpe_apply(T* x, int B, int Tn, int nh, int dh,
                           const T* table, bool inverse) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_apply: head dim ", dh, " is odd");
  cpu::srpe_apply(x, B, Tn, nh, dh, table, inverse);
}

// ---- attention ---------------------------------------------------------------------
template <class T>
void CpuOps<T>::attention_fwd(const AttnShape& s, const AttnKeys& keys,
                              const T* q, const T* k, const T* v,
                              const T* raw_k, const T* raw_v, T* o, T* lse) {
  cpu::attention_fwd(s, keys, q, k, v, raw_k, raw_v, o, lse);
}
template <class T>
void CpuOps<T>::attention_bwd(const AttnShape& s, const AttnKeys& keys,
                              const T* q, const T* k, const T* v,
                              const T* raw_k, const T* raw_v, const T* o,
                              const T* lse, const T* dout, T* dq, T* dk,
                              T* dv, T* draw_k, T* draw_v) {
  cpu::attention_bwd(s, keys, q, k, v, raw_k, raw_v, o, lse, dout, dq, dk, dv,
                     draw_k, draw_v);
}

// ---- ATM ---------------------------------------------------------------------------
template <class T>
void CpuOps<T>::atm_similarity(const T* x, int B, int Tn, int d,
                               double* rho_host) {
  cpu::atm_similarity(x, B, Tn, d, rho_host);
}
template <class T>
void CpuOps<T>::atm_merge_rows(const T* x, int B, int Tn, int w,
                               const int32_t* group_first,
                               const int32_t* key_end,
                               const int32_t* n_groups, T* out) {
  cpu::atm_merge_rows(x, B, Tn, w, group_first, key_end, n_groups, out);
}
template <class T>
void CpuOps<T>::atm_merge_rows_bwd(const T* dout, int B, int Tn, int w,
                                   const int32_t* group_first,
                                   const int32_t* key_end,
                                   const int32_t* n_groups, T* dx) {
  cpu::atm_merge_rows_bwd(dout, B, Tn, w, group_first, key_end, n_groups, dx);
}

// ---- GCLA pieces ---------------------------------------------------------------------
template <class T>
void CpuOps<T>::prefix_mean_fwd(const T* x, int B, int Tn, int d, T* out) {
  cpu::prefix_mean_fwd(x, B, Tn, d, out);
}
template <class T>
void CpuOps<T>::prefix_mean_bwd(const T* dout, int B, int Tn, int d, T* dx) {
  cpu::prefix_mean_bwd(dout, B, Tn, d, dx);
}
template <class T>
void CpuOps<T>::prefix_mean_carry_fwd(const T* x, int B, int Tn, int d,
                                      int pos0, T* carry, T* out) {
  cpu::prefix_mean_carry_fwd(x, B, Tn, d, pos0, carry, out);
}
template <class T>
void CpuOps<T>::ctx_attention_fwd(const T* q, const T* kc, const T* vc, int N,
                                  int nc, int H, int Hkv, int dh, T* out,
                                  T* probs) {
  cpu::ctx_attention_fwd(q, kc, vc, N, nc, H, Hkv, dh, out, probs);
}
template <class T>
void CpuOps<T>::ctx_attention_bwd(const T* q, const T* kc, const T* vc,
                                  const T* probs, const T* dout, int N, int nc,
                                  int H, int Hkv, int dh, T* dq, T* dkc,
                                  T* dvc) {
  cpu::ctx_attention_bwd(q, kc, vc, probs, dout, N, nc, H, Hkv, dh, dq, dkc,
                         dvc);
}
template <class T>
void CpuOps<T>::blend_fwd(const T* o_self, const T* o_ctx, double phi,
                          size_t n, T* out) {
  cpu::blend_fwd(o_self, o_ctx, phi, n, out);
}
template <class T>
double CpuOps<T>::blend_bwd(const T* o_self, const T* o_ctx, double phi,
                            const T* dout, size_t n, T* d_self, T* d_ctx) {
  return cpu::blend_bwd(o_self, o_ctx, phi, dout, n, d_self, d_ctx);
}
template <class T>
void CpuOps<T>::sigmoid_gate_fwd(const T* pre, const T* x, size_t n, T* out) {
  cpu::sigmoid_gate_fwd(pre, x, n, out);
}
template <class T>
void CpuOps<T>::sigmoid_gate_bwd(const T* pre, const T* x, const T* dout,
                                 size_t n, T* dpre, T* dx) {
  cpu::sigmoid_gate_bwd(pre, x, dout, n, dpre, dx);
}

// ---- DSFF pieces ---------------------------------------------------------------------
template <class T>
void CpuOps<T>::swiglu_fwd(const T* g, const T* u, size_t n, T* h) {
  cpu::swiglu_fwd(g, u, n, h);
}
template <class T>
void CpuOps<T>::swiglu_bwd(const T* g, const T* u, const T* dh, size_t n,
                           T* dg, T* du) {
  cpu::swiglu_bwd(g, u, dh, n, dg, du);
}
template <class T>
void CpuOps<T>::gelu_fwd(const T* x, size_t n, T* y) {
  cpu::gelu_fwd(x, n, y);
}
template <class T>
void CpuOps<T>::gelu_bwd(const T* x, const T* dy, size_t n, T* dx) {
  cpu::gelu_bwd(x, dy, n, dx);
}
template <class T>
void CpuOps<T>::fusion_fwd(const T* pre, const T* a, const T* b, size_t n,
                           T* out) {
  cpu::fusion_fwd(pre, a, b, n, out);
}
template <class T>
void CpuOps<T>::fusion_bwd(const T* pre, const T* a, const T* b,
                           const T* dout, size_t n, T* dpre, T* da, T* db) {
  cpu::fusion_bwd(pre, a, b, dout, n, dpre, da, db);
}

// ---- cross-entropy ---------------------------------------------------------------------
template <class T>
void CpuOps<T>::ce_row_max(const T* logits, int N, int V_local, T* row_max) {
  cpu::ce_row_max(logits, N, V_local, row_max);
}
template <class T>
void CpuOps<T>::ce_sumexp_target(const T* logits, const int32_t* targets,
                                 int N, int V_local, int v0, const T* row_max,
                                 T* sumexp, T* tgt) {
  cpu::ce_sumexp_target(logits, targets, N, V_local, v0, row_max, sumexp, tgt);
}
template <class T>
void CpuOps<T>::ce_loss_grad(T* logits, const int32_t* targets, int N,
                             int V_local, int v0, const T* row_max,
                             const T* sumexp, const T* tgt, double scale,
                             T* loss) {
  cpu::ce_loss_grad(logits, targets, N, V_local, v0, row_max, sumexp, tgt,
                    scale, loss);
}
template <class T>
void CpuOps<T>::ce_loss(const T* logits, const int32_t* targets, int N,
                        int V_local, int v0, const T* row_max, const T* sumexp,
                        const T* tgt, T* loss) {
  cpu::ce_loss(logits, targets, N, V_local, v0, row_max, sumexp, tgt, loss);
}

// ---- optimizer -------------------------------------------------------------------------
template <class T>
void CpuOps<T>::adamw(T* p, const T* g, T* m, T* v, size_t n, double lr,
                      double beta1, double beta2, double eps, double wd,
                      double bc1, double bc2) {
  cpu::adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2);
}

template class CpuOps<float>;
template class CpuOps<double>;

template <class T>
std::unique_ptr<Ops<T>> make_cpu_ops() {
  return std::make_unique<CpuOps<T>>();
}
template std::unique_ptr<Ops<float>> make_cpu_ops<float>();
template std::unique_ptr<Ops<double>> make_cpu_ops<double>();

}  // namespace wiola
