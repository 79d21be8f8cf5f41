#include "model/layer.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "model/linear.h"
#include "util/error.h"

namespace wiola {

template <class T>
void LayerActs<T>::reserve(const LayerCtx<T>& c, int nc) {
  const size_t N = size_t(c.N()), d = size_t(c.cfg.d);
  const size_t hd = size_t(c.ld.H) * c.ld.dh, kvd = size_t(c.ld.Hkv) * c.ld.dh;
  const size_t dA = size_t(c.ld.dA), dB = size_t(c.ld.dB);
  const DType act = c.prec.act, res = c.prec.residual, st = dtype_of<T>();  // st: statistics
  auto& r = arena;
  // X-tilde in the residual type: ATM's similarity must come from full-
  // precision activations (docs/model.md §2), never from a bf16 copy.
  r.reserve(&xn1, res, N * d);
  r.reserve(&rstd1, st, N);
  if (dtype_bytes(act) < dtype_bytes(res)) r.reserve(&xn1_op, act, N * d);
  r.reserve(&q, act, N * hd);
  r.reserve(&k, act, N * kvd);
  r.reserve(&v, act, N * kvd);
  r.reserve(&gpre, act, N * hd);
  r.reserve(&kg, act, N * kvd);
  r.reserve(&vg, act, N * kvd);
  r.reserve(&o_self, act, N * hd);
  r.reserve(&lse, st, N * size_t(c.ld.H));
  r.reserve(&kvc, act, N * size_t(nc) * 2 * kvd);
  r.reserve(&o_ctx, act, N * hd);
  r.reserve(&probs, st, N * size_t(c.ld.H) * size_t(nc));
  r.reserve(&o, act, N * hd);
  r.reserve(&og, act, N * hd);
  r.reserve(&xh, res, N * d);
  r.reserve(&xn2, act, N * d);
  r.reserve(&rstd2, st, N);
  r.reserve(&ga, act, N * dA);
  r.reserve(&ua, act, N * dA);
  r.reserve(&ha, act, N * dA);
  r.reserve(&ub, act, N * dB);
  r.reserve(&hb, act, N * dB);
  r.reserve(&a, act, N * d);
  r.reserve(&b, act, N * d);
  r.reserve(&fpre, act, N * d);
  r.reserve(&rho, size_t(c.B) * size_t(std::max(c.T_ - 1, 1)));
  r.reserve(&group_first, N);
  r.reserve(&key_end, N);
  r.reserve(&n_groups, size_t(c.B));
  r.reserve(&open, N);
}

template <class T>
void LayerWork<T>::reserve(const LayerCtx<T>& c) {
  const size_t N = size_t(c.N()), d = size_t(c.cfg.d);
  const size_t hd = size_t(c.ld.H) * c.ld.dh, kvd = size_t(c.ld.Hkv) * c.ld.dh;
  const size_t dA = size_t(c.ld.dA), dB = size_t(c.ld.dB);
  const size_t nc = size_t(c.cfg.Lambda);
  const DType act = c.prec.act, res = c.prec.residual;
  auto& r = arena;
  // dxn sums four (GCLA) or three (DSFF) GEMM products: residual type.
  r.reserve(&dxn, res, N * d);
  r.reserve(&dq, act, N * hd);
  r.reserve(&dk, act, N * kvd);
  r.reserve(&dv, act, N * kvd);
  r.reserve(&dgpre, act, N * hd);
  r.reserve(&dkg, act, N * kvd);
  r.reserve(&dvg, act, N * kvd);
  r.reserve(&dog, act, N * hd);
  r.reserve(&do_self, act, N * hd);
  r.reserve(&do_ctx, act, N * hd);
  r.reserve(&dkvc, act, N * nc * 2 * kvd);
  r.reserve(&dfpre, act, N * d);
  r.reserve(&da, act, N * d);
  r.reserve(&db, act, N * d);
  r.reserve(&dha, act, N * dA);
  r.reserve(&dhb, act, N * dB);
  r.reserve(&dga, act, N * dA);
  r.reserve(&dua, act, N * dA);
  r.reserve(&dub, act, N * dB);
  r.reserve(&dxh, res, N * d);
  r.reserve(&proj, act, N * size_t(qkvg_width(c.ld)));
  r.reserve(&dphi, 1);
}

template <class T>
void LayerWeightInputs<T>::reserve(const LayerCtx<T>& c, int nc, bool acts) {
  const size_t N = size_t(c.N()), d = size_t(c.cfg.d);
  const size_t hd = size_t(c.ld.H) * c.ld.dh, kvd = size_t(c.ld.Hkv) * c.ld.dh;
  const size_t dA = size_t(c.ld.dA), dB = size_t(c.ld.dB);
  const DType act = c.prec.act, res = c.prec.residual;
  auto& r = arena;
  // The types of the LayerWork buffers they stand in for.
  r.reserve(&dfpre, act, N * d);
  r.reserve(&da, act, N * d);
  r.reserve(&db, act, N * d);
  r.reserve(&dub, act, N * dB);
  r.reserve(&dga, act, N * dA);
  r.reserve(&dua, act, N * dA);
  r.reserve(&dxh, res, N * d);
  r.reserve(&dproj, act, N * size_t(qkvg_width(c.ld)));
  r.reserve(&dkvc, act, N * size_t(nc) * 2 * kvd);
  copy_acts = acts;
  if (!acts) return;
  // The types of the LayerActs buffers they copy (X-tilde: xn1_operand's).
  r.reserve(&a, act, N * d);
  r.reserve(&b, act, N * d);
  r.reserve(&hb, act, N * dB);
  r.reserve(&ha, act, N * dA);
  r.reserve(&xn2, act, N * d);
  r.reserve(&og, act, N * hd);
  r.reserve(&xn1, dtype_bytes(act) < dtype_bytes(res) ? act : res, N * d);
}

namespace {

// ATM merge decision on X-tilde (docs/model.md §2): cosine of neighbours in
// double and Algorithm 1, both on the backend; nothing returns to the host.
template <class T>
void atm_decide(const LayerCtx<T>& c, LayerActs<T>& a) {
  c.ops.atm_similarity(a.xn1, c.B, c.T_, c.cfg.d, a.rho);
  c.ops.atm_plan(a.rho, c.B, c.T_, c.cfg.tau, c.doc_start, a.open, a.group_first, a.key_end, a.n_groups);
}

// X-tilde as the input projection's GEMMs read it: the norm's copy in the
// activation type where that is narrower (one conversion per layer, not one
// inside each GEMM), else X-tilde itself.
template <class T>
CPtr xn1_operand(const LayerActs<T>& a) {
  return a.xn1_op ? a.xn1_op : a.xn1;
}

// The fused input projection (docs/model.md §3): q, k, v and the gate's
// input are column blocks [H dh | Hkv dh | Hkv dh | H dh] of one
// [N, qkvg_width] product in the proj scratch, [q | k | v | gate] = X-tilde
// [wq; wk; wv; wgate]^T. The later ops read each as a whole tensor: one op
// splits the blocks out with SRPE applied to q and k on the way
// (srpe_split_fwd), and its backward joins their gradients back with the
// rotation undone (srpe_split_bwd), around the one GEMM of each direction.
template <class T>
void qkvg_fwd(const LayerCtx<T>& c, const LayerParams& p, LayerActs<T>& a) {
  WIOLA_CHECK(c.proj, "layer forward: no fused-projection scratch in the layer context");
  linear_fwd(c.ops, xn1_operand(a), p.wqkvg, c.N(), c.cfg.d, qkvg_width(c.ld), c.proj);
  c.ops.srpe_split_fwd(c.proj, c.B, c.T_, c.ld.H, c.ld.Hkv, c.ld.dh, c.srpe, c.doc_start, a.q, a.k, a.v, a.gpre);
}

// dX-tilde (overwritten) and the four weight gradients (accumulated) from
// dq, dk (SRPE undone as they are joined), dv, dgate: one GEMM each. The TP
// sum of dX-tilde starts between them, hidden behind the weight gradients.
// dproj: where the joined gradient goes (the proj scratch, or a split
// backward's LayerWeightInputs::dproj); weights false: B of a split
// backward, the weight GEMM left to W.
template <class T>
TpInFlight qkvg_bwd(const LayerCtx<T>& c, const LayerParams& p, const LayerParams& g, const LayerActs<T>& a,
                    const LayerWork<T>& w, Ptr dproj, bool weights) {
  const int N = c.N(), d = c.cfg.d, width = qkvg_width(c.ld);
  c.ops.srpe_split_bwd(w.dq, w.dk, w.dv, w.dgpre, c.B, c.T_, c.ld.H, c.ld.Hkv, c.ld.dh, c.srpe, c.doc_start, dproj);
  linear_bwd_x(c.ops, dproj, p.wqkvg, N, d, width, w.dxn);
  TpInFlight sum = tp_start_sum(c.tp, w.dxn, size_t(N) * d);
  if (weights) linear_bwd_w(c.ops, dproj, xn1_operand(a), N, d, width, g.wqkvg);
  return sum;
}

template <class T>
AttnShape attn_shape(const LayerCtx<T>& c) {
  AttnShape s;
  s.B = c.B;
  s.Tq = c.T_;
  s.Tk = c.T_;
  s.H = c.ld.H;
  s.Hkv = c.ld.Hkv;
  s.dh = c.ld.dh;
  return s;
}

}  // namespace

template <class T>
void layer_forward(const LayerCtx<T>& c, int l, const LayerParams& p, CPtr x, const CPtr* ctx, int nc, bool training,
                   LayerActs<T>& a, Ptr x_out, const KvSlot* kv) {
  Ops<T>& ops = c.ops;
  const int N = c.N(), d = c.cfg.d, dh = c.ld.dh;
  const int hd = c.ld.H * dh, kvd = c.ld.Hkv * dh;
  const size_t nhd = size_t(N) * hd;

  // ---- GCLA (docs/model.md §2) ----
  ops.rmsnorm_fwd(x, p.ln1_g, p.ln1_d, N, d, c.cfg.eps, a.xn1, a.rstd1, a.xn1_op);
  qkvg_fwd(c, p, a);  // q and k with SRPE applied

  // Self-attention; in ATM layers over merged keys/values of each prefix.
  AttnShape s = attn_shape(c);
  a.atm_active = training && !kv && c.cfg.atm_layer(l);
  if (kv) {
    // Append this chunk's keys/values; queries sit at positions len.. and
    // causality hides the cache rows not written yet.
    for (int b = 0; b < c.B; ++b) {
      const size_t dst = (size_t(b) * kv->capacity + kv->len) * kvd;
      const size_t src = size_t(b) * c.T_ * kvd;
      const size_t bytes = size_t(c.T_) * kvd * dtype_bytes(c.prec.act);
      ops.copy((kv->k + dst).raw(), (a.k + src).raw(), bytes);
      ops.copy((kv->v + dst).raw(), (a.v + src).raw(), bytes);
    }
    s.Tk = kv->capacity;
    s.q_pos0 = kv->len;
    ops.attention_fwd(s, AttnKeys{}, a.q, kv->k, kv->v, nullptr, nullptr, a.o_self, a.lse);
  } else if (a.atm_active) {
    atm_decide(c, a);
    ops.atm_merge_rows(a.k, c.B, c.T_, kvd, a.group_first, a.key_end, a.n_groups, a.kg);
    ops.atm_merge_rows(a.v, c.B, c.T_, kvd, a.group_first, a.key_end, a.n_groups, a.vg);
    AttnKeys keys{a.key_end, a.n_groups, a.open, c.doc_start};
    ops.attention_fwd(s, keys, a.q, a.kg, a.vg, a.k, a.v, a.o_self, a.lse);
  } else {
    ops.attention_fwd(s, AttnKeys{nullptr, nullptr, nullptr, c.doc_start}, a.q, a.k, a.v, nullptr, nullptr, a.o_self,
                      a.lse);
  }

  // Context sub-attention over the cross-layer summaries (no SRPE): one
  // GEMM per summary with the merged [wkc; wvc] (docs/model.md §3): context
  // row i of every token lands at column block i of kvc[N, nc, 2 Hkv dh],
  // its keys then its values.
  const int kv2 = 2 * kvd;
  for (int i = 0; i < nc; ++i)
    ops.gemm(Trans::N, Trans::T, N, kv2, d, T(1), ctx[i], d, p.wkvc, d, T(0), a.kvc + size_t(i) * kv2, nc * kv2);
  ops.ctx_attention_fwd(a.q, a.kvc, a.kvc + kvd, N, nc, c.ld.H, c.ld.Hkv, dh, kv2, a.o_ctx, a.probs);

  // Blend with beta = sigmoid(phi), then the sigmoid output gate (one op),
  // output projection.
  ops.blend_gate_fwd(a.o_self, a.o_ctx, p.phi, a.gpre, nhd, a.o, a.og);
  linear_fwd(ops, a.og, p.wo, N, hd, d, a.xh);  // A (row-parallel)
  tp_sum(c.tp, a.xh, size_t(N) * d);

  // ---- DSFF (docs/model.md §2); X-half = X + A, normed in the same pass ----
  ops.add_rmsnorm_fwd(x, a.xh, a.xh, p.ln2_g, p.ln2_d, N, d, c.cfg.eps, a.xn2, a.rstd2, nullptr);
  const int dA = c.ld.dA, dB = c.ld.dB;
  linear_fwd(ops, a.xn2, p.ga, N, d, dA, a.ga);
  linear_fwd(ops, a.xn2, p.ua, N, d, dA, a.ua);
  ops.swiglu_fwd(a.ga, a.ua, size_t(N) * dA, a.ha);
  linear_fwd(ops, a.ha, p.da, N, dA, d, a.a);                 // a (row-parallel)
  TpInFlight a_sum = tp_start_sum(c.tp, a.a, size_t(N) * d);  // hidden behind stream B
  linear_fwd(ops, a.xn2, p.ub, N, d, dB, a.ub);
  ops.gelu_fwd(a.ub, size_t(N) * dB, a.hb);
  linear_fwd(ops, a.hb, p.db, N, dB, d, a.b);  // b (row-parallel)
  tp_sum(c.tp, a.b, size_t(N) * d);
  a_sum.finish();
  // Fusion gate on [a; b] with W_f [d, 2d] (a's columns first).
  ops.gemm(Trans::N, Trans::T, N, d, d, T(1), a.a, d, p.wf, 2 * d, T(0), a.fpre, d);
  ops.gemm(Trans::N, Trans::T, N, d, d, T(1), a.b, d, p.wf + d, 2 * d, T(1), a.fpre, d);
  ops.fusion_fwd(a.fpre, a.a, a.b, a.xh, size_t(N) * d, x_out);  // X' = X-half + F
}

namespace {

// The weight-gradient GEMMs' operands: the output gradients and the
// activations they multiply (layer_backward: the LayerWork scratch and the
// layer's activations; a split backward: its LayerWeightInputs).
struct WeightOperands {
  Ptr dfpre, da, db, dub, dga, dua, dxh, dproj, dkvc;
  CPtr a, b, hb, ha, xn2, og, xn1;
};

template <class T>
WeightOperands operands(const LayerCtx<T>& c, const LayerActs<T>& a, const LayerWork<T>& w) {
  return {w.dfpre, w.da, w.db, w.dub, w.dga, w.dua, w.dxh, c.proj,
          w.dkvc,  a.a,  a.b,  a.hb,  a.ha,  a.xn2, a.og,  xn1_operand(a)};
}

template <class T>
WeightOperands operands(const LayerActs<T>& a, const LayerWeightInputs<T>& k) {
  if (!k.copy_acts)
    return {k.dfpre, k.da, k.db, k.dub, k.dga, k.dua, k.dxh, k.dproj,
            k.dkvc,  a.a,  a.b,  a.hb,  a.ha,  a.xn2, a.og,  xn1_operand(a)};
  return {k.dfpre, k.da, k.db, k.dub, k.dga, k.dua, k.dxh, k.dproj, k.dkvc, k.a, k.b, k.hb, k.ha, k.xn2, k.og, k.xn1};
}

// layer_backward (k null), or B of a split backward (k: the weight GEMMs'
// operands go there and the GEMMs are left to layer_backward_weight).
template <class T>
void backward(const LayerCtx<T>& c, const LayerParams& p, const LayerParams& g, CPtr x, const CPtr* ctx, int nc,
              LayerActs<T>& a, LayerWork<T>& w, CPtr dx_out, Ptr dx, const Ptr* dctx, LayerWeightInputs<T>* k) {
  Ops<T>& ops = c.ops;
  const int N = c.N(), d = c.cfg.d, dh = c.ld.dh;
  const int hd = c.ld.H * dh, kvd = c.ld.Hkv * dh, dA = c.ld.dA, dB = c.ld.dB;
  const size_t nd = size_t(N) * d, nhd = size_t(N) * hd;
  const bool weights = k == nullptr;  // run the weight GEMMs here
  const WeightOperands o = k ? operands(a, *k) : operands(c, a, w);
  if (k && k->copy_acts) {  // recompute: the scratch activations are gone by W
    const auto keep = [&](Ptr dst, CPtr src, size_t n) {
      ops.copy(dst.raw(), src.raw(), n * dtype_bytes(src.dtype()));
    };
    const CPtr xn1 = xn1_operand(a);
    keep(k->a, a.a, nd);
    keep(k->b, a.b, nd);
    keep(k->hb, a.hb, size_t(N) * dB);
    keep(k->ha, a.ha, size_t(N) * dA);
    keep(k->xn2, a.xn2, nd);
    keep(k->og, a.og, nhd);
    keep(k->xn1, xn1, nd);
  }

  // ---- DSFF backward; the residual passes dx_out to X-half ----
  ops.fusion_bwd(a.fpre, a.a, a.b, dx_out, nd, o.dfpre, o.da, o.db);
  ops.gemm(Trans::N, Trans::N, N, d, d, T(1), o.dfpre, d, p.wf, 2 * d, T(1), o.da, d);
  ops.gemm(Trans::N, Trans::N, N, d, d, T(1), o.dfpre, d, p.wf + d, 2 * d, T(1), o.db, d);
  if (weights) {
    ops.gemm(Trans::T, Trans::N, d, d, N, T(1), o.dfpre, d, o.a, d, T(1), g.wf, 2 * d);
    ops.gemm(Trans::T, Trans::N, d, d, N, T(1), o.dfpre, d, o.b, d, T(1), g.wf + d, 2 * d);
  }
  // stream B
  linear_bwd_x(ops, o.db, p.db, N, dB, d, w.dhb);
  if (weights) linear_bwd_w(ops, o.db, o.hb, N, dB, d, g.db);
  ops.gelu_bwd(a.ub, w.dhb, size_t(N) * dB, o.dub);
  linear_bwd_x(ops, o.dub, p.ub, N, d, dB, w.dxn);
  // stream A
  linear_bwd_x(ops, o.da, p.da, N, dA, d, w.dha);
  if (weights) linear_bwd_w(ops, o.da, o.ha, N, dA, d, g.da);
  ops.swiglu_bwd(a.ga, a.ua, w.dha, size_t(N) * dA, o.dga, o.dua);
  linear_bwd_x(ops, o.dga, p.ga, N, d, dA, w.dxn, T(1));
  linear_bwd_x(ops, o.dua, p.ua, N, d, dA, w.dxn, T(1));
  // The column-parallel input gradient's TP sum runs while the weight
  // gradients of the up projections, which do not need it, are computed.
  TpInFlight mlp_dxn_sum = tp_start_sum(c.tp, w.dxn, nd);
  if (weights) {
    linear_bwd_w(ops, o.dub, o.xn2, N, d, dB, g.ub);
    linear_bwd_w(ops, o.dga, o.xn2, N, d, dA, g.ga);
    linear_bwd_w(ops, o.dua, o.xn2, N, d, dA, g.ua);
  }
  mlp_dxn_sum.finish();
  // dX-half = dX' (the residual) + the norm's input gradient.
  ops.rmsnorm_bwd(a.xh, p.ln2_g, p.ln2_d, a.rstd2, w.dxn, N, d, dx_out, o.dxh, g.ln2_g, g.ln2_d);

  // ---- GCLA backward; dA = dX-half ----
  linear_bwd_x(ops, o.dxh, p.wo, N, hd, d, w.dog);
  if (weights) linear_bwd_w(ops, o.dxh, o.og, N, hd, d, g.wo);
  // The gate's backward, then the blend's (one op). dφ sums over this rank's
  // heads only: sum over TP (φ is replicated), then add to φ's gradient, all
  // in backend memory.
  ops.blend_gate_bwd(a.o_self, a.o_ctx, p.phi, a.gpre, a.o, w.dog, nhd, w.dgpre, w.do_self, w.do_ctx, w.dphi);
  tp_sum(c.tp, w.dphi, 1);
  ops.accumulate(w.dphi, g.phi, 1);

  // Self-attention first (it overwrites dq), then the context path adds to dq.
  const AttnShape s = attn_shape(c);
  if (a.atm_active) {
    AttnKeys keys{a.key_end, a.n_groups, a.open, c.doc_start};
    ops.attention_bwd(s, keys, a.q, a.kg, a.vg, a.k, a.v, a.o_self, a.lse, w.do_self, w.dq, w.dkg, w.dvg, w.dk, w.dv);
    // Gradients of merged rows flow back to their members (means).
    ops.atm_merge_rows_bwd(w.dkg, c.B, c.T_, kvd, a.group_first, a.key_end, a.n_groups, w.dk);
    ops.atm_merge_rows_bwd(w.dvg, c.B, c.T_, kvd, a.group_first, a.key_end, a.n_groups, w.dv);
  } else {
    ops.attention_bwd(s, AttnKeys{nullptr, nullptr, nullptr, c.doc_start}, a.q, a.k, a.v, nullptr, nullptr, a.o_self,
                      a.lse, w.do_self, w.dq, w.dk, w.dv, nullptr, nullptr);
  }
  // The context keys' and values' gradients, interleaved as kvc, then per
  // summary one GEMM of the merged projection for dctx[i] (K = 2 Hkv dh)
  // and one for the gradient of [wkc; wvc].
  const int kv2 = 2 * kvd;
  ops.ctx_attention_bwd(a.q, a.kvc, a.kvc + kvd, a.probs, w.do_ctx, N, nc, c.ld.H, c.ld.Hkv, dh, kv2, w.dq, o.dkvc,
                        o.dkvc + kvd);
  for (int i = 0; i < nc; ++i) {
    const CPtr dkvc_i = o.dkvc + size_t(i) * kv2;
    ops.gemm(Trans::N, Trans::N, N, d, kv2, T(1), dkvc_i, nc * kv2, p.wkvc, d, T(1), dctx[i], d);
    if (weights) ops.gemm(Trans::T, Trans::N, kv2, d, N, T(1), dkvc_i, nc * kv2, ctx[i], d, T(1), g.wkvc, d);
  }
  // The input projections, SRPE undone (transpose rotation) as their
  // gradients are joined.
  TpInFlight attn_dxn_sum = qkvg_bwd(c, p, g, a, w, o.dproj, weights);
  attn_dxn_sum.finish();
  ops.rmsnorm_bwd(x, p.ln1_g, p.ln1_d, a.rstd1, w.dxn, N, d, o.dxh, dx, g.ln1_g, g.ln1_d);  // dX = dX-half + ...
}

}  // namespace

template <class T>
void layer_backward(const LayerCtx<T>& c, int, const LayerParams& p, const LayerParams& g, CPtr x, const CPtr* ctx,
                    int nc, LayerActs<T>& a, LayerWork<T>& w, CPtr dx_out, Ptr dx, const Ptr* dctx) {
  backward(c, p, g, x, ctx, nc, a, w, dx_out, dx, dctx, static_cast<LayerWeightInputs<T>*>(nullptr));
}

template <class T>
void layer_backward_input(const LayerCtx<T>& c, int, const LayerParams& p, const LayerParams& g, CPtr x,
                          const CPtr* ctx, int nc, LayerActs<T>& a, LayerWork<T>& w, CPtr dx_out, Ptr dx,
                          const Ptr* dctx, LayerWeightInputs<T>& k) {
  backward(c, p, g, x, ctx, nc, a, w, dx_out, dx, dctx, &k);
}

// The weight GEMMs of backward() in its order, on the kept operands.
template <class T>
void layer_backward_weight(const LayerCtx<T>& c, const LayerParams& g, const CPtr* ctx, int nc, const LayerActs<T>& a,
                           const LayerWeightInputs<T>& k) {
  Ops<T>& ops = c.ops;
  const int N = c.N(), d = c.cfg.d, dh = c.ld.dh;
  const int hd = c.ld.H * dh, kvd = c.ld.Hkv * dh, dA = c.ld.dA, dB = c.ld.dB;
  const WeightOperands o = operands(a, k);
  ops.gemm(Trans::T, Trans::N, d, d, N, T(1), o.dfpre, d, o.a, d, T(1), g.wf, 2 * d);
  ops.gemm(Trans::T, Trans::N, d, d, N, T(1), o.dfpre, d, o.b, d, T(1), g.wf + d, 2 * d);
  linear_bwd_w(ops, o.db, o.hb, N, dB, d, g.db);
  linear_bwd_w(ops, o.da, o.ha, N, dA, d, g.da);
  linear_bwd_w(ops, o.dub, o.xn2, N, d, dB, g.ub);
  linear_bwd_w(ops, o.dga, o.xn2, N, d, dA, g.ga);
  linear_bwd_w(ops, o.dua, o.xn2, N, d, dA, g.ua);
  linear_bwd_w(ops, o.dxh, o.og, N, hd, d, g.wo);
  const int kv2 = 2 * kvd;
  for (int i = 0; i < nc; ++i)
    ops.gemm(Trans::T, Trans::N, kv2, d, N, T(1), o.dkvc + size_t(i) * kv2, nc * kv2, ctx[i], d, T(1), g.wkvc, d);
  linear_bwd_w(ops, o.dproj, o.xn1, N, d, qkvg_width(c.ld), g.wqkvg);
}

#define WIOLA_INSTANTIATE_LAYER(T) \
  template struct LayerActs<T>; \
  template struct LayerWork<T>; \
  template void layer_forward<T>(const LayerCtx<T>&, int, const LayerParams&, CPtr, const CPtr*, int, bool, \
                                 LayerActs<T>&, Ptr, const KvSlot*); \
  template void layer_backward<T>(const LayerCtx<T>&, int, const LayerParams&, const LayerParams&, CPtr, const CPtr*, \
                                  int, LayerActs<T>&, LayerWork<T>&, CPtr, Ptr, const Ptr*); \
  template struct LayerWeightInputs<T>; \
  template void layer_backward_input<T>(const LayerCtx<T>&, int, const LayerParams&, const LayerParams&, CPtr, \
                                        const CPtr*, int, LayerActs<T>&, LayerWork<T>&, CPtr, Ptr, const Ptr*, \
                                        LayerWeightInputs<T>&); \
  template void layer_backward_weight<T>(const LayerCtx<T>&, const LayerParams&, const CPtr*, int, \
                                         const LayerActs<T>&, const LayerWeightInputs<T>&);
WIOLA_INSTANTIATE_LAYER(float)
WIOLA_INSTANTIATE_LAYER(double)

}  // namespace wiola
