// The list of ops: every numerical operation of the op interface, once, with
// its doc comment (conventions: kernels/ops.h). Everything that names each op
// is made from this list, so an op is written here and in its kernels only:
//   the Ops<T> interface (kernels/ops.h), the forwarding and profiling
//   wrappers (kernels/forwarding_ops.h, kernels/profiled_ops.h), the op
//   names and classes profiles report (kernels/op_info.h), the CPU backend's
//   members (kernels/cpu/cpu_ops.h: each calls cpu::NAME on host pointers,
//   kernels/cpu/kernels.h) and the CUDA backend's (kernels/cuda/cuda_ops.cu:
//   each calls the launcher cuda::NAME(Ctx, ...), declared from this list in
//   kernels/cuda/kernels.cuh). docs/architecture.md, "Adding an op".
//
// An entry is
//   WIOLA_OP(name, class, (parameters), (arguments))
// name: the Ops member (and kernel) name; class: the profile class it is
// reported under (an OpClass of kernels/op_info.h: a name that is not one
// fails to compile); parameters: its typed parameter list (T: the compute
// type of Ops<T>); arguments: those parameters' names in order (checked at
// compile time, kernels/op_info.cpp). WIOLA_BACKEND_OP entries (memory
// transfers, BLAS) have the same form; each backend writes them itself
// instead of calling a kernel of their name.
//
// No include guard: a file defines WIOLA_OP (and, to tell the two kinds
// apart, WIOLA_BACKEND_OP), includes this list, and the list undefines both.
#ifndef WIOLA_BACKEND_OP
#define WIOLA_BACKEND_OP WIOLA_OP
#endif

// ---- memory ------------------------------------------------------------------
WIOLA_BACKEND_OP(upload, copies, (void* dst, const void* host_src, size_t bytes), (dst, host_src, bytes))
WIOLA_BACKEND_OP(download, copies, (void* host_dst, const void* src, size_t bytes), (host_dst, src, bytes))
WIOLA_BACKEND_OP(copy, copies, (void* dst, const void* src, size_t bytes), (dst, src, bytes))
WIOLA_BACKEND_OP(zero, copies, (void* p, size_t bytes), (p, bytes))
// dst[i] = src[i] between storage types (master weights -> weight copy).
WIOLA_BACKEND_OP(convert, copies, (CPtr src, Ptr dst, size_t n), (src, dst, n))
// dst[r, 0:cols] = src[r, 0:cols] for r < rows: a block of columns of
// row-major matrices whose rows are ld_dst and ld_src elements apart, one
// storage type. (The model splits the fused Q|K|V|gate projection's output
// with srpe_split_fwd, which gives copy_block's bits, SRPE fused in.)
WIOLA_BACKEND_OP(copy_block, copies, (Ptr dst, int ld_dst, CPtr src, int ld_src, int rows, int cols),
                 (dst, ld_dst, src, ld_src, rows, cols))

// ---- BLAS ----------------------------------------------------------------------
// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C (accumulated in T or
// wider whatever the storage types)
WIOLA_BACKEND_OP(gemm, gemm,
                 (Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, CPtr B, int ldb, T beta, Ptr C,
                  int ldc),
                 (ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
// The same for `batch` independent problems at fixed strides (elements).
WIOLA_BACKEND_OP(gemm_strided_batched, gemm,
                 (Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A, int lda, long sA, CPtr B, int ldb, long sB,
                  T beta, Ptr C, int ldc, long sC, int batch),
                 (ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch))

// ---- elementwise and reductions --------------------------------------------
// out = a+b
WIOLA_OP(add, elementwise, (CPtr a, CPtr b, Ptr out, size_t n), (a, b, out, n))
// y += a*x
WIOLA_OP(axpy, elementwise, (T alpha, CPtr x, Ptr y, size_t n), (alpha, x, y, n))
WIOLA_OP(scale, elementwise, (Ptr x, T s, size_t n), (x, s, n))
// acc[0] += sum of x[i]^2 / of x[i], summed in double; acc is a backend
// double (the caller zeroes it, then downloads it once when it needs it).
WIOLA_OP(sum_squares, optimizer, (CPtr x, size_t n, double* acc), (x, n, acc))
WIOLA_OP(sum, optimizer, (CPtr x, size_t n, double* acc), (x, n, acc))
// y[i] = y[i] + x[i], added in double: double partial results (dL/dφ after
// its TP sum) into a gradient.
WIOLA_OP(accumulate, optimizer, (const double* x, Ptr y, size_t n), (x, y, n))

// ---- embedding (vocab-parallel: rows [v0, v0+V_local) live here) --------
// out[N,d] = E[ids - v0] for ids in range, 0 otherwise.
WIOLA_OP(embedding_fwd, embedding, (const int32_t* ids, int N, CPtr E, int v0, int V_local, int d, Ptr out),
         (ids, N, E, v0, V_local, d, out))
// dE[id - v0] += dout[i] for ids in range.
WIOLA_OP(embedding_bwd, embedding, (const int32_t* ids, int N, CPtr dout, int v0, int V_local, int d, Ptr dE),
         (ids, N, dout, v0, V_local, d, dE))

// ---- WiolaRMSNorm: z = x + delta; y = gamma * z / sqrt(mean(z^2) + eps) ----
// rstd[N] saved for backward. y_op (may be null) gets y again in its own
// storage type, the bits convert(y, y_op) would write: the GEMM operand
// copy of a norm output kept wider than the GEMMs' operands (the residual
// type's X-tilde feeding bf16 GEMMs), made in the same pass.
WIOLA_OP(rmsnorm_fwd, norm, (CPtr x, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd, Ptr y_op),
         (x, gamma, delta, N, d, eps, y, rstd, y_op))
// The residual add fused with the norm that follows it: s = a + b (the
// residual stream after a sub-layer; s may be a or b), then the norm of s
// as rmsnorm_fwd (y_op too). The same results as add, then rmsnorm_fwd, in
// one pass.
WIOLA_OP(add_rmsnorm_fwd, norm,
         (CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta, int N, int d, double eps, Ptr y, Ptr rstd, Ptr y_op),
         (a, b, s, gamma, delta, N, d, eps, y, rstd, y_op))
// dx = dres + dz: the residual branch's gradient dres joins the norm's
// (dres may be dx itself: accumulate; or null: dx = dz); dgamma, ddelta
// accumulate.
WIOLA_OP(rmsnorm_bwd, norm,
         (CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy, int N, int d, CPtr dres, Ptr dx, Ptr dgamma, Ptr ddelta),
         (x, gamma, delta, rstd, dy, N, d, dres, dx, dgamma, ddelta))

// ---- SRPE: rotate-half pairs of each head, in place ------------------------
// x[B, Tn, nh, dh]; table[Tn, dh/2, 2] = (c, s) for positions of rows
// 0..Tn-1 (host-computed in float64, rounded once; see model/srpe.h).
// Documents (docs/model.md §2 "Documents"; doc_start[B,Tn] as in atm_plan,
// null: one document): row t of sequence b has position t - doc_start[b,t].
// inverse=true applies the transpose rotation (= the backward pass). dh even.
WIOLA_OP(srpe_apply, elementwise, (Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse),
         (x, B, Tn, nh, dh, table, inverse))
// SRPE fused with the split of the fused input projection (model/layer.cpp):
// proj[B Tn, width] holds the column blocks [q: H dh | k: Hkv dh | v: Hkv dh
// | gate: H dh], width = 2 H dh + 2 Hkv dh, all one storage type.
// srpe_split_fwd writes q[B,Tn,H,dh] and k[B,Tn,Hkv,dh] rotated, v and
// gate as they are: the bits of copy_block of each block, then srpe_apply
// on q and k. srpe_split_bwd writes their gradients' join into dproj with
// dq and dk rotated back (inverse), dq and dk left as they are: the bits
// of srpe_apply(inverse) on dq and dk, then copy_block of each into dproj.
// One pass over the blocks each way, no copies in between.
WIOLA_OP(srpe_split_fwd, elementwise,
         (CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, const int32_t* doc_start, Ptr q, Ptr k, Ptr v,
          Ptr gate),
         (proj, B, Tn, H, Hkv, dh, table, doc_start, q, k, v, gate))
WIOLA_OP(srpe_split_bwd, elementwise,
         (CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh, CPtr table,
          const int32_t* doc_start, Ptr dproj),
         (dq, dk, dv, dgate, B, Tn, H, Hkv, dh, table, doc_start, dproj))

// ---- causal self-attention with GQA and ATM key merging ---------------------
// q[B,Tq,H,dh], k,v[B,Tk,Hkv,dh], raw_k,raw_v[B,Tq,Hkv,dh] (only read where
// self_open). out o[B,Tq,H,dh], lse[B,H,Tq] (log-sum-exp of scaled scores,
// saved for backward). Scale 1/sqrt(dh). Tiled, online softmax: no
// [B,H,Tq,Tk] buffer.
WIOLA_OP(attention_fwd, attention,
         (const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o, Ptr lse),
         (s, keys, q, k, v, raw_k, raw_v, o, lse))
// Overwrites dq[B,Tq,H,dh], dk,dv[B,Tk,Hkv,dh], draw_k,draw_v[B,Tq,Hkv,dh]
// (zero where not self_open; may be null when self_open is nullptr).
WIOLA_OP(attention_bwd, attention,
         (const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, CPtr o, CPtr lse,
          CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v),
         (s, keys, q, k, v, raw_k, raw_v, o, lse, dout, dq, dk, dv, draw_k, draw_v))

// ---- ATM (docs/model.md §2): similarity, merge plan, merged keys/values ----
// rho[B, Tn-1] (backend doubles): rho_t = x_t.x_{t+1} / (|x_t| |x_{t+1}|),
// 0 if a norm is 0, accumulated in double.
WIOLA_OP(atm_similarity, atm, (CPtr x, int B, int Tn, int d, double* rho), (x, B, Tn, d, rho))
// The merge plan of every sequence (kernels/atm_plan.h: Algorithm 1 and the
// key layout): open[B,Tn], group_first[B,Tn], key_end[B,Tn], n_groups[B].
// doc_start[B,Tn] (null: one document per sequence): the first position of
// each position's document (docs/model.md §2 "Documents"); no pair crosses a
// document's start.
WIOLA_OP(atm_plan, atm,
         (const double* rho, int B, int Tn, double tau, const int32_t* doc_start, uint8_t* open, int32_t* group_first,
          int32_t* key_end, int32_t* n_groups),
         (rho, B, Tn, tau, doc_start, open, group_first, key_end, n_groups))
// Merge rows of x[B,Tn,w] into out[B,Tn,w] (rows >= n_groups[b] zero):
// out[b,j] = mean of x[b, group_first[b,j] .. key_end[b,j]].
WIOLA_OP(atm_merge_rows, atm,
         (CPtr x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups,
          Ptr out),
         (x, B, Tn, w, group_first, key_end, n_groups, out))
// dx[b,t] += dout[b,j] / |group j| for every member t of group j.
WIOLA_OP(atm_merge_rows_bwd, atm,
         (CPtr dout, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups,
          Ptr dx),
         (dout, B, Tn, w, group_first, key_end, n_groups, dx))

// ---- GCLA pieces --------------------------------------------------------------
// Prefix mean over positions: out[b,t] = mean_{u<=t} x[b,u]; x,out [B,Tn,d].
// out_op (may be null) gets out again in its own storage type, the bits
// convert(out, out_op) would write: the context projections' GEMM operand
// of a summary, made once in this pass (as rmsnorm_fwd's y_op).
// Documents (doc_start[B,Tn] as in atm_plan, null: one document): the mean
// runs over u in [doc_start[b,t], t] only, restarting at each document.
WIOLA_OP(prefix_mean_fwd, context_attention,
         (CPtr x, int B, int Tn, int d, const int32_t* doc_start, Ptr out, Ptr out_op),
         (x, B, Tn, d, doc_start, out, out_op))
// dx[b,u] += sum_{t>=u} dout[b,t]/(t+1)   (ACCUMULATES); with documents the
// sum runs over t in u's document and divides by t - doc_start + 1.
WIOLA_OP(prefix_mean_bwd, context_attention, (CPtr dout, int B, int Tn, int d, const int32_t* doc_start, Ptr dx),
         (dout, B, Tn, d, doc_start, dx))
// Cached decoding: rows are positions pos0..pos0+Tn-1 and carry[B,d] holds
// the sums of all earlier rows: out[b,i] = (carry[b] + sum_{u<=i} x[b,u]) /
// (pos0+i+1), then carry[b] += sum_u x[b,u]. out_op as in prefix_mean_fwd.
WIOLA_OP(prefix_mean_carry_fwd, context_attention,
         (CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out, Ptr out_op),
         (x, B, Tn, d, pos0, carry, out, out_op))
// Context sub-attention: per token n and head h, softmax over nc context
// rows of q[n,h].kc[n,i,g]/sqrt(dh), g = h % Hkv.
// q[N,H,dh]; out[N,H,dh], probs[N,H,nc]. kc, vc: the nc context rows of
// each token, row (n, i) at (n nc + i) ldkv, each [Hkv, dh] (ldkv >= Hkv
// dh): Hkv dh for [N,nc,Hkv,dh] tensors, 2 Hkv dh for the interleaved
// keys|values [N,nc,2,Hkv,dh] of the merged context projection (vc = kc +
// Hkv dh).
WIOLA_OP(ctx_attention_fwd, context_attention,
         (CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, int ldkv, Ptr out, Ptr probs),
         (q, kc, vc, N, nc, H, Hkv, dh, ldkv, out, probs))
// dq ACCUMULATES (q also feeds self-attention); dkc, dvc overwrite their
// rows (the layout of kc, vc; the elements between rows are untouched).
WIOLA_OP(ctx_attention_bwd, context_attention,
         (CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H, int Hkv, int dh, int ldkv, Ptr dq,
          Ptr dkc, Ptr dvc),
         (q, kc, vc, probs, dout, N, nc, H, Hkv, dh, ldkv, dq, dkc, dvc))
// out = (1-beta)*o_self + beta*o_ctx, beta = sigmoid(phi[0]); phi is the
// layer's φ in backend memory (read by the op: no host round trip).
WIOLA_OP(blend_fwd, elementwise, (CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out), (o_self, o_ctx, phi, n, out))
// d_self = (1-beta) dout, d_ctx = beta dout (overwrite); dphi[0] (backend
// double) = dL/dφ of this call (overwrite; summed in double).
WIOLA_OP(blend_bwd, elementwise,
         (CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx, double* dphi),
         (o_self, o_ctx, phi, dout, n, d_self, d_ctx, dphi))
// out = sigmoid(pre) * x
WIOLA_OP(sigmoid_gate_fwd, elementwise, (CPtr pre, CPtr x, size_t n, Ptr out), (pre, x, n, out))
WIOLA_OP(sigmoid_gate_bwd, elementwise, (CPtr pre, CPtr x, CPtr dout, size_t n, Ptr dpre, Ptr dx),
         (pre, x, dout, n, dpre, dx))
// The blend and the gate after it in one pass: o = blend_fwd(o_self,
// o_ctx, phi), og = sigmoid(pre) * o, with o rounded to its storage type
// before the gate reads it: the bits of blend_fwd, then sigmoid_gate_fwd.
WIOLA_OP(blend_gate_fwd, elementwise, (CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, size_t n, Ptr o, Ptr og),
         (o_self, o_ctx, phi, pre, n, o, og))
// Their backward in one pass: sigmoid_gate_bwd(pre, o, dog) into dpre and
// dL/do (rounded to the storage type of d_self, never stored), then
// blend_bwd of dL/do into d_self, d_ctx and dphi[0]: the bits of the two.
WIOLA_OP(blend_gate_bwd, elementwise,
         (CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, CPtr o, CPtr dog, size_t n, Ptr dpre, Ptr d_self, Ptr d_ctx,
          double* dphi),
         (o_self, o_ctx, phi, pre, o, dog, n, dpre, d_self, d_ctx, dphi))

// ---- DSFF pieces -------------------------------------------------------------
// h = SiLU(g) * u
WIOLA_OP(swiglu_fwd, elementwise, (CPtr g, CPtr u, size_t n, Ptr h), (g, u, n, h))
WIOLA_OP(swiglu_bwd, elementwise, (CPtr g, CPtr u, CPtr dh, size_t n, Ptr dg, Ptr du), (g, u, dh, n, dg, du))
// y = GELU(x) (exact erf form)
WIOLA_OP(gelu_fwd, elementwise, (CPtr x, size_t n, Ptr y), (x, n, y))
WIOLA_OP(gelu_bwd, elementwise, (CPtr x, CPtr dy, size_t n, Ptr dx), (x, dy, n, dx))
// out = res + alpha*a + (1-alpha)*b, alpha = sigmoid(pre): the fusion gate
// with the residual add after it (res may be null: no residual).
WIOLA_OP(fusion_fwd, elementwise, (CPtr pre, CPtr a, CPtr b, CPtr res, size_t n, Ptr out), (pre, a, b, res, n, out))
WIOLA_OP(fusion_bwd, elementwise, (CPtr pre, CPtr a, CPtr b, CPtr dout, size_t n, Ptr dpre, Ptr da, Ptr db),
         (pre, a, b, dout, n, dpre, da, db))

// ---- cross-entropy, in three phases so TP can all-reduce between them ----
// (vocab-parallel: logits[N, V_local] hold columns [v0, v0+V_local).)
// Phase 1: row_max[N] = max over local columns.
WIOLA_OP(ce_row_max, cross_entropy, (CPtr logits, int N, int V_local, Ptr row_max), (logits, N, V_local, row_max))
// Phase 2: sumexp[N] = sum exp(logit - row_max); tgt[N] = logit[target]
// if target in the local slice else 0.
WIOLA_OP(ce_sumexp_target, cross_entropy,
         (CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, Ptr sumexp, Ptr tgt),
         (logits, targets, N, V_local, v0, row_max, sumexp, tgt))
// Phase 3: loss[N] = log(sumexp) + row_max - tgt, and in place
// logits <- scale * (softmax - onehot(target)) = dL/dlogits. A negative
// target is a masked position (an EOS's target with documents, docs/model.md
// §2 "Documents"): loss 0 and a zero gradient row (ce_loss: loss 0).
WIOLA_OP(ce_loss_grad, cross_entropy,
         (Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt,
          double scale, Ptr loss),
         (logits, targets, N, V_local, v0, row_max, sumexp, tgt, scale, loss))
// Phase 3 with z-loss (train.z_loss, docs/model.md §4): as ce_loss_grad, and
// zloss[N] = z * lse^2 with lse = log(sumexp) + row_max, the gradient of
// CE + z lse^2: logits <- scale * ((1 + 2 z lse) softmax - onehot(target)).
// A masked target (negative): loss 0, zloss 0, a zero gradient row.
WIOLA_OP(ce_loss_grad_z, cross_entropy,
         (Ptr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt,
          double scale, double z, Ptr loss, Ptr zloss),
         (logits, targets, N, V_local, v0, row_max, sumexp, tgt, scale, z, loss, zloss))
// Logits-only softmax statistics for evaluation (no gradient).
WIOLA_OP(ce_loss, cross_entropy,
         (CPtr logits, const int32_t* targets, int N, int V_local, int v0, CPtr row_max, CPtr sumexp, CPtr tgt,
          Ptr loss),
         (logits, targets, N, V_local, v0, row_max, sumexp, tgt, loss))

// ---- optimizer -------------------------------------------------------------------
// PyTorch AdamW on a flat range: p *= 1 - lr*wd; m,v moments; bias
// corrections bc1 = 1-beta1^t, bc2 = 1-beta2^t. Fused with the passes that
// follow an update: w (may be null) gets the updated p in its own storage
// type, the bits convert(p, w) would write (the weight copy GEMMs read),
// and with zero_grad g is zeroed once read (ready for the next step's
// accumulation).
WIOLA_OP(adamw, optimizer,
         (Ptr p, Ptr g, Ptr m, Ptr v, size_t n, double lr, double beta1, double beta2, double eps, double wd,
          double bc1, double bc2, Ptr w, bool zero_grad),
         (p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2, w, zero_grad))

#undef WIOLA_OP
#undef WIOLA_BACKEND_OP
