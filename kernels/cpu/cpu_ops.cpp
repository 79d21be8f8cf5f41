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

#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/blas.h"
#include "kernels/atm_plan.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
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

// The typed pointers of an op, checked against the backend's compute type.
template <class T>
const T* in(CPtr p) { return p.as<T>(); }
template <class T>
T* out(Ptr p) { return p.as<T>(); }

// A norm's or prefix mean's GEMM operand copy (storage is T here: the values
// themselves).
template <class T>
void copy_operand(CPtr y, Ptr y_op, size_t n) {
  if (y_op && n) std::memcpy(out<T>(y_op), in<T>(y), n * sizeof(T));
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
  WIOLA_CHECK(ld_dst >= cols && ld_src >= cols, "copy_block: ", cols, " columns in rows of ", ld_dst, " and ",
              ld_src);
  const T* s = I(src);
  T* d = O(dst);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r)
    std::memcpy(d + size_t(r) * ld_dst, s + size_t(r) * ld_src, size_t(cols) * sizeof(T));
}

// ---- BLAS ------------------------------------------------------------------
template <class T>
void CpuOps<T>::gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A,
                     int lda, CPtr B, int ldb, T beta, Ptr C, int ldc) {
  OPEN;
  if (m <= 0 || n <= 0) return;
  if (gemm_log_) gemm_log_->push_back({ta, tb, m, n, k});
  parallel_gemm(ta, tb, m, n, k, alpha, I(A), lda, I(B), ldb, beta, O(C), ldc);
}
template <class T>
void CpuOps<T>::gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k,
                                     T alpha, CPtr A, int lda, long sA,
                                     CPtr B, int ldb, long sB, T beta, Ptr C,
                                     int ldc, long sC, int batch) {
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

// ---- elementwise and reductions ----------------------------------------------
template <class T>
void CpuOps<T>::add(CPtr a, CPtr b, Ptr o, size_t n) {
  OPEN;
  cpu::add(I(a), I(b), O(o), n);
}
template <class T>
void CpuOps<T>::axpy(T alpha, CPtr x, Ptr y, size_t n) {
  OPEN;
  cpu::axpy(alpha, I(x), O(y), n);
}
template <class T>
void CpuOps<T>::scale(Ptr x, T s, size_t n) {
  OPEN;
  cpu::scale(O(x), s, n);
}
template <class T>
void CpuOps<T>::sum_squares(CPtr x, size_t n, double* acc) {
  OPEN;
  acc[0] += cpu::sum_squares(I(x), n);
}
template <class T>
void CpuOps<T>::sum(CPtr x, size_t n, double* acc) {
  OPEN;
  acc[0] += cpu::sum(I(x), n);
}
template <class T>
void CpuOps<T>::accumulate(const double* x, Ptr y, size_t n) {
  OPEN;
  T* d = O(y);
  for (size_t i = 0; i < n; ++i) d[i] = T(double(d[i]) + x[i]);
}

// ---- embedding -----------------------------------------------------------------
template <class T>
void CpuOps<T>::embedding_fwd(const int32_t* ids, int N, CPtr E, int v0,
                              int V_local, int d, Ptr o) {
  OPEN;
  cpu::embedding_fwd(ids, N, I(E), v0, V_local, d, O(o));
}
template <class T>
void CpuOps<T>::embedding_bwd(const int32_t* ids, int N, CPtr dout, int v0,
                              int V_local, int d, Ptr dE) {
  OPEN;
  cpu::embedding_bwd(ids, N, I(dout), v0, V_local, d, O(dE));
}

// ---- RMSNorm, SRPE -----------------------------------------------------------------
template <class T>
void CpuOps<T>::rmsnorm_fwd(CPtr x, CPtr gamma, CPtr delta, int N, int d,
                            double eps, Ptr y, Ptr rstd, Ptr y_op) {
  OPEN;
  cpu::rmsnorm_fwd(I(x), I(gamma), I(delta), N, d, eps, O(y), O(rstd));
  copy_operand<T>(y, y_op, size_t(N) * size_t(d));
}
template <class T>
void CpuOps<T>::add_rmsnorm_fwd(CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N,
                                int d, double eps, Ptr y, Ptr rstd, Ptr y_op) {
  OPEN;
  cpu::add_rmsnorm_fwd(I(a), I(b), O(s), I(gamma), I(delta), N, d, eps, O(y), O(rstd));
  copy_operand<T>(y, y_op, size_t(N) * size_t(d));
}
template <class T>
void CpuOps<T>::rmsnorm_bwd(CPtr x, CPtr gamma, CPtr delta, CPtr rstd,
                            CPtr dy, int N, int d, CPtr dres, Ptr dx, Ptr dgamma,
                            Ptr ddelta) {
  OPEN;
  cpu::rmsnorm_bwd(I(x), I(gamma), I(delta), I(rstd), I(dy), N, d, I(dres), O(dx), O(dgamma),
                   O(ddelta));
}
template <class T>
void CpuOps<T>::srpe_apply(Ptr x, int B, int Tn, int nh, int dh, CPtr table,
                           bool inverse) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_apply: head dim ", dh, " is odd");
  OPEN;
  cpu::srpe_apply(O(x), B, Tn, nh, dh, I(table), inverse);
}
template <class T>
void CpuOps<T>::srpe_split_fwd(CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, Ptr q, Ptr k, Ptr v,
                               Ptr gate) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_split_fwd: head dim ", dh, " is odd");
  OPEN;
  cpu::srpe_split_fwd(I(proj), B, Tn, H, Hkv, dh, I(table), O(q), O(k), O(v), O(gate));
}
template <class T>
void CpuOps<T>::srpe_split_bwd(CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh,
                               CPtr table, Ptr dproj) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_split_bwd: head dim ", dh, " is odd");
  OPEN;
  cpu::srpe_split_bwd(I(dq), I(dk), I(dv), I(dgate), B, Tn, H, Hkv, dh, I(table), O(dproj));
}

// ---- attention ---------------------------------------------------------------------
template <class T>
void CpuOps<T>::attention_fwd(const AttnShape& s, const AttnKeys& keys,
                              CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                              Ptr o, Ptr lse) {
  OPEN;
  cpu::attention_fwd(s, keys, I(q), I(k), I(v), I(raw_k), I(raw_v), O(o), O(lse));
}
template <class T>
void CpuOps<T>::attention_bwd(const AttnShape& s, const AttnKeys& keys,
                              CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                              CPtr o, CPtr lse, CPtr dout, Ptr dq, Ptr dk,
                              Ptr dv, Ptr draw_k, Ptr draw_v) {
  OPEN;
  cpu::attention_bwd(s, keys, I(q), I(k), I(v), I(raw_k), I(raw_v), I(o), I(lse), I(dout), O(dq),
                     O(dk), O(dv), O(draw_k), O(draw_v));
}

// ---- ATM ---------------------------------------------------------------------------
template <class T>
void CpuOps<T>::atm_similarity(CPtr x, int B, int Tn, int d, double* rho) {
  OPEN;
  cpu::atm_similarity(I(x), B, Tn, d, rho);
}
template <class T>
void CpuOps<T>::atm_plan(const double* rho, int B, int Tn, double tau,
                         uint8_t* open, int32_t* group_first,
                         int32_t* key_end, int32_t* n_groups) {
  OPEN;
  for (int b = 0; b < B; ++b) {
    uint8_t* ob = open + size_t(b) * Tn;
    atm_greedy_row(rho + size_t(b) * (Tn - 1), Tn, tau, ob);
    n_groups[b] = atm_layout_row(ob, Tn, group_first + size_t(b) * Tn, key_end + size_t(b) * Tn);
  }
}
template <class T>
void CpuOps<T>::atm_merge_rows(CPtr x, int B, int Tn, int w,
                               const int32_t* group_first,
                               const int32_t* key_end,
                               const int32_t* n_groups, Ptr o) {
  OPEN;
  cpu::atm_merge_rows(I(x), B, Tn, w, group_first, key_end, n_groups, O(o));
}
template <class T>
void CpuOps<T>::atm_merge_rows_bwd(CPtr dout, int B, int Tn, int w,
                                   const int32_t* group_first,
                                   const int32_t* key_end,
                                   const int32_t* n_groups, Ptr dx) {
  OPEN;
  cpu::atm_merge_rows_bwd(I(dout), B, Tn, w, group_first, key_end, n_groups, O(dx));
}

// ---- GCLA pieces ---------------------------------------------------------------------
template <class T>
void CpuOps<T>::prefix_mean_fwd(CPtr x, int B, int Tn, int d, Ptr o, Ptr o_op) {
  OPEN;
  cpu::prefix_mean_fwd(I(x), B, Tn, d, O(o));
  copy_operand<T>(o, o_op, size_t(B) * size_t(Tn) * size_t(d));
}
template <class T>
void CpuOps<T>::prefix_mean_bwd(CPtr dout, int B, int Tn, int d, Ptr dx) {
  OPEN;
  cpu::prefix_mean_bwd(I(dout), B, Tn, d, O(dx));
}
template <class T>
void CpuOps<T>::prefix_mean_carry_fwd(CPtr x, int B, int Tn, int d, int pos0,
                                      Ptr carry, Ptr o, Ptr o_op) {
  OPEN;
  cpu::prefix_mean_carry_fwd(I(x), B, Tn, d, pos0, O(carry), O(o));
  copy_operand<T>(o, o_op, size_t(B) * size_t(Tn) * size_t(d));
}
template <class T>
void CpuOps<T>::ctx_attention_fwd(CPtr q, CPtr kc, CPtr vc, int N, int nc,
                                  int H, int Hkv, int dh, int ldkv, Ptr o, Ptr probs) {
  OPEN;
  cpu::ctx_attention_fwd(I(q), I(kc), I(vc), N, nc, H, Hkv, dh, ldkv, O(o), O(probs));
}
template <class T>
void CpuOps<T>::ctx_attention_bwd(CPtr q, CPtr kc, CPtr vc, CPtr probs,
                                  CPtr dout, int N, int nc, int H, int Hkv,
                                  int dh, int ldkv, Ptr dq, Ptr dkc, Ptr dvc) {
  OPEN;
  cpu::ctx_attention_bwd(I(q), I(kc), I(vc), I(probs), I(dout), N, nc, H, Hkv, dh, ldkv, O(dq),
                         O(dkc), O(dvc));
}
template <class T>
void CpuOps<T>::blend_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr o) {
  OPEN;
  cpu::blend_fwd(I(o_self), I(o_ctx), double(I(phi)[0]), n, O(o));
}
template <class T>
void CpuOps<T>::blend_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout,
                          size_t n, Ptr d_self, Ptr d_ctx, double* dphi) {
  OPEN;
  dphi[0] = cpu::blend_bwd(I(o_self), I(o_ctx), double(I(phi)[0]), I(dout), n, O(d_self), O(d_ctx));
}
template <class T>
void CpuOps<T>::sigmoid_gate_fwd(CPtr pre, CPtr x, size_t n, Ptr o) {
  OPEN;
  cpu::sigmoid_gate_fwd(I(pre), I(x), n, O(o));
}
template <class T>
void CpuOps<T>::sigmoid_gate_bwd(CPtr pre, CPtr x, CPtr dout, size_t n,
                                 Ptr dpre, Ptr dx) {
  OPEN;
  cpu::sigmoid_gate_bwd(I(pre), I(x), I(dout), n, O(dpre), O(dx));
}
// The fused blend and gate as the two kernels one after the other: the same
// bits (storage is T here, so nothing is rounded between them).
template <class T>
void CpuOps<T>::blend_gate_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, size_t n, Ptr o, Ptr og) {
  OPEN;
  cpu::blend_fwd(I(o_self), I(o_ctx), double(I(phi)[0]), n, O(o));
  cpu::sigmoid_gate_fwd(I(pre), I(o), n, O(og));
}
template <class T>
void CpuOps<T>::blend_gate_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, CPtr o, CPtr dog, size_t n,
                               Ptr dpre, Ptr d_self, Ptr d_ctx, double* dphi) {
  OPEN;
  const std::unique_ptr<T[]> d_o(new T[n]);  // dL/do, between the two
  cpu::sigmoid_gate_bwd(I(pre), I(o), I(dog), n, O(dpre), d_o.get());
  dphi[0] = cpu::blend_bwd(I(o_self), I(o_ctx), double(I(phi)[0]), d_o.get(), n, O(d_self), O(d_ctx));
}

// ---- DSFF pieces ---------------------------------------------------------------------
template <class T>
void CpuOps<T>::swiglu_fwd(CPtr g, CPtr u, size_t n, Ptr h) {
  OPEN;
  cpu::swiglu_fwd(I(g), I(u), n, O(h));
}
template <class T>
void CpuOps<T>::swiglu_bwd(CPtr g, CPtr u, CPtr dh, size_t n, Ptr dg, Ptr du) {
  OPEN;
  cpu::swiglu_bwd(I(g), I(u), I(dh), n, O(dg), O(du));
}
template <class T>
void CpuOps<T>::gelu_fwd(CPtr x, size_t n, Ptr y) {
  OPEN;
  cpu::gelu_fwd(I(x), n, O(y));
}
template <class T>
void CpuOps<T>::gelu_bwd(CPtr x, CPtr dy, size_t n, Ptr dx) {
  OPEN;
  cpu::gelu_bwd(I(x), I(dy), n, O(dx));
}
template <class T>
void CpuOps<T>::fusion_fwd(CPtr pre, CPtr a, CPtr b, CPtr res, size_t n, Ptr o) {
  OPEN;
  cpu::fusion_fwd(I(pre), I(a), I(b), I(res), n, O(o));
}
template <class T>
void CpuOps<T>::fusion_bwd(CPtr pre, CPtr a, CPtr b, CPtr dout, size_t n,
                           Ptr dpre, Ptr da, Ptr db) {
  OPEN;
  cpu::fusion_bwd(I(pre), I(a), I(b), I(dout), n, O(dpre), O(da), O(db));
}

// ---- cross-entropy ---------------------------------------------------------------------
template <class T>
void CpuOps<T>::ce_row_max(CPtr logits, int N, int V_local, Ptr row_max) {
  OPEN;
  cpu::ce_row_max(I(logits), N, V_local, O(row_max));
}
template <class T>
void CpuOps<T>::ce_sumexp_target(CPtr logits, const int32_t* targets, int N,
                                 int V_local, int v0, CPtr row_max,
                                 Ptr sumexp, Ptr tgt) {
  OPEN;
  cpu::ce_sumexp_target(I(logits), targets, N, V_local, v0, I(row_max), O(sumexp), O(tgt));
}
template <class T>
void CpuOps<T>::ce_loss_grad(Ptr logits, const int32_t* targets, int N,
                             int V_local, int v0, CPtr row_max, CPtr sumexp,
                             CPtr tgt, double scale, Ptr loss) {
  OPEN;
  cpu::ce_loss_grad(O(logits), targets, N, V_local, v0, I(row_max), I(sumexp), I(tgt), scale,
                    O(loss));
}
template <class T>
void CpuOps<T>::ce_loss(CPtr logits, const int32_t* targets, int N,
                        int V_local, int v0, CPtr row_max, CPtr sumexp,
                        CPtr tgt, Ptr loss) {
  OPEN;
  cpu::ce_loss(I(logits), targets, N, V_local, v0, I(row_max), I(sumexp), I(tgt), O(loss));
}

// ---- optimizer -------------------------------------------------------------------------
template <class T>
void CpuOps<T>::adamw(Ptr p, Ptr g, Ptr m, Ptr v, size_t n, double lr,
                      double beta1, double beta2, double eps, double wd,
                      double bc1, double bc2, Ptr w, bool zero_grad) {
  OPEN;
  cpu::adamw(O(p), O(g), O(m), O(v), n, lr, beta1, beta2, eps, wd, bc1, bc2, O(w), zero_grad);
}

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
