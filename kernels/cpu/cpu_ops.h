// The CPU backend of the op interface (kernels/ops.h): OpenBLAS for the
// matrix products, OpenMP loops for everything else, float (training) and
// double (gradient checks). The op bodies live in one file per family, as
// free functions in wiola::cpu (kernels/cpu/kernels.h); this class forwards.
//
// Threading: static OpenMP schedules over rows/tokens; every reduction is
// combined in a fixed order, so results repeat exactly for a fixed
// OMP_NUM_THREADS.
#pragma once

#include "kernels/ops.h"

namespace wiola {

template <class T>
class CpuOps final : public Ops<T> {
 public:
  CpuOps();
  const char* name() const override;

  void* alloc_bytes(size_t bytes) override;
  void free_bytes(void* p) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;

  void gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, const T* A,
            int lda, const T* B, int ldb, T beta, T* C, int ldc) override;
  void gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k, T alpha,
                            const T* A, int lda, long sA, const T* B, int ldb,
                            long sB, T beta, T* C, int ldc, long sC,
                            int batch) override;

  void add(const T* a, const T* b, T* out, size_t n) override;
  void axpy(T alpha, const T* x, T* y, size_t n) override;
  void scale(T* x, T s, size_t n) override;
  double sum_squares(const T* x, size_t n) override;
  double sum(const T* x, size_t n) override;

  void embedding_fwd(const int32_t* ids, int N, const T* E, int v0,
                     int V_local, int d, T* out) override;
  void embedding_bwd(const int32_t* ids, int N, const T* dout, int v0,
                     int V_local, int d, T* dE) override;

  void rmsnorm_fwd(const T* x, const T* gamma, const T* delta, int N, int d,
                   double eps, T* y, T* rstd) override;
  void rmsnorm_bwd(const T* x, const T* gamma, const T* delta, const T* rstd,
                   const T* dy, int N, int d, T* dx, T* dgamma,
                   T* ddelta) override;

  void srpe_apply(T* x, int B, int Tn, int nh, int dh, const T* table,
                  bool inverse) override;

  void attention_fwd(const AttnShape& s, const AttnKeys& keys, const T* q,
                     const T* k, const T* v, const T* raw_k, const T* raw_v,
                     T* o, T* lse) override;
  void attention_bwd(const AttnShape& s, const AttnKeys& keys, const T* q,
                     const T* k, const T* v, const T* raw_k, const T* raw_v,
                     const T* o, const T* lse, const T* dout, T* dq, T* dk,
                     T* dv, T* draw_k, T* draw_v) override;

  void atm_similarity(const T* x, int B, int Tn, int d,
                      double* rho_host) override;
  void atm_merge_rows(const T* x, int B, int Tn, int w,
                      const int32_t* group_first, const int32_t* key_end,
                      const int32_t* n_groups, T* out) override;
  void atm_merge_rows_bwd(const T* dout, int B, int Tn, int w,
                          const int32_t* group_first, const int32_t* key_end,
                          const int32_t* n_groups, T* dx) override;

  void prefix_mean_fwd(const T* x, int B, int Tn, int d, T* out) override;
  void prefix_mean_bwd(const T* dout, int B, int Tn, int d, T* dx) override;
  void prefix_mean_carry_fwd(const T* x, int B, int Tn, int d, int pos0,
                             T* carry, T* out) override;
  void ctx_attention_fwd(const T* q, const T* kc, const T* vc, int N, int nc,
                         int H, int Hkv, int dh, T* out, T* probs) override;
  void ctx_attention_bwd(const T* q, const T* kc, const T* vc, const T* probs,
                         const T* dout, int N, int nc, int H, int Hkv, int dh,
                         T* dq, T* dkc, T* dvc) override;
  void blend_fwd(const T* o_self, const T* o_ctx, double phi, size_t n,
                 T* out) override;
  double blend_bwd(const T* o_self, const T* o_ctx, double phi, const T* dout,
                   size_t n, T* d_self, T* d_ctx) override;
  void sigmoid_gate_fwd(const T* pre, const T* x, size_t n, T* out) override;
  void sigmoid_gate_bwd(const T* pre, const T* x, const T* dout, size_t n,
                        T* dpre, T* dx) override;

  void swiglu_fwd(const T* g, const T* u, size_t n, T* h) override;
  void swiglu_bwd(const T* g, const T* u, const T* dh, size_t n, T* dg,
                  T* du) override;
  void gelu_fwd(const T* x, size_t n, T* y) override;
  void gelu_bwd(const T* x, const T* dy, size_t n, T* dx) override;
  void fusion_fwd(const T* pre, const T* a, const T* b, size_t n,
                  T* out) override;
  void fusion_bwd(const T* pre, const T* a, const T* b, const T* dout,
                  size_t n, T* dpre, T* da, T* db) override;

  void ce_row_max(const T* logits, int N, int V_local, T* row_max) override;
  void ce_sumexp_target(const T* logits, const int32_t* targets, int N,
                        int V_local, int v0, const T* row_max, T* sumexp,
                        T* tgt) override;
  void ce_loss_grad(T* logits, const int32_t* targets, int N, int V_local,
                    int v0, const T* row_max, const T* sumexp, const T* tgt,
                    double scale, T* loss) override;
  void ce_loss(const T* logits, const int32_t* targets, int N, int V_local,
               int v0, const T* row_max, const T* sumexp, const T* tgt,
               T* loss) override;

  void adamw(T* p, const T* g, T* m, T* v, size_t n, double lr, double beta1,
             double beta2, double eps, double wd, double bc1,
             double bc2) override;
};

extern template class CpuOps<float>;
extern template class CpuOps<double>;

}  // namespace wiola
