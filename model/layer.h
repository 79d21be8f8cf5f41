// One Wiola decoder layer (SPEC §2): GCLA with ATM inside, then DSFF, each
// behind a WiolaRMSNorm, on the residual stream. Forward and backward side by
// side in layer.cpp. Shapes: N = B*T tokens; local (TP) head and FFN sizes.
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
  TpCollectives<T>* tp;  // nullptr: one TP rank
  int B, T_;             // micro-batch sequences, positions per sequence
  const T* srpe;         // SRPE table [T_, dh/2, 2] in backend memory
  int N() const { return B * T_; }
};

// Saved activations of one layer for one micro-batch.
template <class T>
struct LayerActs {
  T *xn1, *rstd1;             // [N,d], [N]     input norm
  T *q, *k, *v, *gpre;        // [N,H dh] SRPE'd, [N,Hkv dh] SRPE'd, [N,Hkv dh], [N,H dh]
  T *kg, *vg;                 // [N,Hkv dh] ATM-merged keys/values
  T *o_self, *lse;            // [N,H dh], [B,H,T]
  T *kc, *vc;                 // [N,nc,Hkv dh] context keys/values
  T *o_ctx, *probs;           // [N,H dh], [N,H,nc]
  T *o, *og;                  // blended, gated [N,H dh]
  T *xh;                      // [N,d] X + A (X-half)
  T *xn2, *rstd2;             // [N,d], [N]
  T *ga, *ua, *ha;            // [N,dA]
  T *ub, *hb;                 // [N,dB]
  T *a, *b, *fpre;            // [N,d]
  int32_t *group_first, *key_end, *n_groups;  // ATM layout (backend memory)
  uint8_t* open;
  bool atm_active = false;
  AtmLayout atm;              // host copy: dump, statistics
  Arena<T> arena;
  void allocate(const LayerCtx<T>& c, int nc);
};

// Gradient scratch shared by all layers (overwritten each layer).
template <class T>
struct LayerWork {
  T *dxn, *dq, *dk, *dv, *dgpre, *dkg, *dvg, *dog, *d_o, *do_self, *do_ctx;
  T *dkc, *dvc, *dfpre, *da, *db, *dha, *dhb, *dga, *dua, *dub, *dxh;
  Arena<T> arena;
  void allocate(const LayerCtx<T>& c);
};

// Cached decoding: this layer's keys (SRPE'd) and values of earlier positions,
// [B, capacity, Hkv dh]; new rows are appended at `len` (the caller advances it).
template <class T>
struct KvSlot {
  T* k = nullptr;
  T* v = nullptr;
  int capacity = 0;
  int len = 0;
};

// x_out = layer_l(x, ctx). ctx: nc pointers to summaries [N,d], oldest first.
// training: ATM active in its layers (SPEC §2); eval runs with ATM off.
template <class T>
void layer_forward(const LayerCtx<T>& c, int l, const LayerParams<T>& p,
                   const T* x, const T* const* ctx, int nc, bool training,
                   LayerActs<T>& a, T* x_out, const KvSlot<T>* kv = nullptr);

// Backward of layer_forward. dx_out: gradient of x_out. Writes dx (overwrite),
// accumulates into parameter gradients g and into dctx[i] (gradients of the
// context summaries; TP-partial: the caller all-reduces them).
template <class T>
void layer_backward(const LayerCtx<T>& c, int l, const LayerParams<T>& p,
                    const LayerParams<T>& g, const T* x, const T* const* ctx,
                    int nc, LayerActs<T>& a, LayerWork<T>& w, const T* dx_out,
                    T* dx, T* const* dctx);

}  // namespace wiola
