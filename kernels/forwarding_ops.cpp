// ForwardingOps (kernels/forwarding_ops.h): every op forwards to the inner
// backend inside op_begin/op_end, its buffer arguments through arg().
#include "kernels/forwarding_ops.h"

namespace wiola {

template <class T>
void ForwardingOps<T>::upload(void* dst, const void* host_src, size_t bytes) {
  const Call c(*this, "upload");
  inner_.upload(dst, host_src, bytes);
}

template <class T>
void ForwardingOps<T>::download(void* host_dst, const void* src, size_t bytes) {
  const Call c(*this, "download");
  inner_.download(host_dst, src, bytes);
}

template <class T>
void ForwardingOps<T>::copy(void* dst, const void* src, size_t bytes) {
  const Call c(*this, "copy");
  inner_.copy(dst, src, bytes);
}

template <class T>
void ForwardingOps<T>::zero(void* p, size_t bytes) {
  const Call c(*this, "zero");
  inner_.zero(p, bytes);
}

template <class T>
void ForwardingOps<T>::convert(CPtr src, Ptr dst, size_t n) {
  const Call c(*this, "convert");
  inner_.convert(arg(src), arg(dst), n);
}

template <class T>
void ForwardingOps<T>::copy_block(Ptr dst, int ld_dst, CPtr src, int ld_src, int rows, int cols) {
  const Call c(*this, "copy_block");
  inner_.copy_block(arg(dst), ld_dst, arg(src), ld_src, rows, cols);
}

template <class T>
void ForwardingOps<T>::gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, CPtr B, int ldb, T beta, Ptr C, int ldc) {
  const Call c(*this, "gemm");
  inner_.gemm(ta, tb, m, n, k, alpha, arg(A), lda, arg(B), ldb, beta, arg(C), ldc);
}

template <class T>
void ForwardingOps<T>::gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, long sA, CPtr B, int ldb, long sB, T beta, Ptr C, int ldc, long sC, int batch) {
  const Call c(*this, "gemm_strided_batched");
  inner_.gemm_strided_batched(ta, tb, m, n, k, alpha, arg(A), lda, sA, arg(B), ldb, sB, beta, arg(C), ldc, sC, batch);
}

template <class T>
void ForwardingOps<T>::add(CPtr a, CPtr b, Ptr out, size_t n) {
  const Call c(*this, "add");
  inner_.add(arg(a), arg(b), arg(out), n);
}

template <class T>
void ForwardingOps<T>::axpy(T alpha, CPtr x, Ptr y, size_t n) {
  const Call c(*this, "axpy");
  inner_.axpy(alpha, arg(x), arg(y), n);
}

template <class T>
void ForwardingOps<T>::scale(Ptr x, T s, size_t n) {
  const Call c(*this, "scale");
  inner_.scale(arg(x), s, n);
}

template <class T>
void ForwardingOps<T>::sum_squares(CPtr x, size_t n, double* acc) {
  const Call c(*this, "sum_squares");
  inner_.sum_squares(arg(x), n, acc);
}

template <class T>
void ForwardingOps<T>::sum(CPtr x, size_t n, double* acc) {
  const Call c(*this, "sum");
  inner_.sum(arg(x), n, acc);
}

template <class T>
void ForwardingOps<T>::accumulate(const double* x, Ptr y, size_t n) {
  const Call c(*this, "accumulate");
  inner_.accumulate(x, arg(y), n);
}

template <class T>
void ForwardingOps<T>::embedding_fwd(const int32_t* ids, int N, CPtr E, int v0, int V_local, int d, Ptr out) {
  const Call c(*this, "embedding_fwd");
  inner_.embedding_fwd(ids, N, arg(E), v0, V_local, d, arg(out));
}

template <class T>
void ForwardingOps<T>::embedding_bwd(const int32_t* ids, int N, CPtr dout, int v0, int V_local, int d, Ptr dE) {
  const Call c(*this, "embedding_bwd");
  inner_.embedding_bwd(ids, N, arg(dout), v0, V_local, d, arg(dE));
}

template <class T>
void ForwardingOps<T>::rmsnorm_fwd(CPtr x, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd,
                                   Ptr y_op) {
  const Call c(*this, "rmsnorm_fwd");
  inner_.rmsnorm_fwd(arg(x), arg(gamma), arg(delta), N, d, eps, arg(y), arg(rstd), arg(y_op));
}

template <class T>
void ForwardingOps<T>::add_rmsnorm_fwd(CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps,
                                     Ptr y, Ptr rstd, Ptr y_op) {
  const Call c(*this, "add_rmsnorm_fwd");
  inner_.add_rmsnorm_fwd(arg(a), arg(b), arg(s), arg(gamma), arg(delta), N, d, eps, arg(y), arg(rstd), arg(y_op));
}

template <class T>
void ForwardingOps<T>::rmsnorm_bwd(CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres,
                                 Ptr dx, Ptr dgamma, Ptr ddelta) {
  const Call c(*this, "rmsnorm_bwd");
  inner_.rmsnorm_bwd(arg(x), arg(gamma), arg(delta), arg(rstd), arg(dy), N, d, arg(dres), arg(dx), arg(dgamma), arg(ddelta));
}

template <class T>
void ForwardingOps<T>::srpe_apply(Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse) {
  const Call c(*this, "srpe_apply");
  inner_.srpe_apply(arg(x), B, Tn, nh, dh, arg(table), inverse);
}

template <class T>
void ForwardingOps<T>::srpe_split_fwd(CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, Ptr q, Ptr k,
                                      Ptr v, Ptr gate) {
  const Call c(*this, "srpe_split_fwd");
  inner_.srpe_split_fwd(arg(proj), B, Tn, H, Hkv, dh, arg(table), arg(q), arg(k), arg(v), arg(gate));
}

template <class T>
void ForwardingOps<T>::srpe_split_bwd(CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh,
                                      CPtr table, Ptr dproj) {
  const Call c(*this, "srpe_split_bwd");
  inner_.srpe_split_bwd(arg(dq), arg(dk), arg(dv), arg(dgate), B, Tn, H, Hkv, dh, arg(table), arg(dproj));
}

template <class T>
void ForwardingOps<T>::attention_fwd(const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o, Ptr lse) {
  const Call c(*this, "attention_fwd");
  inner_.attention_fwd(s, keys, arg(q), arg(k), arg(v), arg(raw_k), arg(raw_v), arg(o), arg(lse));
}

template <class T>
void ForwardingOps<T>::attention_bwd(const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, CPtr o, CPtr lse, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  const Call c(*this, "attention_bwd");
  inner_.attention_bwd(s, keys, arg(q), arg(k), arg(v), arg(raw_k), arg(raw_v), arg(o), arg(lse), arg(dout), arg(dq), arg(dk), arg(dv), arg(draw_k), arg(draw_v));
}

template <class T>
void ForwardingOps<T>::atm_similarity(CPtr x, int B, int Tn, int d, double* rho) {
  const Call c(*this, "atm_similarity");
  inner_.atm_similarity(arg(x), B, Tn, d, rho);
}

template <class T>
void ForwardingOps<T>::atm_plan(const double* rho, int B, int Tn, double tau, uint8_t* open, int32_t* group_first, int32_t* key_end, int32_t* n_groups) {
  const Call c(*this, "atm_plan");
  inner_.atm_plan(rho, B, Tn, tau, open, group_first, key_end, n_groups);
}

template <class T>
void ForwardingOps<T>::atm_merge_rows(CPtr x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups, Ptr out) {
  const Call c(*this, "atm_merge_rows");
  inner_.atm_merge_rows(arg(x), B, Tn, w, group_first, key_end, n_groups, arg(out));
}

template <class T>
void ForwardingOps<T>::atm_merge_rows_bwd(CPtr dout, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups, Ptr dx) {
  const Call c(*this, "atm_merge_rows_bwd");
  inner_.atm_merge_rows_bwd(arg(dout), B, Tn, w, group_first, key_end, n_groups, arg(dx));
}

template <class T>
void ForwardingOps<T>::prefix_mean_fwd(CPtr x, int B, int Tn, int d, Ptr out, Ptr out_op) {
  const Call c(*this, "prefix_mean_fwd");
  inner_.prefix_mean_fwd(arg(x), B, Tn, d, arg(out), arg(out_op));
}

template <class T>
void ForwardingOps<T>::prefix_mean_bwd(CPtr dout, int B, int Tn, int d, Ptr dx) {
  const Call c(*this, "prefix_mean_bwd");
  inner_.prefix_mean_bwd(arg(dout), B, Tn, d, arg(dx));
}

template <class T>
void ForwardingOps<T>::prefix_mean_carry_fwd(CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out, Ptr out_op) {
  const Call c(*this, "prefix_mean_carry_fwd");
  inner_.prefix_mean_carry_fwd(arg(x), B, Tn, d, pos0, arg(carry), arg(out), arg(out_op));
}

template <class T>
void ForwardingOps<T>::ctx_attention_fwd(CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, int ldkv, Ptr out, Ptr probs) {
  const Call c(*this, "ctx_attention_fwd");
  inner_.ctx_attention_fwd(arg(q), arg(kc), arg(vc), N, nc, H, Hkv, dh, ldkv, arg(out), arg(probs));
}

template <class T>
void ForwardingOps<T>::ctx_attention_bwd(CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H, int Hkv, int dh, int ldkv, Ptr dq, Ptr dkc, Ptr dvc) {
  const Call c(*this, "ctx_attention_bwd");
  inner_.ctx_attention_bwd(arg(q), arg(kc), arg(vc), arg(probs), arg(dout), N, nc, H, Hkv, dh, ldkv, arg(dq), arg(dkc), arg(dvc));
}

template <class T>
void ForwardingOps<T>::blend_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out) {
  const Call c(*this, "blend_fwd");
  inner_.blend_fwd(arg(o_self), arg(o_ctx), arg(phi), n, arg(out));
}

template <class T>
void ForwardingOps<T>::blend_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx, double* dphi) {
  const Call c(*this, "blend_bwd");
  inner_.blend_bwd(arg(o_self), arg(o_ctx), arg(phi), arg(dout), n, arg(d_self), arg(d_ctx), dphi);
}

template <class T>
void ForwardingOps<T>::sigmoid_gate_fwd(CPtr pre, CPtr x, size_t n, Ptr out) {
  const Call c(*this, "sigmoid_gate_fwd");
  inner_.sigmoid_gate_fwd(arg(pre), arg(x), n, arg(out));
}

template <class T>
void ForwardingOps<T>::sigmoid_gate_bwd(CPtr pre, CPtr x, CPtr dout, size_t n, Ptr dpre, Ptr dx) {
  const Call c(*this, "sigmoid_gate_bwd");
  inner_.sigmoid_gate_bwd(arg(pre), arg(x), arg(dout), n, arg(dpre), arg(dx));
}

template <class T>
void ForwardingOps<T>::blend_gate_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, size_t n, Ptr o, Ptr og) {
  const Call c(*this, "blend_gate_fwd");
  inner_.blend_gate_fwd(arg(o_self), arg(o_ctx), arg(phi), arg(pre), n, arg(o), arg(og));
}

template <class T>
void ForwardingOps<T>::blend_gate_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, CPtr o, CPtr dog, size_t n,
                                      Ptr dpre, Ptr d_self, Ptr d_ctx, double* dphi) {
  const Call c(*this, "blend_gate_bwd");
  inner_.blend_gate_bwd(arg(o_self), arg(o_ctx), arg(phi), arg(pre), arg(o), arg(dog), n, arg(dpre), arg(d_self),
                        arg(d_ctx), dphi);
}

template <class T>
void ForwardingOps<T>::swiglu_fwd(CPtr g, CPtr u, size_t n, Ptr h) {
  const Call c(*this, "swiglu_fwd");
  inner_.swiglu_fwd(arg(g), arg(u), n, arg(h));
}

template <class T>
void ForwardingOps<T>::swiglu_bwd(CPtr g, CPtr u, CPtr dh, size_t n, Ptr dg, Ptr du) {
  const Call c(*this, "swiglu_bwd");
  inner_.swiglu_bwd(arg(g), arg(u), arg(dh), n, arg(dg), arg(du));
}

template <class T>
void ForwardingOps<T>::gelu_fwd(CPtr x, size_t n, Ptr y) {
  const Call c(*this, "gelu_fwd");
  inner_.gelu_fwd(arg(x), n, arg(y));
}

template <class T>
void ForwardingOps<T>::gelu_bwd(CPtr x, CPtr dy, size_t n, Ptr dx) {
  const Call c(*this, "gelu_bwd");
  inner_.gelu_bwd(arg(x), arg(dy), n, arg(dx));
}

template <class T>
void ForwardingOps<T>::fusion_fwd(CPtr pre, CPtr a, CPtr b, CPtr res, size_t n, Ptr out) {
  const Call c(*this, "fusion_fwd");
  inner_.fusion_fwd(arg(pre), arg(a), arg(b), arg(res), n, arg(out));
}

template <class T>
void ForwardingOps<T>::fusion_bwd(CPtr pre, CPtr a, CPtr b, CPtr dout, size_t n, Ptr dpre, Ptr da, Ptr db) {
  const Call c(*this, "fusion_bwd");
  inner_.fusion_bwd(arg(pre), arg(a), arg(b), arg(dout), n, arg(dpre), arg(da), arg(db));
}

template <class T>
void ForwardingOps<T>::ce_row_max(CPtr logits, int N, int V_local, Ptr row_max) {
  const Call c(*this, "ce_row_max");
  inner_.ce_row_max(arg(logits), N, V_local, arg(row_max));
}

template <class T>
void ForwardingOps<T>::ce_sumexp_target(CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, Ptr sumexp, Ptr tgt) {
  const Call c(*this, "ce_sumexp_target");
  inner_.ce_sumexp_target(arg(logits), targets, N, V_local, v0, arg(row_max), arg(sumexp), arg(tgt));
}

template <class T>
void ForwardingOps<T>::ce_loss_grad(Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt, double scale, Ptr loss) {
  const Call c(*this, "ce_loss_grad");
  inner_.ce_loss_grad(arg(logits), targets, N, V_local, v0, arg(row_max), arg(sumexp), arg(tgt), scale, arg(loss));
}

template <class T>
void ForwardingOps<T>::ce_loss(CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt, Ptr loss) {
  const Call c(*this, "ce_loss");
  inner_.ce_loss(arg(logits), targets, N, V_local, v0, arg(row_max), arg(sumexp), arg(tgt), arg(loss));
}

template <class T>
void ForwardingOps<T>::adamw(Ptr p, Ptr g, Ptr m, Ptr v, size_t n, double lr, double beta1, double beta2, double eps, double wd, double bc1, double bc2, Ptr w, bool zero_grad) {
  const Call c(*this, "adamw");
  inner_.adamw(arg(p), arg(g), arg(m), arg(v), n, lr, beta1, beta2, eps, wd, bc1, bc2, arg(w), zero_grad);
}

template class ForwardingOps<float>;
template class ForwardingOps<double>;

}  // namespace wiola
