// What the two bf16 self-attention implementations share (attention_tc.cu:
// WMMA tiles in shared memory; attention_fa2_{fwd,bwd}.cu: the FlashAttention-2 form in
// registers): the visible key prefix of a position, whether the device grants
// a block's shared memory, and the raw self-key gradients of one query row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/ops.h"

namespace wiola::cuda {

// Key rows visible to position p: a prefix of [0, nk) (rows sorted by
// key_end; plain causal where key_end is null).
__device__ inline int visible_prefix(const int32_t* key_end, int b, int Tk, int nk, int p) {
  if (!key_end) return min(nk, max(p + 1, 0));
  const int32_t* e = key_end + size_t(b) * Tk;
  int lo = 0, hi = nk;  // first row with key_end > p
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (e[mid] <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Whether this device grants a block `bytes` of dynamic shared memory (the
// opt-in limit, read once per process: one device per rank). A100 and H100
// do for every head dim here; smaller parts fall back to the row kernels.
bool attention_smem_fits(size_t bytes);

// draw_k, draw_v of query row i of KV group g in sequence b, by one warp
// (`lane`): the group's heads h = g, g + Hkv, ... in order, each adding
// dS q and P dO for the row's own raw key; zero where the row does not open
// a merged pair. D / 32 columns a lane.
template <int D>
__device__ inline void raw_key_grad_row(const AttnShape& s, const uint8_t* self_open, int b, int i, int g, int lane,
                                        const bf16_t* q, const bf16_t* raw_k, const bf16_t* raw_v, const float* lse,
                                        const float* Dterm, const bf16_t* dout, bf16_t* draw_k, bf16_t* draw_v) {
  static_assert(D % 32 == 0, "a lane takes D / 32 columns");
  const size_t q_ld = size_t(s.H) * D, kv_ld = size_t(s.Hkv) * D;
  const size_t row = (size_t(b) * s.Tq + i) * kv_ld + size_t(g) * D;
  const bool self = self_open && self_open[size_t(b) * s.Tq + i];
  const float scale = rsqrtf(float(D));
  float ak[D / 32], av[D / 32];
#pragma unroll
  for (int e = 0; e < D / 32; ++e) ak[e] = av[e] = 0.f;
  for (int h = g; self && h < s.H; h += s.Hkv) {
    const size_t qrow = (size_t(b) * s.Tq + i) * q_ld + size_t(h) * D;
    const size_t at = (size_t(b) * s.H + h) * s.Tq + i;
    float sq = 0.f, sd = 0.f;
#pragma unroll
    for (int e = 0; e < D / 32; ++e) {
      const int c = lane + 32 * e;
      sq += ld(q + qrow + c) * ld(raw_k + row + c);
      sd += ld(dout + qrow + c) * ld(raw_v + row + c);
    }
    const float pj = __expf(warp_sum(sq) * scale - lse[at]);
    const float ds = pj * (warp_sum(sd) - Dterm[at]) * scale;
#pragma unroll
    for (int e = 0; e < D / 32; ++e) {
      const int c = lane + 32 * e;
      ak[e] += ds * ld(q + qrow + c);
      av[e] += pj * ld(dout + qrow + c);
    }
  }
#pragma unroll
  for (int e = 0; e < D / 32; ++e) {
    const int c = lane + 32 * e;
    draw_k[row + c] = __float2bfloat16(ak[e]);
    draw_v[row + c] = __float2bfloat16(av[e]);
  }
}

}  // namespace wiola::cuda
