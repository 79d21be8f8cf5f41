// What the two bf16 self-attention implementations share (attention_tc.cu:
// WMMA tiles in shared memory; attention_fa2_{fwd,bwd}.cu: the FlashAttention-2 form in
// registers): the visible key range of a position (a prefix, or with documents
// the rows of the position's document), whether the device grants a block's
// shared memory, and the raw self-key gradients of one query row.
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

// Documents (AttnKeys::doc_start, docs/model.md §2 "Documents"): the query at
// index i (position p) sees the key rows [doc_first_key(ds), visible_prefix(p))
// with ds = doc_start[b, i], the rows whose key_end lies in [ds, p]: ATM's
// groups never cross a document start, so that is a contiguous range. The
// kernels skip the rows before it (a block starts its key loop at its first
// row's document, doc_start being non-decreasing along a sequence) and mask
// element by element inside a partially visible tile, as for the causal edge.

// The first key row of [0, nk) with key_end >= e (plain causal: row e).
__device__ inline int first_key_from(const int32_t* key_end, int b, int Tk, int nk, int e) {
  if (!key_end) return min(nk, max(e, 0));
  const int32_t* k = key_end + size_t(b) * Tk;
  int lo = 0, hi = nk;  // first row with key_end >= e
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (k[mid] < e) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The document start of query i of sequence b: 0 without documents (every key
// row then ends at or after it).
__device__ inline int doc_start_of(const int32_t* doc_start, int b, int Tq, int i) {
  return doc_start ? doc_start[size_t(b) * Tq + i] : 0;
}

// The first key row a query whose document starts at position ds sees (0
// without documents).
__device__ inline int doc_first_key(const AttnKeys& keys, int b, int Tk, int nk, int ds) {
  return keys.doc_start ? first_key_from(keys.key_end, b, Tk, nk, ds) : 0;
}

// The end of the queries that can see a key row ending at position e: the
// first query index i with doc_start[b, i] > e (doc_start is non-decreasing
// along a sequence), Tq without documents or where there is none. The queries
// seeing the row are [e - q_pos0, doc_query_end) (and only those).
__device__ inline int doc_query_end(const int32_t* doc_start, int b, int Tq, int e) {
  if (!doc_start) return Tq;
  const int32_t* d = doc_start + size_t(b) * Tq;
  int lo = 0, hi = Tq;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (d[mid] <= e) lo = mid + 1;
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
