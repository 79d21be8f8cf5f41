// One Wiola decoder layer (docs/model.md §2): GCLA with ATM inside, then
// DSFF, each behind a WiolaRMSNorm, on the residual stream. Forward and
// backward side by side in layer.cpp. Shapes: N = B*T tokens; local (TP) head
// and FFN sizes. Every buffer is backend memory; the storage type of each is
// chosen by its role (Precision, kernels/ops.h) in allocate().
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/arena.h"
#include "model/atm.h"
#include "model/collectives.h"
#include "model/config.h"
#include "model/params.h"

namespace wiola {

// Everything a layer needs besides its parameters and tensors.
template <class T>
struct LayerCtx {
  Ops<T>& ops;
  const ModelConfig& cfg;
  LocalDims ld;
  TpCollectives* tp;  // nullptr: one TP rank
  int B, T_;          // micro-batch sequences, positions per sequence
  CPtr srpe;          // SRPE table [T_, dh/2, 2] in backend memory
  Precision prec;     // storage types (ops.precision())
  // Scratch [N, qkvg_width] shared by all layers: the fused Q|K|V|gate
  // projection's output in the forward, its gradient in the backward
  // (LayerWork::proj where the model owns one).
  Ptr proj;
  // Documents (docs/model.md §2 "Documents"): [B, T_] the first position of
  // each position's document, in backend memory; null: each sequence is one
  // document. Attention, ATM's plan, SRPE and the summaries read it.
  const int32_t* doc_start = nullptr;
  int N() const { return B * T_; }
};

// Columns of the fused input projection: H dh (q) + 2 Hkv dh (k, v) + H dh (gate).
inline int qkvg_width(const LocalDims& ld) { return 2 * ld.H * ld.dh + 2 * ld.Hkv * ld.dh; }

// Saved activations of one layer for one micro-batch.
template <class T>
struct LayerActs {
  Ptr xn1, rstd1;                             // [N,d], [N]     input norm (X-tilde, residual type)
  Ptr xn1_op;                                 // [N,d] X-tilde in the activation type where that is narrower: the
                                              //       Q|K|V|gate GEMMs' operand, made by the norm (null: xn1 itself)
  Ptr q, k, v, gpre;                          // [N,H dh] SRPE'd, [N,Hkv dh] SRPE'd, [N,Hkv dh], [N,H dh]
  Ptr kg, vg;                                 // [N,Hkv dh] ATM-merged keys/values
  Ptr o_self, lse;                            // [N,H dh], [B,H,T]
  Ptr kvc;                                    // [N,nc,2,Hkv dh] context keys|values, interleaved (the merged
                                              //       projection's rows): keys at kvc, values at kvc + Hkv dh
  Ptr o_ctx, probs;                           // [N,H dh], [N,H,nc]
  Ptr o, og;                                  // blended, gated [N,H dh]
  Ptr xh;                                     // [N,d] X + A (X-half, residual stream)
  Ptr xn2, rstd2;                             // [N,d], [N]
  Ptr ga, ua, ha;                             // [N,dA]
  Ptr ub, hb;                                 // [N,dB]
  Ptr a, b, fpre;                             // [N,d]
  double* rho;                                // [B, T-1] ATM neighbour similarities
  int32_t *group_first, *key_end, *n_groups;  // ATM plan
  uint8_t* open;                              // [B, T] ATM decisions
  bool atm_active = false;
  Arena<T> arena;
  void allocate(const LayerCtx<T>& c, int nc) {
    reserve(c, nc);
    arena.commit(c.ops);
  }
  // Reserves without allocating (arena.reserved_bytes() sizes it).
  void reserve(const LayerCtx<T>& c, int nc);
};

// Gradient scratch shared by all layers (overwritten each layer).
template <class T>
struct LayerWork {
  Ptr dxn, dq, dk, dv, dgpre, dkg, dvg, dog, do_self, do_ctx;
  Ptr dkvc;  // [N,nc,2,Hkv dh] gradient of LayerActs::kvc (same layout)
  Ptr dfpre, da, db, dha, dhb, dga, dua, dub, dxh;
  Ptr proj;      // [N, qkvg_width] the LayerCtx::proj scratch
  double* dphi;  // [1] this call's dL/dφ (TP-partial until summed)
  Arena<T> arena;
  void allocate(const LayerCtx<T>& c) {
    reserve(c);
    arena.commit(c.ops);
  }
  void reserve(const LayerCtx<T>& c);
};

// The split backward (issue 37; dist/schedule.h's B and W): what one layer's
// weight-gradient GEMMs read, kept from its B (layer_backward_input) until
// its W (layer_backward_weight). The output gradients those GEMMs multiply
// are B's own results, written here instead of the shared LayerWork
// scratch; the activations they multiply are the layer's saved activations,
// which stay in the slot until W, except under recompute, where B rebuilds
// them in a shared scratch: then B copies them here (copy_acts). One per
// layer and weight slot (ModelOptions::weight_slots) of a stage that splits
// its backward.
template <class T>
struct LayerWeightInputs {
  // Output gradients: fusion gate, the two down projections, the three up
  // projections, the output projection (dX-half), the fused Q|K|V|gate
  // projection, the merged context keys|values (every context row).
  Ptr dfpre, da, db, dub, dga, dua, dxh, dproj, dkvc;
  // Copies of the activations (copy_acts only; else null): a, b, hb, ha,
  // xn2, og and X-tilde as the Q|K|V|gate GEMM reads it.
  Ptr a, b, hb, ha, xn2, og, xn1;
  bool copy_acts = false;
  Arena<T> arena;
  void allocate(const LayerCtx<T>& c, int nc, bool acts) {
    reserve(c, nc, acts);
    arena.commit(c.ops);
  }
  void reserve(const LayerCtx<T>& c, int nc, bool acts);
};

// Cached decoding: this layer's keys (SRPE'd) and values of earlier positions,
// [B, capacity, Hkv dh]; new rows are appended at `len` (the caller advances it).
struct KvSlot {
  Ptr k, v;
  int capacity = 0;
  int len = 0;
};

// x_out = layer_l(x, ctx). ctx: nc summaries [N,d], oldest first, as the
// context projections' GEMMs read them (only they do): the model passes the
// summaries' copies in the activation type where that is narrower, made
// with each summary (Model's Slot::S_op), else the summaries. p: the
// forward view of the parameters (ModelParams::bind_forward).
// training: ATM active in its layers (docs/model.md §2); eval runs with ATM off.
template <class T>
void layer_forward(const LayerCtx<T>& c, int l, const LayerParams& p, CPtr x, const CPtr* ctx, int nc, bool training,
                   LayerActs<T>& a, Ptr x_out, const KvSlot* kv = nullptr);

// Backward of layer_forward. dx_out: gradient of x_out. Writes dx (overwrite),
// accumulates into parameter gradients g and into dctx[i] (gradients of the
// context summaries; TP-partial: the caller all-reduces them).
template <class T>
void layer_backward(const LayerCtx<T>& c, int l, const LayerParams& p, const LayerParams& g, CPtr x, const CPtr* ctx,
                    int nc, LayerActs<T>& a, LayerWork<T>& w, CPtr dx_out, Ptr dx, const Ptr* dctx);

// layer_backward in two parts. B (layer_backward_input): the same outputs
// (dx, dctx) and the gradients of the norms' γ/δ and of φ, without the
// weight-gradient GEMMs, whose operands it leaves in `k`. W
// (layer_backward_weight): those GEMMs, accumulating into g.wf, g.db, g.da,
// g.ub, g.ga, g.ua, g.wo, g.wkvc and g.wqkvg in layer_backward's order.
// a and ctx: the layer's activations and context operands, as in B (W reads
// a only without copy_acts). B then W equals layer_backward bit for bit.
template <class T>
void layer_backward_input(const LayerCtx<T>& c, int l, const LayerParams& p, const LayerParams& g, CPtr x,
                          const CPtr* ctx, int nc, LayerActs<T>& a, LayerWork<T>& w, CPtr dx_out, Ptr dx,
                          const Ptr* dctx, LayerWeightInputs<T>& k);
template <class T>
void layer_backward_weight(const LayerCtx<T>& c, const LayerParams& g, const CPtr* ctx, int nc, const LayerActs<T>& a,
                           const LayerWeightInputs<T>& k);

}  // namespace wiola
