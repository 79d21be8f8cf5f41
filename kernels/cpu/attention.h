// CPU causal self-attention with GQA and ATM key layouts (docs/model.md §2 "GCLA",
// "ATM"); semantics in kernels/ops.h (Ops::attention_fwd / attention_bwd).
//
// Blocked, with the products in BLAS: a block is kAttnBlockQ query positions
// of every head that shares one KV group (g(h) = h mod H_kv), stacked into
// one matrix so that the group's keys are read once and the GEMMs are tall.
// Visible keys of a query are a prefix of the (key_end-sorted) key rows, so a
// block computes its scores against the prefix its last row sees, [R x kmax]
// (R = heads per group x block rows), with one GEMM; the softmax masks each
// row to its own prefix; P V is a second GEMM. The backward pass recomputes
// P from the saved log-sum-exp (no [B,H,Tq,Tk] buffer is ever kept) and
// accumulates dK, dV with BLAS (beta = 1).
//
// Why BLAS and not hand-written tiles: the products are >95 % of attention's
// work, and OpenBLAS already picks its kernel for the CPU at run time (AVX2,
// AVX-512, ...), so the fast path does not depend on how this file was
// compiled. Row softmax loops are the dispatched SIMD primitives (simd.h).
//
// Threads (OpenMP; each BLAS call single-threaded inside them): forward over
// (b, group, query block); backward over (b, group), the thread looping over
// the group's query blocks in order, so every dk/dv/draw_k/draw_v row has
// exactly one writer and a fixed summation order. Results are deterministic
// and independent of the thread count.
#pragma once

#include "kernels/ops.h"

namespace wiola::cpu {

// Query positions per block (per head of the group): the forward pass uses
// kAttnBlockQ; the backward pass kAttnBlockQ below kAttnLongKeys keys and
// kAttnBlockQLong from there (its dK, dV products sum over the block's rows,
// which pays for the longer blocks' extra masked scores; measured, docs/cpu.md).
inline constexpr int kAttnBlockQ = 32;
inline constexpr int kAttnBlockQLong = 128;
inline constexpr int kAttnLongKeys = 1024;

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
