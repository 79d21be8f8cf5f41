// Host launchers of the CUDA kernels, one file per component under the name
// of its kernels/cpu/ file (a fused kernel lives with the component whose
// output it writes); semantics are those of kernels/ops.h (same names, same
// arguments) plus the stream and the allocator for temporaries. Each
// launcher dispatches on the storage dtypes of its typed pointers (fp32 or
// bf16; statistics are always fp32).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/memory.cuh"
#include "kernels/ops.h"

namespace wiola::cuda {

// The attention kernels the backend's options select (BackendOptions
// attention and attention_bwd, kernels/backend_options.h).
enum class AttnFwdKind { TC, FA2, ROWS };
enum class AttnBwdKind { V1, V2, FA2 };
// The fa2 forward's tile shape (BackendOptions attention_tile): query rows a
// block x key rows a tile. The fa2 backward's (attention_bwd_tile, Ctx
// attn_bwd_tile): key rows a dK/dV block x query rows a dQ block.
enum class AttnTile { T64x64, T64x128, T128x64, T128x128 };

struct Ctx {
  cudaStream_t s;
  CachingAllocator& mem;
  AttnFwdKind attn_fwd = AttnFwdKind::TC;
  AttnBwdKind attn_bwd = AttnBwdKind::V1;
  AttnTile attn_tile = AttnTile::T64x64;
  AttnTile attn_bwd_tile = AttnTile::T64x64;
  // The fa2 forward's query heads a block (BackendOptions
  // attention_heads_per_block): 1, or 2 or 4 heads of one KV group sharing
  // each K/V tile, the tile's query rows split among them.
  int attn_heads = 1;
};

// ---- elementwise.cu: vector arithmetic, deterministic reductions, accumulate, convert ----------
void add(Ctx c, CPtr a, CPtr b, Ptr out, size_t n);
void axpy(Ctx c, float alpha, CPtr x, Ptr y, size_t n);
void scale(Ctx c, Ptr x, float s, size_t n);
void sum_squares(Ctx c, CPtr x, size_t n, double* acc);
void sum(Ctx c, CPtr x, size_t n, double* acc);
void accumulate(Ctx c, const double* x, Ptr y, size_t n);
void convert(Ctx c, CPtr src, Ptr dst, size_t n);

// ---- vocab.cu: vocab-parallel embedding and the three-phase cross-entropy -----------------------
void embedding_fwd(Ctx c, const int32_t* ids, int N, CPtr E, int v0, int V_local, int d, Ptr out);
void embedding_bwd(Ctx c, const int32_t* ids, int N, CPtr dout, int v0, int V_local, int d, Ptr dE);
void ce_row_max(Ctx c, CPtr logits, int N, int V_local, Ptr row_max);
void ce_sumexp_target(Ctx c, CPtr logits, const int32_t* targets, int N, int V_local, int v0,
                      CPtr row_max, Ptr sumexp, Ptr tgt);
void ce_loss_grad(Ctx c, Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max,
                  CPtr sumexp, CPtr tgt, double scale, Ptr loss);
void ce_loss(Ctx c, CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max,
             CPtr sumexp, CPtr tgt, Ptr loss);

// ---- norm.cu: WiolaRMSNorm (alone or after the residual add) ------------------------------------
void rmsnorm_fwd(Ctx c, CPtr x, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd, Ptr y_op);
// s = a + b, then the norm of s (b null: the norm of a; s unused); y_op
// (may be null) gets y's GEMM operand copy.
void add_rmsnorm_fwd(Ctx c, CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y,
                     Ptr rstd, Ptr y_op);
void rmsnorm_bwd(Ctx c, CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres, Ptr dx,
                 Ptr dgamma, Ptr ddelta);

// ---- srpe.cu: SRPE rotation (alone or fused with the Q|K|V|gate split) --------------------------
void srpe_apply(Ctx c, Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse);
// SRPE fused with the Q|K|V|gate split and with its gradients' join
// (Ops::srpe_split_fwd / _bwd): one kernel each way, no copies.
void srpe_split_fwd(Ctx c, CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, Ptr q, Ptr k, Ptr v,
                    Ptr gate);
void srpe_split_bwd(Ctx c, CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh, CPtr table,
                    Ptr dproj);

// ---- atm.cu: ATM similarity, plan and key/value merging -----------------------------------------
void atm_similarity(Ctx c, CPtr x, int B, int Tn, int d, double* rho);
void atm_plan(Ctx c, const double* rho, int B, int Tn, double tau, uint8_t* open, int32_t* group_first,
              int32_t* key_end, int32_t* n_groups);
void atm_merge_rows(Ctx c, CPtr x, int B, int Tn, int w, const int32_t* group_first,
                    const int32_t* key_end, const int32_t* n_groups, Ptr out);
void atm_merge_rows_bwd(Ctx c, CPtr dout, int B, int Tn, int w, const int32_t* group_first,
                        const int32_t* key_end, const int32_t* n_groups, Ptr dx);

// ---- gcla.cu: prefix mean, context attention, blend, output gate (and the two fused) ------------
// out_op (may be null): out again in its own storage type (the GEMM operand).
void prefix_mean_fwd(Ctx c, CPtr x, int B, int Tn, int d, Ptr out, Ptr out_op);
void prefix_mean_bwd(Ctx c, CPtr dout, int B, int Tn, int d, Ptr dx);
// carry null: prefix_mean_fwd.
void prefix_mean_carry_fwd(Ctx c, CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out, Ptr out_op);
void ctx_attention_fwd(Ctx c, CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, int ldkv,
                       Ptr out, Ptr probs);
void ctx_attention_bwd(Ctx c, CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H,
                       int Hkv, int dh, int ldkv, Ptr dq, Ptr dkc, Ptr dvc);
void sigmoid_gate_fwd(Ctx c, CPtr pre, CPtr x, size_t n, Ptr out);
void sigmoid_gate_bwd(Ctx c, CPtr pre, CPtr x, CPtr dout, size_t n, Ptr dpre, Ptr dx);
void blend_fwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out);
void blend_bwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx,
               double* dphi);
void blend_gate_fwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, size_t n, Ptr o, Ptr og);
void blend_gate_bwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, CPtr o, CPtr dog, size_t n, Ptr dpre,
                    Ptr d_self, Ptr d_ctx, double* dphi);

// ---- dsff.cu: SwiGLU, GELU, stream fusion -------------------------------------------------------
void swiglu_fwd(Ctx c, CPtr g, CPtr u, size_t n, Ptr h);
void swiglu_bwd(Ctx c, CPtr g, CPtr u, CPtr dh, size_t n, Ptr dg, Ptr du);
void gelu_fwd(Ctx c, CPtr x, size_t n, Ptr y);
void gelu_bwd(Ctx c, CPtr x, CPtr dy, size_t n, Ptr dx);
void fusion_fwd(Ctx c, CPtr pre, CPtr a, CPtr b, CPtr res, size_t n, Ptr out);
void fusion_bwd(Ctx c, CPtr pre, CPtr a, CPtr b, CPtr dout, size_t n, Ptr dpre, Ptr da, Ptr db);

// ---- optimizer.cu: AdamW (fused with the weight copy and the gradient zeroing) ------------------
void adamw(Ctx c, Ptr p, Ptr g, Ptr m, Ptr v, size_t n, double lr, double beta1, double beta2,
           double eps, double wd, double bc1, double bc2, Ptr w, bool zero_grad);

// ---- attention.cu --------------------------------------------------------------------
// attention_tc.cu: the tensor-core forward and backward for bf16 (head dims
// 32, 64, 96, 128). Return false, launching nothing, where they do not apply
// (fp32, other head dims, c.attn_fwd == ROWS); attention_fwd then runs the
// row kernel. c.attn_fwd == FA2: the forward runs attention_fa2.cu's kernel
// (the FlashAttention-2 form: register fragments, cp.async double
// buffering); TC, the default, until fa2 is measured on a GPU.
// attention_fa2.cu: the forward of attention_fwd_tc in the FlashAttention-2
// form (bf16, head dims 32, 64, 96, 128, 16-byte aligned q, k, v, o), at the
// tile shape c.attn_tile with c.attn_heads query heads a block (throws
// wiola::Error where that does not divide H / H_kv); false, launching
// nothing, where it does not apply.
bool attention_fwd_fa2(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k,
                       CPtr raw_v, Ptr o, Ptr lse);
// c.attn_bwd == V2 selects the second form of the tensor-core backward
// (attention_tc.cu), FA2 attention_fa2.cu's; V1, the default, is the one
// measured on a GPU.
// attention_fa2.cu: the backward in the FlashAttention-2 form (bf16, head dims
// 32, 64, 96, 128, 16-byte aligned q, k, v, dout, dq, dk, dv; q_pos0 = 0); a
// dK/dV kernel and a dQ kernel, deterministic, at the tile shape
// c.attn_bwd_tile (the same bits at each); false, launching nothing, where it
// does not apply.
bool attention_bwd_fa2(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k,
                       CPtr raw_v, CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k,
                       Ptr draw_v);
bool attention_fwd_tc(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k,
                      CPtr raw_v, Ptr o, Ptr lse);
// The backward's dq, dk, dv and raw-key gradients from D = rowsum(dO * O)
// (float [B, H, Tq], device memory); false where it does not apply.
bool attention_bwd_tc(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k,
                      CPtr raw_v, CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k,
                      Ptr draw_v);
void attention_fwd(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k,
                   CPtr raw_v, Ptr o, Ptr lse);
void attention_bwd(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k,
                   CPtr raw_v, CPtr o, CPtr lse, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k,
                   Ptr draw_v);

}  // namespace wiola::cuda
