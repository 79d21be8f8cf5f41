// ForwardingOps: a backend in front of another that forwards every op to
// it: the base of the wrappers that watch or adapt a backend's ops
// (ProfiledOps times them, kernels/profiled_ops.h; Bf16StorageOps gives the
// CPU kernels the GPU's bf16 storage, kernels/cpu/bf16_storage_ops.h). Two
// hooks: op_begin/op_end around each forwarded op (memory management and the
// backend's properties are forwarded without them), and arg(), through which
// every floating-point buffer argument passes on its way to the inner op.
#pragma once

#include <memory>
#include <string>

#include "kernels/ops.h"

namespace wiola {

template <class T>
class ForwardingOps : public Ops<T> {
 public:
  explicit ForwardingOps(Ops<T>& inner) : inner_(inner) {}
  Ops<T>& inner() { return inner_; }

  const char* name() const override { return inner_.name(); }
  void* alloc_bytes(size_t bytes) override { return inner_.alloc_bytes(bytes); }
  void free_bytes(void* p) override { inner_.free_bytes(p); }
  void synchronize() override { inner_.synchronize(); }
  bool host_accessible() const override { return inner_.host_accessible(); }
  std::string device_name() const override { return inner_.device_name(); }
  void* device_stream() const override { return inner_.device_stream(); }
  std::string device_identity() const override { return inner_.device_identity(); }
  size_t peak_bytes() const override { return inner_.peak_bytes(); }
  Precision precision() const override { return inner_.precision(); }
  std::unique_ptr<OpTimeline> make_timeline() override { return inner_.make_timeline(); }
  std::string gemm_tuning() const override { return inner_.gemm_tuning(); }
  void adopt_gemm_tuning(const std::string& table_json) override { inner_.adopt_gemm_tuning(table_json); }
  // body issues this wrapper's ops, which reach the inner backend through it.
  void graph(const GraphKey& key, const std::function<void()>& body) override { inner_.graph(key, body); }
  void forget_graphs(const void* owner) override { inner_.forget_graphs(owner); }

  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void convert(CPtr src, Ptr dst, size_t n) override;
  void copy_block(Ptr dst, int ld_dst, CPtr src, int ld_src, int rows, int cols) override;
  void gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, CPtr B, int ldb, T beta, Ptr C,
            int ldc) override;
  void gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, long sA, CPtr B,
                            int ldb, long sB, T beta, Ptr C, int ldc, long sC, int batch) override;
  void add(CPtr a, CPtr b, Ptr out, size_t n) override;
  void axpy(T alpha, CPtr x, Ptr y, size_t n) override;
  void scale(Ptr x, T s, size_t n) override;
  void sum_squares(CPtr x, size_t n, double* acc) override;
  void sum(CPtr x, size_t n, double* acc) override;
  void accumulate(const double* x, Ptr y, size_t n) override;
  void embedding_fwd(const int32_t* ids, int N, CPtr E, int v0, int V_local, int d, Ptr out) override;
  void embedding_bwd(const int32_t* ids, int N, CPtr dout, int v0, int V_local, int d, Ptr dE) override;
  void rmsnorm_fwd(CPtr x, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd,
                   Ptr y_op) override;
  void add_rmsnorm_fwd(CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y,
                       Ptr rstd, Ptr y_op) override;
  void rmsnorm_bwd(CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres, Ptr dx,
                   Ptr dgamma, Ptr ddelta) override;
  void srpe_apply(Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse) override;
  void srpe_split_fwd(CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, Ptr q, Ptr k, Ptr v,
                      Ptr gate) override;
  void srpe_split_bwd(CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh, CPtr table,
                      Ptr dproj) override;
  void attention_fwd(const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                     Ptr o, Ptr lse) override;
  void attention_bwd(const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                     CPtr o, CPtr lse, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) override;
  void atm_similarity(CPtr x, int B, int Tn, int d, double* rho) override;
  void atm_plan(const double* rho, int B, int Tn, double tau, uint8_t* open, int32_t* group_first,
                int32_t* key_end, int32_t* n_groups) override;
  void atm_merge_rows(CPtr x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                      const int32_t* n_groups, Ptr out) override;
  void atm_merge_rows_bwd(CPtr dout, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                          const int32_t* n_groups, Ptr dx) override;
  void prefix_mean_fwd(CPtr x, int B, int Tn, int d, Ptr out, Ptr out_op) override;
  void prefix_mean_bwd(CPtr dout, int B, int Tn, int d, Ptr dx) override;
  void prefix_mean_carry_fwd(CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out, Ptr out_op) override;
  void ctx_attention_fwd(CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, int ldkv, Ptr out,
                         Ptr probs) override;
  void ctx_attention_bwd(CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H, int Hkv, int dh,
                         int ldkv, Ptr dq, Ptr dkc, Ptr dvc) override;
  void blend_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out) override;
  void blend_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx,
                 double* dphi) override;
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
  void ce_sumexp_target(CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max,
                        Ptr sumexp, Ptr tgt) override;
  void ce_loss_grad(Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp,
                    CPtr tgt, double scale, Ptr loss) override;
  void ce_loss(CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp,
               CPtr tgt, Ptr loss) override;
  void adamw(Ptr p, Ptr g, Ptr m, Ptr v, size_t n, double lr, double beta1, double beta2, double eps, double wd,
             double bc1, double bc2, Ptr w, bool zero_grad) override;

 protected:
  // Around one forwarded op (op: the Ops member's name). op_end also runs
  // when the inner op throws.
  virtual void op_begin(const char* /*op*/) {}
  virtual void op_end(const char* /*op*/) noexcept {}
  // A buffer argument as the inner op receives it.
  virtual CPtr arg(CPtr p) { return p; }
  virtual Ptr arg(Ptr p) { return p; }

  Ops<T>& inner_;

 private:
  class Call {
   public:
    Call(ForwardingOps& o, const char* op) : o_(o), op_(op) { o_.op_begin(op_); }
    ~Call() { o_.op_end(op_); }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    ForwardingOps& o_;
    const char* op_;
  };
};

extern template class ForwardingOps<float>;
extern template class ForwardingOps<double>;

}  // namespace wiola
