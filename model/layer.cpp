#include "model/layer.h"

#include <cmath>

#include "model/linear.h"

namespace wiola {

template <class T>
void LayerActs<T>::allocate(const LayerCtx<T>& c, int nc) {
  const size_t N = size_t(c.N()), d = size_t(c.cfg.d);
  const size_t hd = size_t(c.ld.H) * c.ld.dh, kvd = size_t(c.ld.Hkv) * c.ld.dh;
  const size_t dA = size_t(c.ld.dA), dB = size_t(c.ld.dB);
  auto& r = arena;
  r.reserve(&xn1, N * d); r.reserve(&rstd1, N);
  r.reserve(&q, N * hd); r.reserve(&k, N * kvd); r.reserve(&v, N * kvd);
  r.reserve(&gpre, N * hd);
  r.reserve(&kg, N * kvd); r.reserve(&vg, N * kvd);
  r.reserve(&o_self, N * hd); r.reserve(&lse, N * size_t(c.ld.H));
  r.reserve(&kc, N * size_t(nc) * kvd); r.reserve(&vc, N * size_t(nc) * kvd);
  r.reserve(&o_ctx, N * hd); r.reserve(&probs, N * size_t(c.ld.H) * size_t(nc));
  r.reserve(&o, N * hd); r.reserve(&og, N * hd);
  r.reserve(&xh, N * d); r.reserve(&xn2, N * d); r.reserve(&rstd2, N);
  r.reserve(&ga, N * dA); r.reserve(&ua, N * dA); r.reserve(&ha, N * dA);
  r.reserve(&ub, N * dB); r.reserve(&hb, N * dB);
  r.reserve(&a, N * d); r.reserve(&b, N * d); r.reserve(&fpre, N * d);
  r.reserve(&group_first, N); r.reserve(&key_end, N);
  r.reserve(&n_groups, size_t(c.B)); r.reserve(&open, N);
  r.commit(c.ops);
}

template <class T>
void LayerWork<T>::allocate(const LayerCtx<T>& c) {
  const size_t N = size_t(c.N()), d = size_t(c.cfg.d);
  const size_t hd = size_t(c.ld.H) * c.ld.dh, kvd = size_t(c.ld.Hkv) * c.ld.dh;
  const size_t dA = size_t(c.ld.dA), dB = size_t(c.ld.dB);
  const size_t nc = size_t(c.cfg.Lambda);
  auto& r = arena;
  r.reserve(&dxn, N * d); r.reserve(&dq, N * hd); r.reserve(&dk, N * kvd);
  r.reserve(&dv, N * kvd); r.reserve(&dgpre, N * hd);
  r.reserve(&dkg, N * kvd); r.reserve(&dvg, N * kvd);
  r.reserve(&dog, N * hd); r.reserve(&d_o, N * hd); r.reserve(&do_self, N * hd); r.reserve(&do_ctx, N * hd);
  r.reserve(&dkc, N * nc * kvd); r.reserve(&dvc, N * nc * kvd);
  r.reserve(&dfpre, N * d); r.reserve(&da, N * d); r.reserve(&db, N * d);
  r.reserve(&dha, N * dA); r.reserve(&dhb, N * dB);
  r.reserve(&dga, N * dA); r.reserve(&dua, N * dA); r.reserve(&dub, N * dB);
  r.reserve(&dxh, N * d);
  r.commit(c.ops);
}

namespace {

template <class T>
double read_scalar(Ops<T>& ops, const T* p) {
  T v{};
  ops.download(&v, p, sizeof(T));
  return double(v);
}

template <class T>
void add_scalar(Ops<T>& ops, T* p, double delta) {
  T v{};
  ops.download(&v, p, sizeof(T));
  v = T(double(v) + delta);
  ops.upload(p, &v, sizeof(T));
}

// ATM merge decision on X-tilde (SPEC §2): cosine of neighbours in double,
// greedy Algorithm 1 on the host, layout uploaded for the attention op.
template <class T>
void atm_decide(const LayerCtx<T>& c, LayerActs<T>& a) {
  const int B = c.B, Tn = c.T_;
  std::vector<double> rho(size_t(B) * (Tn - 1));
  c.ops.atm_similarity(a.xn1, B, Tn, c.cfg.d, rho.data());
  std::vector<uint8_t> open(size_t(B) * Tn, 0);
  for (int b = 0; b < B; ++b) {
    auto ob = atm_greedy_open(rho.data() + size_t(b) * (Tn - 1), Tn, c.cfg.tau);
    std::copy(ob.begin(), ob.end(), open.begin() + size_t(b) * Tn);
  }
  a.atm = atm_layout(std::move(open), B, Tn);
  c.ops.upload(a.open, a.atm.open.data(), a.atm.open.size());
  c.ops.upload(a.group_first, a.atm.group_first.data(), a.atm.group_first.size() * 4);
  c.ops.upload(a.key_end, a.atm.key_end.data(), a.atm.key_end.size() * 4);
  c.ops.upload(a.n_groups, a.atm.n_groups.data(), a.atm.n_groups.size() * 4);
}

template <class T>
AttnShape attn_shape(const LayerCtx<T>& c) {
  AttnShape s;
  s.B = c.B; s.Tq = c.T_; s.Tk = c.T_;
  s.H = c.ld.H; s.Hkv = c.ld.Hkv; s.dh = c.ld.dh;
  return s;
}

}  // namespace

template <class T>
void layer_forward(const LayerCtx<T>& c, int l, const LayerParams<T>& p,
                   const T* x, const T* const* ctx, int nc, bool training,
                   LayerActs<T>& a, T* x_out, const KvSlot<T>* kv) {
  Ops<T>& ops = c.ops;
  const int N = c.N(), d = c.cfg.d, dh = c.ld.dh;
  const int hd = c.ld.H * dh, kvd = c.ld.Hkv * dh;
  const size_t nhd = size_t(N) * hd;

  // ---- GCLA (SPEC §2) ----
  ops.rmsnorm_fwd(x, p.ln1_g, p.ln1_d, N, d, c.cfg.eps, a.xn1, a.rstd1);
  linear_fwd(ops, a.xn1, p.wq, N, d, hd, a.q);
  linear_fwd(ops, a.xn1, p.wk, N, d, kvd, a.k);
  linear_fwd(ops, a.xn1, p.wv, N, d, kvd, a.v);
  linear_fwd(ops, a.xn1, p.wgate, N, d, hd, a.gpre);
  ops.srpe_apply(a.q, c.B, c.T_, c.ld.H, dh, c.srpe, false);
  ops.srpe_apply(a.k, c.B, c.T_, c.ld.Hkv, dh, c.srpe, false);

  // Self-attention; in ATM layers over merged keys/values of each prefix.
  AttnShape s = attn_shape(c);
  a.atm_active = training && !kv && c.cfg.atm_layer(l);
  if (kv) {
    // Append this chunk's keys/values; queries sit at positions len.. and
    // causality hides the cache rows not written yet.
    for (int b = 0; b < c.B; ++b) {
      const size_t dst = (size_t(b) * kv->capacity + kv->len) * kvd;
      const size_t src = size_t(b) * c.T_ * kvd;
      ops.copy(kv->k + dst, a.k + src, size_t(c.T_) * kvd * sizeof(T));
      ops.copy(kv->v + dst, a.v + src, size_t(c.T_) * kvd * sizeof(T));
    }
    s.Tk = kv->capacity;
    s.q_pos0 = kv->len;
    ops.attention_fwd(s, AttnKeys{}, a.q, kv->k, kv->v, nullptr, nullptr, a.o_self, a.lse);
  } else if (a.atm_active) {
    atm_decide(c, a);
    ops.atm_merge_rows(a.k, c.B, c.T_, kvd, a.group_first, a.key_end, a.n_groups, a.kg);
    ops.atm_merge_rows(a.v, c.B, c.T_, kvd, a.group_first, a.key_end, a.n_groups, a.vg);
    AttnKeys keys{a.key_end, a.n_groups, a.open};
    ops.attention_fwd(s, keys, a.q, a.kg, a.vg, a.k, a.v, a.o_self, a.lse);
  } else {
    ops.attention_fwd(s, AttnKeys{}, a.q, a.k, a.v, nullptr, nullptr, a.o_self, a.lse);
  }

  // Context sub-attention over the cross-layer summaries (no SRPE): context
  // row i of every token lands at column block i of kc[N, nc, Hkv dh].
  for (int i = 0; i < nc; ++i) {
    ops.gemm(Trans::N, Trans::T, N, kvd, d, T(1), ctx[i], d, p.wkc, d, T(0), a.kc + size_t(i) * kvd, nc * kvd);
    ops.gemm(Trans::N, Trans::T, N, kvd, d, T(1), ctx[i], d, p.wvc, d, T(0), a.vc + size_t(i) * kvd, nc * kvd);
  }
  ops.ctx_attention_fwd(a.q, a.kc, a.vc, N, nc, c.ld.H, c.ld.Hkv, dh, a.o_ctx, a.probs);

  // Blend with beta = sigmoid(phi), sigmoid output gate, output projection.
  ops.blend_fwd(a.o_self, a.o_ctx, read_scalar(ops, p.phi), nhd, a.o);
  ops.sigmoid_gate_fwd(a.gpre, a.o, nhd, a.og);
  linear_fwd(ops, a.og, p.wo, N, hd, d, a.xh);  // A (row-parallel)
  tp_sum(c.tp, a.xh, size_t(N) * d);
  ops.add(x, a.xh, a.xh, size_t(N) * d);        // X-half = X + A

  // ---- DSFF (SPEC §2) ----
  ops.rmsnorm_fwd(a.xh, p.ln2_g, p.ln2_d, N, d, c.cfg.eps, a.xn2, a.rstd2);
  const int dA = c.ld.dA, dB = c.ld.dB;
  linear_fwd(ops, a.xn2, p.ga, N, d, dA, a.ga);
  linear_fwd(ops, a.xn2, p.ua, N, d, dA, a.ua);
  ops.swiglu_fwd(a.ga, a.ua, size_t(N) * dA, a.ha);
  linear_fwd(ops, a.ha, p.da, N, dA, d, a.a);  // a (row-parallel)
  linear_fwd(ops, a.xn2, p.ub, N, d, dB, a.ub);
  ops.gelu_fwd(a.ub, size_t(N) * dB, a.hb);
  linear_fwd(ops, a.hb, p.db, N, dB, d, a.b);  // b (row-parallel)
  tp_sum(c.tp, a.a, size_t(N) * d);
  tp_sum(c.tp, a.b, size_t(N) * d);
  // Fusion gate on [a; b] with W_f [d, 2d] (a's columns first).
  ops.gemm(Trans::N, Trans::T, N, d, d, T(1), a.a, d, p.wf, 2 * d, T(0), a.fpre, d);
  ops.gemm(Trans::N, Trans::T, N, d, d, T(1), a.b, d, p.wf + d, 2 * d, T(1), a.fpre, d);
  ops.fusion_fwd(a.fpre, a.a, a.b, size_t(N) * d, x_out);
  ops.add(a.xh, x_out, x_out, size_t(N) * d);  // X' = X-half + F
}

template <class T>
void layer_backward(const LayerCtx<T>& c, int l, const LayerParams<T>& p,
                    const LayerParams<T>& g, const T* x, const T* const* ctx,
                    int nc, LayerActs<T>& a, LayerWork<T>& w, const T* dx_out,
                    T* dx, T* const* dctx) {
  Ops<T>& ops = c.ops;
  const int N = c.N(), d = c.cfg.d, dh = c.ld.dh;
  const int hd = c.ld.H * dh, kvd = c.ld.Hkv * dh, dA = c.ld.dA, dB = c.ld.dB;
  const size_t nd = size_t(N) * d, nhd = size_t(N) * hd;

  // ---- DSFF backward; the residual passes dx_out to X-half ----
  ops.fusion_bwd(a.fpre, a.a, a.b, dx_out, nd, w.dfpre, w.da, w.db);
  ops.gemm(Trans::N, Trans::N, N, d, d, T(1), w.dfpre, d, p.wf, 2 * d, T(1), w.da, d);
  ops.gemm(Trans::N, Trans::N, N, d, d, T(1), w.dfpre, d, p.wf + d, 2 * d, T(1), w.db, d);
  ops.gemm(Trans::T, Trans::N, d, d, N, T(1), w.dfpre, d, a.a, d, T(1), g.wf, 2 * d);
  ops.gemm(Trans::T, Trans::N, d, d, N, T(1), w.dfpre, d, a.b, d, T(1), g.wf + d, 2 * d);
  // stream B
  linear_bwd_x(ops, w.db, p.db, N, dB, d, w.dhb);
  linear_bwd_w(ops, w.db, a.hb, N, dB, d, g.db);
  ops.gelu_bwd(a.ub, w.dhb, size_t(N) * dB, w.dub);
  linear_bwd_x(ops, w.dub, p.ub, N, d, dB, w.dxn);
  linear_bwd_w(ops, w.dub, a.xn2, N, d, dB, g.ub);
  // stream A
  linear_bwd_x(ops, w.da, p.da, N, dA, d, w.dha);
  linear_bwd_w(ops, w.da, a.ha, N, dA, d, g.da);
  ops.swiglu_bwd(a.ga, a.ua, w.dha, size_t(N) * dA, w.dga, w.dua);
  linear_bwd_x(ops, w.dga, p.ga, N, d, dA, w.dxn, T(1));
  linear_bwd_w(ops, w.dga, a.xn2, N, d, dA, g.ga);
  linear_bwd_x(ops, w.dua, p.ua, N, d, dA, w.dxn, T(1));
  linear_bwd_w(ops, w.dua, a.xn2, N, d, dA, g.ua);
  tp_sum(c.tp, w.dxn, nd);  // column-parallel input gradient
  ops.copy(w.dxh, dx_out, nd * sizeof(T));
  ops.rmsnorm_bwd(a.xh, p.ln2_g, p.ln2_d, a.rstd2, w.dxn, N, d, w.dxh, g.ln2_g, g.ln2_d);

  // ---- GCLA backward; dA = dX-half ----
  linear_bwd_x(ops, w.dxh, p.wo, N, hd, d, w.dog);
  linear_bwd_w(ops, w.dxh, a.og, N, hd, d, g.wo);
  ops.sigmoid_gate_bwd(a.gpre, a.o, w.dog, nhd, w.dgpre, w.d_o);
  // dφ sums over this rank's heads only: sum over TP (φ is replicated).
  const double dphi = ops.blend_bwd(a.o_self, a.o_ctx, read_scalar(ops, p.phi), w.d_o, nhd, w.do_self, w.do_ctx);
  add_scalar(ops, g.phi, tp_sum_scalar(c.tp, dphi));

  // Self-attention first (it overwrites dq), then the context path adds to dq.
  const AttnShape s = attn_shape(c);
  if (a.atm_active) {
    AttnKeys keys{a.key_end, a.n_groups, a.open};
    ops.attention_bwd(s, keys, a.q, a.kg, a.vg, a.k, a.v, a.o_self, a.lse, w.do_self, w.dq, w.dkg, w.dvg, w.dk, w.dv);
    // Gradients of merged rows flow back to their members (means).
    ops.atm_merge_rows_bwd(w.dkg, c.B, c.T_, kvd, a.group_first, a.key_end, a.n_groups, w.dk);
    ops.atm_merge_rows_bwd(w.dvg, c.B, c.T_, kvd, a.group_first, a.key_end, a.n_groups, w.dv);
  } else {
    ops.attention_bwd(s, AttnKeys{}, a.q, a.k, a.v, nullptr, nullptr, a.o_self, a.lse, w.do_self, w.dq, w.dk, w.dv, nullptr, nullptr);
  }
  ops.ctx_attention_bwd(a.q, a.kc, a.vc, a.probs, w.do_ctx, N, nc, c.ld.H, c.ld.Hkv, dh, w.dq, w.dkc, w.dvc);
  for (int i = 0; i < nc; ++i) {
    const T* dkc_i = w.dkc + size_t(i) * kvd;
    const T* dvc_i = w.dvc + size_t(i) * kvd;
    ops.gemm(Trans::N, Trans::N, N, d, kvd, T(1), dkc_i, nc * kvd, p.wkc, d, T(1), dctx[i], d);
    ops.gemm(Trans::N, Trans::N, N, d, kvd, T(1), dvc_i, nc * kvd, p.wvc, d, T(1), dctx[i], d);
    ops.gemm(Trans::T, Trans::N, kvd, d, N, T(1), dkc_i, nc * kvd, ctx[i], d, T(1), g.wkc, d);
    ops.gemm(Trans::T, Trans::N, kvd, d, N, T(1), dvc_i, nc * kvd, ctx[i], d, T(1), g.wvc, d);
  }
  // Undo SRPE (transpose rotation), then the input projections.
  ops.srpe_apply(w.dq, c.B, c.T_, c.ld.H, dh, c.srpe, true);
  ops.srpe_apply(w.dk, c.B, c.T_, c.ld.Hkv, dh, c.srpe, true);
  linear_bwd_x(ops, w.dq, p.wq, N, d, hd, w.dxn);
  linear_bwd_w(ops, w.dq, a.xn1, N, d, hd, g.wq);
  linear_bwd_x(ops, w.dk, p.wk, N, d, kvd, w.dxn, T(1));
  linear_bwd_w(ops, w.dk, a.xn1, N, d, kvd, g.wk);
  linear_bwd_x(ops, w.dv, p.wv, N, d, kvd, w.dxn, T(1));
  linear_bwd_w(ops, w.dv, a.xn1, N, d, kvd, g.wv);
  linear_bwd_x(ops, w.dgpre, p.wgate, N, d, hd, w.dxn, T(1));
  linear_bwd_w(ops, w.dgpre, a.xn1, N, d, hd, g.wgate);
  tp_sum(c.tp, w.dxn, nd);
  ops.copy(dx, w.dxh, nd * sizeof(T));  // residual
  ops.rmsnorm_bwd(x, p.ln1_g, p.ln1_d, a.rstd1, w.dxn, N, d, dx, g.ln1_g, g.ln1_d);
}

#define WIOLA_INSTANTIATE_LAYER(T)                                              \
  template struct LayerActs<T>;                                                 \
  template struct LayerWork<T>;                                                 \
  template void layer_forward<T>(const LayerCtx<T>&, int, const LayerParams<T>&, \
                                 const T*, const T* const*, int, bool,          \
                                 LayerActs<T>&, T*, const KvSlot<T>*);                          \
  template void layer_backward<T>(const LayerCtx<T>&, int, const LayerParams<T>&, \
                                  const LayerParams<T>&, const T*,              \
                                  const T* const*, int, LayerActs<T>&,          \
                                  LayerWork<T>&, const T*, T*, T* const*);
WIOLA_INSTANTIATE_LAYER(float)
WIOLA_INSTANTIATE_LAYER(double)

}  // namespace wiola
