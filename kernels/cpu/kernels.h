// The CPU op bodies as free functions, one file per family; semantics are
// documented once, in kernels/op_list.h. CpuOps (kernels/cpu/cpu_ops.h)
// runs each op as cpu::NAME with the op's own arguments, buffers as host
// pointers (CPtr -> const T*, Ptr -> T*); where a kernel takes other
// arguments (a value for a buffer, a result returned), its op form follows
// it here. Each kernel is explicitly instantiated for float and double in
// its file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "kernels/ops.h"

namespace wiola::cpu {

// ---- elementwise.cpp: vector arithmetic and deterministic reductions ----
template <class T>
void add(const T* a, const T* b, T* out, size_t n);
template <class T>
void axpy(T alpha, const T* x, T* y, size_t n);
template <class T>
void scale(T* x, T s, size_t n);
template <class T>
double sum_squares(const T* x, size_t n);
template <class T>
double sum(const T* x, size_t n);
// Op forms: acc[0] += the sum; y += x in double.
template <class T>
void sum_squares(const T* x, size_t n, double* acc) {
  acc[0] += sum_squares(x, n);
}
template <class T>
void sum(const T* x, size_t n, double* acc) {
  acc[0] += sum(x, n);
}
template <class T>
void accumulate(const double* x, T* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = T(double(y[i]) + x[i]);
}
// A norm's or prefix mean's GEMM operand copy, out_op (may be null): storage
// is T here, so the values themselves.
template <class T>
void copy_operand(const T* out, T* out_op, size_t n) {
  if (out_op && n) std::memcpy(out_op, out, n * sizeof(T));
}

// ---- vocab.cpp: vocab-parallel embedding and the three-phase cross-entropy
template <class T>
void embedding_fwd(const int32_t* ids, int N, const T* E, int v0, int V_local, int d, T* out);
template <class T>
void embedding_bwd(const int32_t* ids, int N, const T* dout, int v0, int V_local, int d, T* dE);
template <class T>
void ce_row_max(const T* logits, int N, int V_local, T* row_max);
template <class T>
void ce_sumexp_target(const T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, T* sumexp,
                      T* tgt);
template <class T>
void ce_loss_grad(T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, const T* sumexp,
                  const T* tgt, double scale, T* loss);
template <class T>
void ce_loss_grad_z(T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, const T* sumexp,
                    const T* tgt, double scale, double z, T* loss, T* zloss);
template <class T>
void ce_loss(const T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, const T* sumexp,
             const T* tgt, T* loss);

// ---- norm.cpp: WiolaRMSNorm --------------------------------------------------
template <class T>
void rmsnorm_fwd(const T* x, const T* gamma, const T* delta, int N, int d, double eps, T* y, T* rstd);
// s = a + b (s may be a or b), then rmsnorm_fwd of s.
template <class T>
void add_rmsnorm_fwd(const T* a, const T* b, T* s, const T* gamma, const T* delta, int N, int d, double eps, T* y,
                     T* rstd);
// dx = dres + dz (dres may be dx, or null: dx = dz).
// Op forms, with the GEMM operand copy y_op.
template <class T>
void rmsnorm_fwd(const T* x, const T* gamma, const T* delta, int N, int d, double eps, T* y, T* rstd, T* y_op) {
  rmsnorm_fwd(x, gamma, delta, N, d, eps, y, rstd);
  copy_operand(y, y_op, size_t(N) * size_t(d));
}
template <class T>
void add_rmsnorm_fwd(const T* a, const T* b, T* s, const T* gamma, const T* delta, int N, int d, double eps, T* y,
                     T* rstd, T* y_op) {
  add_rmsnorm_fwd(a, b, s, gamma, delta, N, d, eps, y, rstd);
  copy_operand(y, y_op, size_t(N) * size_t(d));
}
template <class T>
void rmsnorm_bwd(const T* x, const T* gamma, const T* delta, const T* rstd, const T* dy, int N, int d, const T* dres,
                 T* dx, T* dgamma, T* ddelta);

// ---- srpe.cpp: SRPE rotation -------------------------------------------------
template <class T>
void srpe_apply(T* x, int B, int Tn, int nh, int dh, const T* table, bool inverse);
// dh even (all three).
// proj[B Tn, 2 H dh + 2 Hkv dh] = [q | k | v | gate] blocks: q, k rotated, v,
// gate copied (forward); dproj = [dq, dk rotated back | dv | dgate] (backward).
// The bits of copy_block and srpe_apply (one pass; Ops::srpe_split_fwd).
template <class T>
void srpe_split_fwd(const T* proj, int B, int Tn, int H, int Hkv, int dh, const T* table, const int32_t* doc_start,
                    T* q, T* k, T* v, T* gate);
template <class T>
void srpe_split_bwd(const T* dq, const T* dk, const T* dv, const T* dgate, int B, int Tn, int H, int Hkv, int dh,
                    const T* table, const int32_t* doc_start, T* dproj);

// ---- atm.cpp: ATM similarity and key/value merging --------------------------
template <class T>
void atm_similarity(const T* x, int B, int Tn, int d, double* rho);
void atm_plan(const double* rho, int B, int Tn, double tau, const int32_t* doc_start, uint8_t* open,
              int32_t* group_first, int32_t* key_end, int32_t* n_groups);
template <class T>
void atm_merge_rows(const T* x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                    const int32_t* n_groups, T* out);
template <class T>
void atm_merge_rows_bwd(const T* dout, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                        const int32_t* n_groups, T* dx);

// ---- gcla.cpp: prefix mean, context attention, blend, output gate ----------
template <class T>
void prefix_mean_fwd(const T* x, int B, int Tn, int d, const int32_t* doc_start, T* out);
template <class T>
void prefix_mean_bwd(const T* dout, int B, int Tn, int d, const int32_t* doc_start, T* dx);
template <class T>
void prefix_mean_carry_fwd(const T* x, int B, int Tn, int d, int pos0, T* carry, T* out);
template <class T>
void ctx_attention_fwd(const T* q, const T* kc, const T* vc, int N, int nc, int H, int Hkv, int dh, int ldkv, T* out,
                       T* probs);
template <class T>
void ctx_attention_bwd(const T* q, const T* kc, const T* vc, const T* probs, const T* dout, int N, int nc, int H,
                       int Hkv, int dh, int ldkv, T* dq, T* dkc, T* dvc);
template <class T>
void blend_fwd(const T* o_self, const T* o_ctx, double phi, size_t n, T* out);
template <class T>
double blend_bwd(const T* o_self, const T* o_ctx, double phi, const T* dout, size_t n, T* d_self, T* d_ctx);
template <class T>
void sigmoid_gate_fwd(const T* pre, const T* x, size_t n, T* out);
template <class T>
void sigmoid_gate_bwd(const T* pre, const T* x, const T* dout, size_t n, T* dpre, T* dx);
// Op forms: the GEMM operand copy out_op; φ read from phi[0], dL/dφ written
// to dphi[0]; the fused blend and gate as the two kernels one after the
// other (the same bits: storage is T here, nothing is rounded between them).
template <class T>
void prefix_mean_fwd(const T* x, int B, int Tn, int d, const int32_t* doc_start, T* out, T* out_op) {
  prefix_mean_fwd(x, B, Tn, d, doc_start, out);
  copy_operand(out, out_op, size_t(B) * size_t(Tn) * size_t(d));
}
template <class T>
void prefix_mean_carry_fwd(const T* x, int B, int Tn, int d, int pos0, T* carry, T* out, T* out_op) {
  prefix_mean_carry_fwd(x, B, Tn, d, pos0, carry, out);
  copy_operand(out, out_op, size_t(B) * size_t(Tn) * size_t(d));
}
template <class T>
void blend_fwd(const T* o_self, const T* o_ctx, const T* phi, size_t n, T* out) {
  blend_fwd(o_self, o_ctx, double(phi[0]), n, out);
}
template <class T>
void blend_bwd(const T* o_self, const T* o_ctx, const T* phi, const T* dout, size_t n, T* d_self, T* d_ctx,
               double* dphi) {
  dphi[0] = blend_bwd(o_self, o_ctx, double(phi[0]), dout, n, d_self, d_ctx);
}
template <class T>
void blend_gate_fwd(const T* o_self, const T* o_ctx, const T* phi, const T* pre, size_t n, T* o, T* og) {
  blend_fwd(o_self, o_ctx, double(phi[0]), n, o);
  sigmoid_gate_fwd(pre, o, n, og);
}
template <class T>
void blend_gate_bwd(const T* o_self, const T* o_ctx, const T* phi, const T* pre, const T* o, const T* dog, size_t n,
                    T* dpre, T* d_self, T* d_ctx, double* dphi) {
  const std::unique_ptr<T[]> d_o(new T[n]);  // dL/do, between the two
  sigmoid_gate_bwd(pre, o, dog, n, dpre, d_o.get());
  dphi[0] = blend_bwd(o_self, o_ctx, double(phi[0]), d_o.get(), n, d_self, d_ctx);
}

// ---- dsff.cpp: SwiGLU, GELU, stream fusion ------------------------------------
template <class T>
void swiglu_fwd(const T* g, const T* u, size_t n, T* h);
template <class T>
void swiglu_bwd(const T* g, const T* u, const T* dh, size_t n, T* dg, T* du);
template <class T>
void gelu_fwd(const T* x, size_t n, T* y);
template <class T>
void gelu_bwd(const T* x, const T* dy, size_t n, T* dx);
// out = res + sigma(pre) a + (1 - sigma(pre)) b; res may be null.
template <class T>
void fusion_fwd(const T* pre, const T* a, const T* b, const T* res, size_t n, T* out);
template <class T>
void fusion_bwd(const T* pre, const T* a, const T* b, const T* dout, size_t n, T* dpre, T* da, T* db);

// ---- optimizer.cpp: AdamW ------------------------------------------------------
// w (may be null) gets the updated p; zero_grad zeroes g once read.
template <class T>
void adamw(T* p, T* g, T* m, T* v, size_t n, double lr, double beta1, double beta2, double eps, double wd, double bc1,
           double bc2, T* w, bool zero_grad);

}  // namespace wiola::cpu
