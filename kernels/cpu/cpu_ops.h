// The CPU backend of the op interface (kernels/ops.h): OpenBLAS for the
// matrix products, OpenMP loops for everything else, float (training) and
// double (gradient checks). The op bodies live in one file per family, as
// free functions in wiola::cpu on host pointers (kernels/cpu/kernels.h);
// this class checks each typed pointer's dtype and forwards.
//
// Memory: host memory, or (CpuMemory::Opaque, the "cpu-opaque" debug
// backend) memory the host cannot touch outside these functions; see
// kernels/cpu/opaque_memory.h. Every function below opens it for its
// duration.
//
// Threading: static OpenMP schedules over rows/tokens; every reduction is
// combined in a fixed order, so results repeat exactly for a fixed
// OMP_NUM_THREADS.
#pragma once

#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/opaque_memory.h"
#include "kernels/ops.h"

namespace wiola {

// One matrix product as the backend was asked for it (C[m x n] = op(A) op(B),
// inner dimension k).
struct GemmShape {
  Trans ta, tb;
  int m, n, k;
};

template <class T>
class CpuOps final : public Ops<T> {
 public:
  // While set, every gemm call appends its shape here (wiola bench step
  // replays one step's shapes to measure the BLAS rate on exactly them);
  // null stops recording.
  void record_gemm_shapes(std::vector<GemmShape>* log) { gemm_log_ = log; }

  explicit CpuOps(CpuMemory memory = CpuMemory::Host);
  ~CpuOps() override;
  const char* name() const override;
  void* alloc_bytes(size_t bytes) override;
  void free_bytes(void* p) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  bool host_accessible() const override;
  Precision precision() const override;
  void convert(CPtr src, Ptr dst, size_t n) override;
  void copy_block(Ptr dst, int ld_dst, CPtr src, int ld_src, int rows, int cols) override;
  void gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, CPtr B, int ldb, T beta, Ptr C, int ldc) override;
  void gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, long sA, CPtr B, int ldb, long sB, T beta, Ptr C, int ldc, long sC, int batch) override;
  void add(CPtr a, CPtr b, Ptr out, size_t n) override;
  void axpy(T alpha, CPtr x, Ptr y, size_t n) override;
  void scale(Ptr x, T s, size_t n) override;
  void sum_squares(CPtr x, size_t n, double* acc) override;
  void sum(CPtr x, size_t n, double* acc) override;
  void accumulate(const double* x, Ptr y, size_t n) override;
  void embedding_fwd(const int32_t* ids, int N, CPtr E, int v0, int V_local, int d, Ptr out) override;
  void embedding_bwd(const int32_t* ids, int N, CPtr dout, int v0, int V_local, int d, Ptr dE) override;
  void rmsnorm_fwd(CPtr x, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd, Ptr y_op) override;
  void add_rmsnorm_fwd(CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y,
                       Ptr rstd, Ptr y_op) override;
  void rmsnorm_bwd(CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres, Ptr dx,
                   Ptr dgamma, Ptr ddelta) override;
  void srpe_apply(Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse) override;
  void srpe_split_fwd(CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, Ptr q, Ptr k, Ptr v,
                      Ptr gate) override;
  void srpe_split_bwd(CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh, CPtr table,
                      Ptr dproj) override;
  void attention_fwd(const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o, Ptr lse) override;
  void attention_bwd(const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, CPtr o, CPtr lse, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) override;
  void atm_similarity(CPtr x, int B, int Tn, int d, double* rho) override;
  void atm_plan(const double* rho, int B, int Tn, double tau, uint8_t* open, int32_t* group_first, int32_t* key_end, int32_t* n_groups) override;
  void atm_merge_rows(CPtr x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups, Ptr out) override;
  void atm_merge_rows_bwd(CPtr dout, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups, Ptr dx) override;
  void prefix_mean_fwd(CPtr x, int B, int Tn, int d, Ptr out, Ptr out_op) override;
  void prefix_mean_bwd(CPtr dout, int B, int Tn, int d, Ptr dx) override;
  void prefix_mean_carry_fwd(CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out, Ptr out_op) override;
  void ctx_attention_fwd(CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, int ldkv, Ptr out, Ptr probs) override;
  void ctx_attention_bwd(CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H, int Hkv, int dh, int ldkv, Ptr dq, Ptr dkc, Ptr dvc) override;
  void blend_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out) override;
  void blend_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx, double* dphi) override;
  void sigmoid_gate_fwd(CPtr pre, CPtr x, size_t n, Ptr out) override;
  void sigmoid_gate_bwd(CPtr pre, CPtr x, CPtr dout, size_t n, Ptr dpre, Ptr dx) override;
  void blend_gate_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, size_t n, Ptr o, Ptr og) override;
  void blend_gate_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, CPtr o, CPtr dog, size_t n, Ptr dpre,
                      Ptr d_self, Ptr d_ctx, double* dphi) override;
  void swiglu_fwd(CPtr g, CPtr u, size_t n, Ptr h) override;
  void swiglu_bwd(CPtr g, CPtr u, CPtr dh, size_t n, Ptr dg, Ptr du) override;
  void gelu_fwd(CPtr x, size_t n, Ptr y) override;
  void gelu_bwd(CPtr x, CPtr dy, size_t n, Ptr dx) override;
  void fusion_fwd(CPtr pre, CPtr a, CPtr b, CPtr res, size_t n, Ptr out) override;
  void fusion_bwd(CPtr pre, CPtr a, CPtr b, CPtr dout, size_t n, Ptr dpre, Ptr da, Ptr db) override;
  void ce_row_max(CPtr logits, int N, int V_local, Ptr row_max) override;
  void ce_sumexp_target(CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, Ptr sumexp, Ptr tgt) override;
  void ce_loss_grad(Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt, double scale, Ptr loss) override;
  void ce_loss(CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt, Ptr loss) override;
  void adamw(Ptr p, Ptr g, Ptr m, Ptr v, size_t n, double lr, double beta1, double beta2, double eps, double wd,
             double bc1, double bc2, Ptr w, bool zero_grad) override;

 private:
  std::unique_ptr<cpu::OpaqueMemory> mem_;  // null: host memory
  std::vector<GemmShape>* gemm_log_ = nullptr;
  cpu::OpaqueMemory* opaque() { return mem_.get(); }
};

extern template class CpuOps<float>;
extern template class CpuOps<double>;

}  // namespace wiola
