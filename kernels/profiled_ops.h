// ProfiledOps: any backend behind the op interface, with the time of each op
// measured in the backend's own order of execution (Ops::make_timeline: the
// host clock on the CPU, events on a GPU stream) and summed per op and per op
// class. Benchmarks put it between the model and the backend:
//
//   auto cuda = make_cuda_ops(...);
//   ProfiledOps<float> ops(*cuda);      // the model and optimizer use `ops`
//   ops.enable(true); <one step>; OpProfile p = ops.profile();
//
// While disabled it only forwards (one virtual call more per op). Enabled, it
// takes two marks per op: on a GPU those are two event records per launch,
// so a profiled step is measured apart from the timed ones. Time between ops
// (host work, launch gaps, waits for other streams) belongs to no op; the
// caller compares the profile's total with the step's wall time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace wiola {

struct OpTime {
  std::string name;
  double seconds = 0;
  long calls = 0;
};

struct OpProfile {
  std::vector<OpTime> ops;      // by op, costliest first
  std::vector<OpTime> classes;  // by op class (gemm, attention, ...), costliest first
  double seconds = 0;           // inside ops, all together
  double class_seconds(const std::string& cls) const;  // 0 if absent
};

// A table of the classes' time per step, each with its share of `wall_s`
// (the profiled steps' wall time, `steps` of them), the rest as "between
// ops"; lines start with `indent`.
std::string format_op_profile(const OpProfile& p, double wall_s, int steps, const std::string& indent);

// The class an op is reported under ("gemm", "attention", "norm", ...); the
// op names are the Ops member functions'.
const char* op_class_of(const std::string& op);

template <class T>
class ProfiledOps final : public Ops<T> {
 public:
  explicit ProfiledOps(Ops<T>& inner);
  ~ProfiledOps() override;
  Ops<T>& inner() { return inner_; }
  void enable(bool on) { on_ = on; }
  bool enabled() const { return on_; }
  // Synchronises the backend, then sums every op timed since the last reset.
  OpProfile profile();
  void reset();

  const char* name() const override { return inner_.name(); }
  void* alloc_bytes(size_t bytes) override { return inner_.alloc_bytes(bytes); }
  void free_bytes(void* p) override { inner_.free_bytes(p); }
  void synchronize() override { inner_.synchronize(); }
  bool host_accessible() const override { return inner_.host_accessible(); }
  std::string device_name() const override { return inner_.device_name(); }
  size_t peak_bytes() const override { return inner_.peak_bytes(); }
  Precision precision() const override { return inner_.precision(); }
  std::unique_ptr<OpTimeline> make_timeline() override { return inner_.make_timeline(); }

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
  void rmsnorm_fwd(CPtr x, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd) override;
  void add_rmsnorm_fwd(CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y,
                       Ptr rstd) override;
  void rmsnorm_bwd(CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres, Ptr dx,
                   Ptr dgamma, Ptr ddelta) override;
  void srpe_apply(Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse) override;
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
  void prefix_mean_fwd(CPtr x, int B, int Tn, int d, Ptr out) override;
  void prefix_mean_bwd(CPtr dout, int B, int Tn, int d, Ptr dx) override;
  void prefix_mean_carry_fwd(CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out) override;
  void ctx_attention_fwd(CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, Ptr out,
                         Ptr probs) override;
  void ctx_attention_bwd(CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H, int Hkv, int dh,
                         Ptr dq, Ptr dkc, Ptr dvc) override;
  void blend_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out) override;
  void blend_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx,
                 double* dphi) override;
  void sigmoid_gate_fwd(CPtr pre, CPtr x, size_t n, Ptr out) override;
  void sigmoid_gate_bwd(CPtr pre, CPtr x, CPtr dout, size_t n, Ptr dpre, Ptr dx) override;
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
  void adamw(Ptr p, CPtr g, Ptr m, Ptr v, size_t n, double lr, double beta1, double beta2, double eps, double wd,
             double bc1, double bc2) override;

 private:
  struct Span {
    const char* op;
    int from, to;
  };
  // Marks around one forwarded call while enabled.
  class Timed {
   public:
    Timed(ProfiledOps& p, const char* op) : p_(p.on_ ? &p : nullptr), op_(op) {
      if (p_) from_ = p_->timeline_->mark();
    }
    ~Timed() {
      if (p_) p_->spans_.push_back({op_, from_, p_->timeline_->mark()});
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    ProfiledOps* p_;
    const char* op_;
    int from_ = 0;
  };

  Ops<T>& inner_;
  std::unique_ptr<OpTimeline> timeline_;
  std::vector<Span> spans_;
  bool on_ = false;
};

extern template class ProfiledOps<float>;
extern template class ProfiledOps<double>;

}  // namespace wiola
