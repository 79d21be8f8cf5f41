// ProfiledOps (kernels/profiled_ops.h): every timed op forwards to the
// backend between two timeline marks; profile() sums the spans.
#include "kernels/profiled_ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <utility>

namespace wiola {

namespace {

// The host clock: right where an op has finished when it returns.
class HostTimeline final : public OpTimeline {
 public:
  int mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return int(marks_.size()) - 1;
  }
  double seconds(int from, int to) override {
    return std::chrono::duration<double>(marks_[size_t(to)] - marks_[size_t(from)]).count();
  }
  void clear() override { marks_.clear(); }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

std::vector<OpTime> costliest_first(const std::map<std::string, OpTime>& by_name) {
  std::vector<OpTime> v;
  for (const auto& [name, t] : by_name) v.push_back(t);
  std::stable_sort(v.begin(), v.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return v;
}

}  // namespace

std::unique_ptr<OpTimeline> make_host_timeline() { return std::make_unique<HostTimeline>(); }

const char* op_class_of(const std::string& op) {
  static const std::map<std::string, const char*> classes = {
      {"gemm", "gemm"}, {"gemm_strided_batched", "gemm"},
      {"attention_fwd", "attention"}, {"attention_bwd", "attention"},
      {"ctx_attention_fwd", "context attention"}, {"ctx_attention_bwd", "context attention"},
      {"prefix_mean_fwd", "context attention"}, {"prefix_mean_bwd", "context attention"},
      {"prefix_mean_carry_fwd", "context attention"},
      {"atm_similarity", "ATM"}, {"atm_plan", "ATM"}, {"atm_merge_rows", "ATM"}, {"atm_merge_rows_bwd", "ATM"},
      {"rmsnorm_fwd", "norm"}, {"add_rmsnorm_fwd", "norm"}, {"rmsnorm_bwd", "norm"},
      {"ce_row_max", "cross-entropy"}, {"ce_sumexp_target", "cross-entropy"}, {"ce_loss_grad", "cross-entropy"},
      {"ce_loss", "cross-entropy"},
      {"adamw", "optimizer"}, {"sum_squares", "optimizer"}, {"sum", "optimizer"}, {"accumulate", "optimizer"},
      {"upload", "copies"}, {"download", "copies"}, {"copy", "copies"}, {"zero", "copies"},
      {"convert", "copies"}, {"copy_block", "copies"},
      {"embedding_fwd", "embedding"}, {"embedding_bwd", "embedding"}};
  const auto it = classes.find(op);
  return it == classes.end() ? "elementwise" : it->second;  // SRPE, blend, gates, activations, add/axpy/scale
}

double OpProfile::class_seconds(const std::string& cls) const {
  for (const auto& c : classes)
    if (c.name == cls) return c.seconds;
  return 0;
}

std::string format_op_profile(const OpProfile& p, double wall_s, int steps, const std::string& indent) {
  std::string out;
  char line[160];
  const double per = 1e3 / std::max(steps, 1);
  auto row = [&](const std::string& name, double s, long calls) {
    std::snprintf(line, sizeof line, "%s%-18s %9.2f ms %5.1f %%", indent.c_str(), name.c_str(), s * per,
                  wall_s > 0 ? 100.0 * s / wall_s : 0.0);
    out += line;
    if (calls > 0) {
      std::snprintf(line, sizeof line, "  %6ld calls", calls / std::max(steps, 1));
      out += line;
    }
    out += "\n";
  };
  for (const OpTime& c : p.classes) row(c.name, c.seconds, c.calls);
  row("(between ops)", std::max(0.0, wall_s - p.seconds), 0);
  return out;
}

template <class T>
ProfiledOps<T>::ProfiledOps(Ops<T>& inner) : inner_(inner), timeline_(inner.make_timeline()) {}

template <class T>
ProfiledOps<T>::~ProfiledOps() = default;

template <class T>
void ProfiledOps<T>::reset() {
  spans_.clear();
  timeline_->clear();
}

template <class T>
OpProfile ProfiledOps<T>::profile() {
  inner_.synchronize();
  std::map<std::string, OpTime> ops, classes;
  OpProfile p;
  for (const Span& s : spans_) {
    const double t = timeline_->seconds(s.from, s.to);
    for (auto [map, key] : {std::pair{&ops, std::string(s.op)}, std::pair{&classes, std::string(op_class_of(s.op))}}) {
      OpTime& e = (*map)[key];
      e.name = key;
      e.seconds += t;
      ++e.calls;
    }
    p.seconds += t;
  }
  p.ops = costliest_first(ops);
  p.classes = costliest_first(classes);
  return p;
}

template <class T>
void ProfiledOps<T>::upload(void* dst, const void* host_src, size_t bytes) {
  const Timed t(*this, "upload");
  inner_.upload(dst, host_src, bytes);
}

template <class T>
void ProfiledOps<T>::download(void* host_dst, const void* src, size_t bytes) {
  const Timed t(*this, "download");
  inner_.download(host_dst, src, bytes);
}

template <class T>
void ProfiledOps<T>::copy(void* dst, const void* src, size_t bytes) {
  const Timed t(*this, "copy");
  inner_.copy(dst, src, bytes);
}

template <class T>
void ProfiledOps<T>::zero(void* p, size_t bytes) {
  const Timed t(*this, "zero");
  inner_.zero(p, bytes);
}

template <class T>
void ProfiledOps<T>::convert(CPtr src, Ptr dst, size_t n) {
  const Timed t(*this, "convert");
  inner_.convert(src, dst, n);
}

template <class T>
void ProfiledOps<T>::copy_block(Ptr dst, int ld_dst, CPtr src, int ld_src, int rows, int cols) {
  const Timed t(*this, "copy_block");
  inner_.copy_block(dst, ld_dst, src, ld_src, rows, cols);
}

template <class T>
void ProfiledOps<T>::gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, CPtr B, int ldb, T beta, Ptr C, int ldc) {
  const Timed t(*this, "gemm");
  inner_.gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void ProfiledOps<T>::gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, long sA, CPtr B, int ldb, long sB, T beta, Ptr C, int ldc, long sC, int batch) {
  const Timed t(*this, "gemm_strided_batched");
  inner_.gemm_strided_batched(ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch);
}

template <class T>
void ProfiledOps<T>::add(CPtr a, CPtr b, Ptr out, size_t n) {
  const Timed t(*this, "add");
  inner_.add(a, b, out, n);
}

template <class T>
void ProfiledOps<T>::axpy(T alpha, CPtr x, Ptr y, size_t n) {
  const Timed t(*this, "axpy");
  inner_.axpy(alpha, x, y, n);
}

template <class T>
void ProfiledOps<T>::scale(Ptr x, T s, size_t n) {
  const Timed t(*this, "scale");
  inner_.scale(x, s, n);
}

template <class T>
void ProfiledOps<T>::sum_squares(CPtr x, size_t n, double* acc) {
  const Timed t(*this, "sum_squares");
  inner_.sum_squares(x, n, acc);
}

template <class T>
void ProfiledOps<T>::sum(CPtr x, size_t n, double* acc) {
  const Timed t(*this, "sum");
  inner_.sum(x, n, acc);
}

template <class T>
void ProfiledOps<T>::accumulate(const double* x, Ptr y, size_t n) {
  const Timed t(*this, "accumulate");
  inner_.accumulate(x, y, n);
}

template <class T>
void ProfiledOps<T>::embedding_fwd(const int32_t* ids, int N, CPtr E, int v0, int V_local, int d, Ptr out) {
  const Timed t(*this, "embedding_fwd");
  inner_.embedding_fwd(ids, N, E, v0, V_local, d, out);
}

template <class T>
void ProfiledOps<T>::embedding_bwd(const int32_t* ids, int N, CPtr dout, int v0, int V_local, int d, Ptr dE) {
  const Timed t(*this, "embedding_bwd");
  inner_.embedding_bwd(ids, N, dout, v0, V_local, d, dE);
}

template <class T>
void ProfiledOps<T>::rmsnorm_fwd(CPtr x, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd) {
  const Timed t(*this, "rmsnorm_fwd");
  inner_.rmsnorm_fwd(x, gamma, delta, N, d, eps, y, rstd);
}

template <class T>
void ProfiledOps<T>::add_rmsnorm_fwd(CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps,
                                     Ptr y, Ptr rstd) {
  const Timed t(*this, "add_rmsnorm_fwd");
  inner_.add_rmsnorm_fwd(a, b, s, gamma, delta, N, d, eps, y, rstd);
}

template <class T>
void ProfiledOps<T>::rmsnorm_bwd(CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres,
                                 Ptr dx, Ptr dgamma, Ptr ddelta) {
  const Timed t(*this, "rmsnorm_bwd");
  inner_.rmsnorm_bwd(x, gamma, delta, rstd, dy, N, d, dres, dx, dgamma, ddelta);
}

template <class T>
void ProfiledOps<T>::srpe_apply(Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse) {
  const Timed t(*this, "srpe_apply");
  inner_.srpe_apply(x, B, Tn, nh, dh, table, inverse);
}

template <class T>
void ProfiledOps<T>::attention_fwd(const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o, Ptr lse) {
  const Timed t(*this, "attention_fwd");
  inner_.attention_fwd(s, keys, q, k, v, raw_k, raw_v, o, lse);
}

template <class T>
void ProfiledOps<T>::attention_bwd(const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, CPtr o, CPtr lse, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  const Timed t(*this, "attention_bwd");
  inner_.attention_bwd(s, keys, q, k, v, raw_k, raw_v, o, lse, dout, dq, dk, dv, draw_k, draw_v);
}

template <class T>
void ProfiledOps<T>::atm_similarity(CPtr x, int B, int Tn, int d, double* rho) {
  const Timed t(*this, "atm_similarity");
  inner_.atm_similarity(x, B, Tn, d, rho);
}

template <class T>
void ProfiledOps<T>::atm_plan(const double* rho, int B, int Tn, double tau, uint8_t* open, int32_t* group_first, int32_t* key_end, int32_t* n_groups) {
  const Timed t(*this, "atm_plan");
  inner_.atm_plan(rho, B, Tn, tau, open, group_first, key_end, n_groups);
}

template <class T>
void ProfiledOps<T>::atm_merge_rows(CPtr x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups, Ptr out) {
  const Timed t(*this, "atm_merge_rows");
  inner_.atm_merge_rows(x, B, Tn, w, group_first, key_end, n_groups, out);
}

template <class T>
void ProfiledOps<T>::atm_merge_rows_bwd(CPtr dout, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups, Ptr dx) {
  const Timed t(*this, "atm_merge_rows_bwd");
  inner_.atm_merge_rows_bwd(dout, B, Tn, w, group_first, key_end, n_groups, dx);
}

template <class T>
void ProfiledOps<T>::prefix_mean_fwd(CPtr x, int B, int Tn, int d, Ptr out) {
  const Timed t(*this, "prefix_mean_fwd");
  inner_.prefix_mean_fwd(x, B, Tn, d, out);
}

template <class T>
void ProfiledOps<T>::prefix_mean_bwd(CPtr dout, int B, int Tn, int d, Ptr dx) {
  const Timed t(*this, "prefix_mean_bwd");
  inner_.prefix_mean_bwd(dout, B, Tn, d, dx);
}

template <class T>
void ProfiledOps<T>::prefix_mean_carry_fwd(CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out) {
  const Timed t(*this, "prefix_mean_carry_fwd");
  inner_.prefix_mean_carry_fwd(x, B, Tn, d, pos0, carry, out);
}

template <class T>
void ProfiledOps<T>::ctx_attention_fwd(CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, Ptr out, Ptr probs) {
  const Timed t(*this, "ctx_attention_fwd");
  inner_.ctx_attention_fwd(q, kc, vc, N, nc, H, Hkv, dh, out, probs);
}

template <class T>
void ProfiledOps<T>::ctx_attention_bwd(CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H, int Hkv, int dh, Ptr dq, Ptr dkc, Ptr dvc) {
  const Timed t(*this, "ctx_attention_bwd");
  inner_.ctx_attention_bwd(q, kc, vc, probs, dout, N, nc, H, Hkv, dh, dq, dkc, dvc);
}

template <class T>
void ProfiledOps<T>::blend_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out) {
  const Timed t(*this, "blend_fwd");
  inner_.blend_fwd(o_self, o_ctx, phi, n, out);
}

template <class T>
void ProfiledOps<T>::blend_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx, double* dphi) {
  const Timed t(*this, "blend_bwd");
  inner_.blend_bwd(o_self, o_ctx, phi, dout, n, d_self, d_ctx, dphi);
}

template <class T>
void ProfiledOps<T>::sigmoid_gate_fwd(CPtr pre, CPtr x, size_t n, Ptr out) {
  const Timed t(*this, "sigmoid_gate_fwd");
  inner_.sigmoid_gate_fwd(pre, x, n, out);
}

template <class T>
void ProfiledOps<T>::sigmoid_gate_bwd(CPtr pre, CPtr x, CPtr dout, size_t n, Ptr dpre, Ptr dx) {
  const Timed t(*this, "sigmoid_gate_bwd");
  inner_.sigmoid_gate_bwd(pre, x, dout, n, dpre, dx);
}

template <class T>
void ProfiledOps<T>::swiglu_fwd(CPtr g, CPtr u, size_t n, Ptr h) {
  const Timed t(*this, "swiglu_fwd");
  inner_.swiglu_fwd(g, u, n, h);
}

template <class T>
void ProfiledOps<T>::swiglu_bwd(CPtr g, CPtr u, CPtr dh, size_t n, Ptr dg, Ptr du) {
  const Timed t(*this, "swiglu_bwd");
  inner_.swiglu_bwd(g, u, dh, n, dg, du);
}

template <class T>
void ProfiledOps<T>::gelu_fwd(CPtr x, size_t n, Ptr y) {
  const Timed t(*this, "gelu_fwd");
  inner_.gelu_fwd(x, n, y);
}

template <class T>
void ProfiledOps<T>::gelu_bwd(CPtr x, CPtr dy, size_t n, Ptr dx) {
  const Timed t(*this, "gelu_bwd");
  inner_.gelu_bwd(x, dy, n, dx);
}

template <class T>
void ProfiledOps<T>::fusion_fwd(CPtr pre, CPtr a, CPtr b, CPtr res, size_t n, Ptr out) {
  const Timed t(*this, "fusion_fwd");
  inner_.fusion_fwd(pre, a, b, res, n, out);
}

template <class T>
void ProfiledOps<T>::fusion_bwd(CPtr pre, CPtr a, CPtr b, CPtr dout, size_t n, Ptr dpre, Ptr da, Ptr db) {
  const Timed t(*this, "fusion_bwd");
  inner_.fusion_bwd(pre, a, b, dout, n, dpre, da, db);
}

template <class T>
void ProfiledOps<T>::ce_row_max(CPtr logits, int N, int V_local, Ptr row_max) {
  const Timed t(*this, "ce_row_max");
  inner_.ce_row_max(logits, N, V_local, row_max);
}

template <class T>
void ProfiledOps<T>::ce_sumexp_target(CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, Ptr sumexp, Ptr tgt) {
  const Timed t(*this, "ce_sumexp_target");
  inner_.ce_sumexp_target(logits, targets, N, V_local, v0, row_max, sumexp, tgt);
}

template <class T>
void ProfiledOps<T>::ce_loss_grad(Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt, double scale, Ptr loss) {
  const Timed t(*this, "ce_loss_grad");
  inner_.ce_loss_grad(logits, targets, N, V_local, v0, row_max, sumexp, tgt, scale, loss);
}

template <class T>
void ProfiledOps<T>::ce_loss(CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt, Ptr loss) {
  const Timed t(*this, "ce_loss");
  inner_.ce_loss(logits, targets, N, V_local, v0, row_max, sumexp, tgt, loss);
}

template <class T>
void ProfiledOps<T>::adamw(Ptr p, CPtr g, Ptr m, Ptr v, size_t n, double lr, double beta1, double beta2, double eps, double wd, double bc1, double bc2) {
  const Timed t(*this, "adamw");
  inner_.adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2);
}

template class ProfiledOps<float>;
template class ProfiledOps<double>;

}  // namespace wiola
