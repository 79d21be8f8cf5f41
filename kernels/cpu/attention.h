// CPU causal self-attention with GQA and ATM key layouts (docs/model.md §2 "GCLA",
// "ATM"); semantics in kernels/ops.h (Ops::attention_fwd / attention_bwd).
//
// Flash-attention style: query tiles x key tiles with an online softmax in the
// forward pass and P recomputed from lse in the backward pass, so scratch per
// thread is O(tile^2 + tile*dh) and no [B,H,Tq,Tk] buffer exists. Visible keys
// of a query are a prefix of the (key_end-sorted) key rows, so only that prefix
// is visited.
//
// Threads (OpenMP): forward over (b, h, query tile); backward over (b, kv group
// g), each thread looping over the heads h with h % Hkv == g, so every dk/dv/
// draw_k/draw_v/dq row has exactly one writer. Results are deterministic (and
// independent of the thread count). Tile products are plain loops the compiler
// vectorises (no BLAS calls inside the parallel region).
#pragma once

#include "kernels/ops.h"

namespace wiola::cpu {

// Tile sizes (queries x keys).
inline constexpr int kAttnTileQ = 64;
inline constexpr int kAttnTileK = 64;

template <class T>
void attention_fwd(const AttnShape& s, const AttnKeys& keys, const T* q,
                   const T* k, const T* v, const T* raw_k, const T* raw_v,
                   T* o, T* lse);

template <class T>
void attention_bwd(const AttnShape& s, const AttnKeys& keys, const T* q,
                   const T* k, const T* v, const T* raw_k, const T* raw_v,
                   const T* o, const T* lse, const T* dout, T* dq, T* dk,
                   T* dv, T* draw_k, T* draw_v);

}  // namespace wiola::cpu
