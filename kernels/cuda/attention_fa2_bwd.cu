// Self-attention backward in the FlashAttention-2 form, for bf16 activations
// at head dims 32, 64, 96, 128 (backend option attention_bwd = fa2; v1 stays
// the default until measured on a GPU); the forward and the tile helpers the
// two share: attention_fa2_fwd.cu, attention_fa2.cuh.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_fa2.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/ptx.cuh"
#include "util/error.h"

namespace wiola::cuda {
namespace {

// ---- backward (attention_bwd = fa2; not yet measured on a GPU) ---------------------------
// Deterministic without atomics, as attention_tc.cu's: one kernel owns key
// tiles, another query tiles; both recompute P = exp(S * scale - lse) from the
// forward's lse and take D = rowsum(dO * O) from attention.cu's row kernel.
// The products run on mma.m16n8k16 fragments as the forward's do:
// - dK/dV: one block per (64 key rows, KV group g, sequence b), a warp per 16
//   key rows (128 key rows, eight warps, at attention_bwd_tile 128xN). Over
//   the group's heads in order and, per head, the query tiles of 64 rows
//   from the first that sees the block's first key row, with Q, dO tiles (and
//   their lse, D) double-buffered by cp.async: S^T = K Q^T (K as A fragments,
//   Q by ldmatrix), P^T = exp(S^T * scale - lse) where visible, straight into
//   bf16 A fragments; dV += P^T dO (dO by ldmatrix .trans); dP^T = V dO^T;
//   dS^T = P^T (dP^T - D) in place of P^T's fragments; dK += dS^T Q (Q by
//   ldmatrix .trans). dK, dV stay in fp32 fragments to the end, dK * scale.
//   At d_h <= 64 the warp's K and V rows are held as A fragments; above, they
//   are reloaded from shared memory by ldmatrix at every tile (registers).
// - dQ: one block per (64 query rows, head h, sequence b), a warp per 16
//   query rows (128, eight warps, at attention_bwd_tile Nx128), key tiles of
//   64 rows up to the prefix the last row sees, K and V double-buffered:
//   S = Q K^T, P, dP = dO V^T, dS = P (dP - D), dQ += dS K (K by
//   ldmatrix .trans); then a row that opens a merged pair adds its raw key's
//   share (quad reductions, as the forward). Q and dO held as A fragments at
//   d_h <= 64, reloaded above.
// - draw_k, draw_v: a warp per (row, group), the group's heads in order, the
//   computation of attention_tc.cu's dQ kernel.
// - Documents (doc_start, attention_common.cuh): a dK/dV block's query tiles
//   stop at the last query that sees its last key row (the first query of a
//   later document ends them: doc_query_end), a dQ block's key tiles start at
//   the tile of the first key row its first query's document sees; inside,
//   each element is masked by its query's document as by the causal edge
//   (the query tiles' document starts ride with their lse and D).
// lse enters in base 2 (times log2 e); a row with no visible key (lse = -inf)
// or past Tq gets lse = +inf there, so its P is 0 without a mask.
// Tile shapes (backend option attention_bwd_tile, c.attn_bwd_tile: key rows a
// dK/dV block x query rows a dQ block; docs/gpu.md "The fa2 backward's tile
// shapes"): each kernel is a template on its block's rows, KM or QM, 64 (four
// warps, the default, the kernels as they were) or 128 (eight warps of 16
// rows, so a warp's fragments and registers are those of the 64-row kernel);
// the tiles a block loops over (Q and dO for dK/dV, K and V for dQ) stay 64
// rows. A warp of a 128-row block meets the same tiles as in a 64-row block
// plus some wholly invisible to its rows (P = 0: nothing added), so every
// shape gives the default's bits (tested).

constexpr bool fa_bwd_hold(int D) { return D <= 64; }

// Shared memory of the dK/dV kernel with KM key rows a block: K, V tiles
// [KM][D + 8], Q[2], dO[2] tiles [64][D + 8] (bf16), lse[2][64], D[2][64]
// (fp32), the query rows' document starts [2][64] and the key rows' ends [KM].
constexpr size_t fa2_dkv_smem_bytes(int D, int KM = kFaRows) {
  return size_t((2 * KM + 4 * kFaRows) * fa_ld(D)) * 2 + size_t(6 * kFaRows + KM) * 4;
}
// Of the dQ kernel with QM query rows a block: Q, dO tiles [QM][D + 8], K[2],
// V[2] tiles [64][D + 8], the key tiles' ends [2][64] and the query rows'
// document starts [QM].
constexpr size_t fa2_dq_smem_bytes(int D, int QM = kFaRows) {
  return size_t((2 * QM + 4 * kFaRows) * fa_ld(D)) * 2 + size_t(2 * kFaRows + QM) * 4;
}
// Blocks per SM a backward kernel's registers are held to (__launch_bounds__)
// with `rows` rows a block: 64 (128 threads) two, as before; 128 (256
// threads) one, 255 registers.
constexpr int fa2_bwd_min_blocks(int rows) { return rows == 64 ? 2 : 1; }

// The warp's A fragment of rows [r0, r0 + 16), columns [16kk, 16kk + 16) of a
// shared tile.
template <int D>
__device__ __forceinline__ void fa_load_a(uint32_t (&a)[4], const bf16_t* tile, int r0, int kk) {
  const int lane = threadIdx.x & 31;
  ptx::ldmatrix_x4(a, tile + (r0 + (lane & 8) + (lane & 7)) * fa_ld(D) + kk * 16 + (lane >> 4) * 8);
}
// B fragments of column tiles n, n + 1 at k step kk, B = T^T for a shared
// tile T whose rows are B's columns (non-transposed ldmatrix).
template <int D>
__device__ __forceinline__ void fa_load_b_rows(uint32_t (&b0)[2], uint32_t (&b1)[2], const bf16_t* tile, int n,
                                               int kk) {
  const int lane = threadIdx.x & 31;
  uint32_t f[4];
  ptx::ldmatrix_x4(f, tile + (8 * n + (lane >> 4) * 8 + (lane & 7)) * fa_ld(D) + kk * 16 + (lane & 8));
  b0[0] = f[0], b0[1] = f[1], b1[0] = f[2], b1[1] = f[3];
}
// B fragments of column tiles n, n + 1 at k step kk, B = T for a shared tile
// T whose rows are B's rows (ldmatrix .trans).
template <int D>
__device__ __forceinline__ void fa_load_b_cols(uint32_t (&b0)[2], uint32_t (&b1)[2], const bf16_t* tile, int n,
                                               int kk) {
  const int lane = threadIdx.x & 31;
  uint32_t f[4];
  ptx::ldmatrix_x4_trans(f, tile + (16 * kk + (lane & 8) + (lane & 7)) * fa_ld(D) + 8 * n + (lane >> 4) * 8);
  b0[0] = f[0], b0[1] = f[1], b1[0] = f[2], b1[1] = f[3];
}

// A row's lse in base 2 for the backward: +inf for a row past Tq or with no
// visible key (P = 0 there).
__device__ __forceinline__ float fa_lse2(const float* lse, size_t at, bool valid) {
  const float l = valid ? lse[at] : -INFINITY;
  return l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
}

// The warp's 16 x D fp32 fragments (times mul) as bf16 rows [j, j + 16) of
// dst (rows ld apart; rows at or past `last` skipped, at or past `zero_from`
// written as 0), through the warp's own rows `stage` of a shared tile.
template <int D>
__device__ __forceinline__ void fa_store_rows(const float (&acc)[D / 8][4], float mul, bf16_t* stage, bf16_t* dst,
                                              size_t ld, int j, int last, int zero_from) {
  constexpr int LD = fa_ld(D), NO = D / 8;
  const int lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m = j + gr + 8 * r < zero_from ? mul : 0.f;
#pragma unroll
    for (int n = 0; n < NO; ++n)
      *reinterpret_cast<uint32_t*>(stage + (gr + 8 * r) * LD + 8 * n + 2 * tq) =
          ptx::pack_bf16(acc[n][2 * r] * m, acc[n][2 * r + 1] * m);
  }
  __syncwarp();
#pragma unroll
  for (int idx = lane; idx < 16 * NO; idx += 32) {
    const int r = idx / NO, c = (idx % NO) * 8;
    if (j + r < last)
      *reinterpret_cast<uint4*>(dst + size_t(j + r) * ld + c) = *reinterpret_cast<const uint4*>(stage + r * LD + c);
  }
  __syncwarp();
}

// The (head, query tile) pairs of a dK/dV block, in order: heads g, g + Hkv,
// ... and per head query tiles qt0, qt0 + 1, ...
struct FaDkvIter {
  int g, Hkv, qt0, n_qt;
  __device__ int head(int it) const { return g + (it / n_qt) * Hkv; }
  __device__ int row0(int it) const { return (qt0 + it % n_qt) * kFaRows; }
};

// Copies of item `it`'s Q and dO tiles into buffer Qs, dOs (cp.async) and its
// rows' lse (base 2), D and document starts into ls, Ds, dss (plain stores;
// a row past Tq takes the last row's document start, 0 without documents).
template <int D, int NT = kFaThreads>
__device__ __forceinline__ void fa_dkv_issue(const AttnShape& s, const int32_t* doc_start, int b, const FaDkvIter& iter,
                                             int it, const bf16_t* q, const bf16_t* dout, const float* lse,
                                             const float* Dterm, bf16_t* Qs, bf16_t* dOs, float* ls, float* Ds,
                                             int* dss) {
  const int h = iter.head(it), i0 = iter.row0(it);
  const size_t q_ld = size_t(s.H) * D, off = size_t(b) * s.Tq * q_ld + size_t(h) * D;
  fa_copy_tile<D, kFaRows, NT>(Qs, q + off, q_ld, i0, s.Tq);
  fa_copy_tile<D, kFaRows, NT>(dOs, dout + off, q_ld, i0, s.Tq);
  for (int c = threadIdx.x; c < kFaRows; c += blockDim.x) {
    const int i = i0 + c;
    const size_t at = (size_t(b) * s.H + h) * s.Tq + i;
    ls[c] = fa_lse2(lse, at, i < s.Tq);
    Ds[c] = i < s.Tq ? Dterm[at] : 0.f;
    dss[c] = doc_start_of(doc_start, b, s.Tq, min(i, s.Tq - 1));
  }
}

// KM key rows a block (a warp per 16); query tiles of 64 rows.
// long-function: one tile loop whose fragments (S, P, O or
// dK/dV, m, l) live in registers from the first tile to the last; cut into
// functions, they would pass through arrays the compiler may put in local
// memory, and the PTX (registers, spills: ptxas_budget.json) and bits are
// pinned to this form (docs/gpu.md). Its steps are marked by comments.
template <int D, int KM>
__global__ void __launch_bounds__(2 * KM, fa2_bwd_min_blocks(KM))
    k_attention_bwd_dkv_fa2(AttnShape s, AttnKeys keys, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                            const float* lse, const float* Dterm, const bf16_t* dout, bf16_t* dk, bf16_t* dv) {
  // KD: 16-wide k steps over d_h; ND: 8-wide column tiles of dK, dV; NQ: of
  // S^T (queries); KQ: 16-wide k steps over queries.
  constexpr int LD = fa_ld(D), KD = D / 16, ND = D / 8, NQ = kFaRows / 8, KQ = kFaRows / 16, NT = 2 * KM;
  static_assert(KM == 64 || KM == 128, "the key rows of attention_bwd_tile");
  constexpr bool kHold = fa_bwd_hold(D);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem);                     // [KM][LD]
  bf16_t* Vs = Ks + KM * LD;                                        // [KM][LD]
  bf16_t* Qs = Vs + KM * LD;                                        // [2][64][LD]
  bf16_t* dOs = Qs + 2 * kFaRows * LD;                              // [2][64][LD]
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * kFaRows * LD);  // [2][64]
  float* D_s = lse_s + 2 * kFaRows;                                 // [2][64]
  int* ds_s = reinterpret_cast<int*>(D_s + 2 * kFaRows);            // [2][64]
  int* kend = ds_s + 2 * kFaRows;                                   // [KM]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
  const int j0 = blockIdx.x * KM, g = blockIdx.y, b = blockIdx.z;
  const size_t kv_ld = size_t(s.Hkv) * D, kv_off = size_t(b) * s.Tk * kv_ld + size_t(g) * D;
  const int nk = keys.n_keys ? keys.n_keys[b] : s.Tk;
  // The first query that sees the block's first key row (rows sorted by
  // key_end), and the end of those that see its last (documents: the first
  // query of a later document; Tq without).
  const int j_last = min(j0 + KM, nk) - 1;
  const int first = j0 < nk ? max(0, (keys.key_end ? keys.key_end[size_t(b) * s.Tk + j0] : j0) - s.q_pos0) : s.Tq;
  const int q_end =
      j0 < nk ? doc_query_end(keys.doc_start, b, s.Tq, keys.key_end ? keys.key_end[size_t(b) * s.Tk + j_last] : j_last)
              : s.Tq;
  FaDkvIter iter;
  iter.g = g, iter.Hkv = s.Hkv, iter.qt0 = first / kFaRows;
  iter.n_qt = max(0, (q_end + kFaRows - 1) / kFaRows - iter.qt0);
  const int n_it = iter.n_qt > 0 ? iter.n_qt * ((s.H - g + s.Hkv - 1) / s.Hkv) : 0;

  fa_copy_tile<D, KM, NT>(Ks, k + kv_off, kv_ld, j0, nk);
  fa_copy_tile<D, KM, NT>(Vs, v + kv_off, kv_ld, j0, nk);
  fa_key_ends<KM>(kend, keys, b, s.Tk, j0, nk);
  if (n_it > 0) fa_dkv_issue<D, NT>(s, keys.doc_start, b, iter, 0, q, dout, lse, Dterm, Qs, dOs, lse_s, D_s, ds_s);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncthreads();

  const int kr0 = warp * 16;  // the warp's key rows in the tile
  uint32_t kf[kHold ? KD : 1][4], vf[kHold ? KD : 1][4];
  if constexpr (kHold) {
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      fa_load_a<D>(kf[kk], Ks, kr0, kk);
      fa_load_a<D>(vf[kk], Vs, kr0, kk);
    }
  }
  const int ke[2] = {kend[kr0 + gr], kend[kr0 + gr + 8]};
  const float scale = rsqrtf(float(D)), scale_log2 = scale * 1.4426950408889634f;
  float acc_dk[ND][4], acc_dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[n][e] = acc_dv[n][e] = 0.f;

  for (int it = 0; it < n_it; ++it) {
    const int cur = it & 1;
    if (it + 1 < n_it) {  // the next item's copies fly while this one is computed
      const int nxt = cur ^ 1;
      fa_dkv_issue<D, NT>(s, keys.doc_start, b, iter, it + 1, q, dout, lse, Dterm, Qs + nxt * kFaRows * LD,
                          dOs + nxt * kFaRows * LD, lse_s + nxt * kFaRows, D_s + nxt * kFaRows, ds_s + nxt * kFaRows);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t* Qt = Qs + cur * kFaRows * LD;
    const bf16_t* dOt = dOs + cur * kFaRows * LD;
    const float* ls = lse_s + cur * kFaRows;
    const float* Ds = D_s + cur * kFaRows;
    const int* dq_start = ds_s + cur * kFaRows;  // the tile's queries' document starts
    const int p0 = s.q_pos0 + iter.row0(it);     // the tile's first query position

    // S^T = K Q^T: the warp's 16 key rows against the tile's 64 queries.
    float acc_s[NQ][4];
#pragma unroll
    for (int n = 0; n < NQ; ++n) acc_s[n][0] = acc_s[n][1] = acc_s[n][2] = acc_s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t a[4];
      if constexpr (kHold) {
        a[0] = kf[kk][0], a[1] = kf[kk][1], a[2] = kf[kk][2], a[3] = kf[kk][3];
      } else {
        fa_load_a<D>(a, Ks, kr0, kk);
      }
#pragma unroll
      for (int n = 0; n < NQ; n += 2) {
        uint32_t b0[2], b1[2];
        fa_load_b_rows<D>(b0, b1, Qt, n, kk);
        ptx::mma_bf16_16816(acc_s[n], a, b0, acc_s[n]);
        ptx::mma_bf16_16816(acc_s[n + 1], a, b1, acc_s[n + 1]);
      }
    }
    // P^T = exp(S^T * scale - lse) as bf16 A fragments (C tiles 2kk, 2kk + 1
    // are k step kk's A fragment); masked only where some key row of the
    // block is not visible to the tile's first query, or ends before the
    // document of the tile's last query.
    const bool mask = kend[KM - 1] > p0 || kend[0] < dq_start[kFaRows - 1];
    uint32_t pf[KQ][4];
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * kk + half;
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * n + 2 * tq + (e & 1);
          p[e] = exp2f(fmaf(acc_s[n][e], scale_log2, -ls[c]));
          if (mask && (ke[e >> 1] > p0 + c || ke[e >> 1] < dq_start[c])) p[e] = 0.f;
        }
        pf[kk][2 * half] = ptx::pack_bf16(p[0], p[1]);
        pf[kk][2 * half + 1] = ptx::pack_bf16(p[2], p[3]);
      }
      // dV += P^T dO.
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk)
#pragma unroll
      for (int n = 0; n < ND; n += 2) {
        uint32_t b0[2], b1[2];
        fa_load_b_cols<D>(b0, b1, dOt, n, kk);
        ptx::mma_bf16_16816(acc_dv[n], pf[kk], b0, acc_dv[n]);
        ptx::mma_bf16_16816(acc_dv[n + 1], pf[kk], b1, acc_dv[n + 1]);
      }
      // dP^T = V dO^T (into acc_s).
#pragma unroll
    for (int n = 0; n < NQ; ++n) acc_s[n][0] = acc_s[n][1] = acc_s[n][2] = acc_s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t a[4];
      if constexpr (kHold) {
        a[0] = vf[kk][0], a[1] = vf[kk][1], a[2] = vf[kk][2], a[3] = vf[kk][3];
      } else {
        fa_load_a<D>(a, Vs, kr0, kk);
      }
#pragma unroll
      for (int n = 0; n < NQ; n += 2) {
        uint32_t b0[2], b1[2];
        fa_load_b_rows<D>(b0, b1, dOt, n, kk);
        ptx::mma_bf16_16816(acc_s[n], a, b0, acc_s[n]);
        ptx::mma_bf16_16816(acc_s[n + 1], a, b1, acc_s[n + 1]);
      }
    }
    // dS^T = P^T (dP^T - D), in place of P^T's fragments.
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * kk + half, c = 8 * n + 2 * tq;
        const float d0 = Ds[c], d1 = Ds[c + 1];
        const uint32_t r0 = pf[kk][2 * half], r1 = pf[kk][2 * half + 1];
        pf[kk][2 * half] = ptx::pack_bf16(bf16_lo(r0) * (acc_s[n][0] - d0), bf16_hi(r0) * (acc_s[n][1] - d1));
        pf[kk][2 * half + 1] = ptx::pack_bf16(bf16_lo(r1) * (acc_s[n][2] - d0), bf16_hi(r1) * (acc_s[n][3] - d1));
      }
      // dK += dS^T Q (the scale at the end).
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk)
#pragma unroll
      for (int n = 0; n < ND; n += 2) {
        uint32_t b0[2], b1[2];
        fa_load_b_cols<D>(b0, b1, Qt, n, kk);
        ptx::mma_bf16_16816(acc_dk[n], pf[kk], b0, acc_dk[n]);
        ptx::mma_bf16_16816(acc_dk[n + 1], pf[kk], b1, acc_dk[n + 1]);
      }
    __syncthreads();  // the item after next overwrites this one's buffers
  }
  ptx::cp_async_wait<0>();

  // Out through the warp's own K and V rows (only this warp reads them).
  fa_store_rows<D>(acc_dk, scale, Ks + kr0 * LD, dk + kv_off, kv_ld, j0 + kr0, s.Tk, nk);
  fa_store_rows<D>(acc_dv, 1.f, Vs + kr0 * LD, dv + kv_off, kv_ld, j0 + kr0, s.Tk, nk);
}

// QM query rows a block (a warp per 16); key tiles of 64 rows.
// long-function: one tile loop whose fragments (S, P, O or
// dK/dV, m, l) live in registers from the first tile to the last; cut into
// functions, they would pass through arrays the compiler may put in local
// memory, and the PTX (registers, spills: ptxas_budget.json) and bits are
// pinned to this form (docs/gpu.md). Its steps are marked by comments.
template <int D, int QM, bool kDocs>
__global__ void __launch_bounds__(2 * QM, fa2_bwd_min_blocks(QM))
    k_attention_bwd_dq_fa2(AttnShape s, AttnKeys keys, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                           const bf16_t* raw_k, const bf16_t* raw_v, const float* lse, const float* Dterm,
                           const bf16_t* dout, bf16_t* dq) {
  // KD: 16-wide k steps over d_h; ND: 8-wide column tiles of dQ; NS: of S;
  // KS: 16-wide k steps over keys.
  constexpr int LD = fa_ld(D), KD = D / 16, ND = D / 8, NS = kFaRows / 8, KS = kFaRows / 16, NT = 2 * QM;
  static_assert(QM == 64 || QM == 128, "the query rows of attention_bwd_tile");
  constexpr bool kHold = fa_bwd_hold(D);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem);               // [QM][LD]
  bf16_t* dOs = Qs + QM * LD;                                 // [QM][LD]
  bf16_t* Ks = dOs + QM * LD;                                 // [2][64][LD]
  bf16_t* Vs = Ks + 2 * kFaRows * LD;                         // [2][64][LD]
  int* kend = reinterpret_cast<int*>(Vs + 2 * kFaRows * LD);  // [2][64]
  int* dss = kend + 2 * kFaRows;                              // [QM]: the rows' document starts

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
  const int i0 = (gridDim.x - 1 - blockIdx.x) * QM, h = blockIdx.y, b = blockIdx.z, g = h % s.Hkv;
  const size_t q_ld = size_t(s.H) * D, kv_ld = size_t(s.Hkv) * D;
  const size_t q_off = size_t(b) * s.Tq * q_ld + size_t(h) * D, kv_off = size_t(b) * s.Tk * kv_ld + size_t(g) * D;
  const int nk = keys.n_keys ? keys.n_keys[b] : s.Tk;
  const int i_last = min(i0 + QM, s.Tq) - 1;
  const int kmax = visible_prefix(keys.key_end, b, s.Tk, nk, s.q_pos0 + i_last);
  // Documents (kDocs): the first key tile the block's rows see (0 without);
  // the rows' document starts are staged in shared memory for the mask (a
  // row past Tq takes the last row's).
  const int j_base =
      kDocs ? doc_first_key(keys, b, s.Tk, nk, keys.doc_start[size_t(b) * s.Tq + i0]) / kFaRows * kFaRows : 0;
  const int n_tiles = (kmax - j_base + kFaRows - 1) / kFaRows;
  if constexpr (kDocs)
    for (int r = threadIdx.x; r < QM; r += NT) dss[r] = keys.doc_start[size_t(b) * s.Tq + min(i0 + r, i_last)];

  // Copies: Q and dO (group 1), then K and V tile 0 (group 2).
  fa_copy_tile<D, QM, NT>(Qs, q + q_off, q_ld, i0, s.Tq);
  fa_copy_tile<D, QM, NT>(dOs, dout + q_off, q_ld, i0, s.Tq);
  ptx::cp_async_commit();
  if (n_tiles > 0) {
    fa_copy_tile<D, kFaRows, NT>(Ks, k + kv_off, kv_ld, j_base, kmax);
    fa_copy_tile<D, kFaRows, NT>(Vs, v + kv_off, kv_ld, j_base, kmax);
    fa_key_ends(kend, keys, b, s.Tk, j_base, kmax);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<1>();
  __syncthreads();

  const int qr0 = warp * 16;  // the warp's query rows in the tile
  uint32_t qf[kHold ? KD : 1][4], df[kHold ? KD : 1][4];
  if constexpr (kHold) {
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      fa_load_a<D>(qf[kk], Qs, qr0, kk);
      fa_load_a<D>(df[kk], dOs, qr0, kk);
    }
  }
  const int row0 = i0 + qr0 + gr;
  const int pos[2] = {s.q_pos0 + row0, s.q_pos0 + row0 + 8};
  float lse2[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + 8 * r;
    const size_t at = (size_t(b) * s.H + h) * s.Tq + i;
    lse2[r] = fa_lse2(lse, at, i < s.Tq);
    Dr[r] = i < s.Tq ? Dterm[at] : 0.f;
  }
  const float scale = rsqrtf(float(D)), scale_log2 = scale * 1.4426950408889634f;
  float acc_dq[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) acc_dq[n][0] = acc_dq[n][1] = acc_dq[n][2] = acc_dq[n][3] = 0.f;

  for (int t = 0; t < n_tiles; ++t) {
    const int cur = t & 1;
    if (t + 1 < n_tiles) {
      const int nxt = cur ^ 1;
      const int j1 = j_base + (t + 1) * kFaRows;
      fa_copy_tile<D, kFaRows, NT>(Ks + nxt * kFaRows * LD, k + kv_off, kv_ld, j1, kmax);
      fa_copy_tile<D, kFaRows, NT>(Vs + nxt * kFaRows * LD, v + kv_off, kv_ld, j1, kmax);
      fa_key_ends(kend + nxt * kFaRows, keys, b, s.Tk, j1, kmax);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t* Kt = Ks + cur * kFaRows * LD;
    const bf16_t* Vt = Vs + cur * kFaRows * LD;
    const int* ke = kend + cur * kFaRows;

    // S = Q K^T.
    float acc_s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) acc_s[n][0] = acc_s[n][1] = acc_s[n][2] = acc_s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t a[4];
      if constexpr (kHold) {
        a[0] = qf[kk][0], a[1] = qf[kk][1], a[2] = qf[kk][2], a[3] = qf[kk][3];
      } else {
        fa_load_a<D>(a, Qs, qr0, kk);
      }
#pragma unroll
      for (int n = 0; n < NS; n += 2) {
        uint32_t b0[2], b1[2];
        fa_load_b_rows<D>(b0, b1, Kt, n, kk);
        ptx::mma_bf16_16816(acc_s[n], a, b0, acc_s[n]);
        ptx::mma_bf16_16816(acc_s[n + 1], a, b1, acc_s[n + 1]);
      }
    }
    // P = exp(S * scale - lse) where visible, as bf16 A fragments (masked
    // where a key is past the block's first query or before its last query's
    // document).
    const bool mask = ke[kFaRows - 1] > s.q_pos0 + i0 || (kDocs && ke[0] < dss[QM - 1]);
    const int ds[2] = {kDocs ? dss[qr0 + gr] : 0, kDocs ? dss[qr0 + gr + 8] : 0};
    uint32_t pf[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * kk + half;
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = exp2f(fmaf(acc_s[n][e], scale_log2, -lse2[e >> 1]));
          const int kc = ke[8 * n + 2 * tq + (e & 1)];
          if (mask && (kc > pos[e >> 1] || (kDocs && kc < ds[e >> 1]))) p[e] = 0.f;
        }
        pf[kk][2 * half] = ptx::pack_bf16(p[0], p[1]);
        pf[kk][2 * half + 1] = ptx::pack_bf16(p[2], p[3]);
      }
      // dP = dO V^T (into acc_s).
#pragma unroll
    for (int n = 0; n < NS; ++n) acc_s[n][0] = acc_s[n][1] = acc_s[n][2] = acc_s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t a[4];
      if constexpr (kHold) {
        a[0] = df[kk][0], a[1] = df[kk][1], a[2] = df[kk][2], a[3] = df[kk][3];
      } else {
        fa_load_a<D>(a, dOs, qr0, kk);
      }
#pragma unroll
      for (int n = 0; n < NS; n += 2) {
        uint32_t b0[2], b1[2];
        fa_load_b_rows<D>(b0, b1, Vt, n, kk);
        ptx::mma_bf16_16816(acc_s[n], a, b0, acc_s[n]);
        ptx::mma_bf16_16816(acc_s[n + 1], a, b1, acc_s[n + 1]);
      }
    }
    // dS = P (dP - D), in place of P's fragments.
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * kk + half;
        const uint32_t r0 = pf[kk][2 * half], r1 = pf[kk][2 * half + 1];
        pf[kk][2 * half] = ptx::pack_bf16(bf16_lo(r0) * (acc_s[n][0] - Dr[0]), bf16_hi(r0) * (acc_s[n][1] - Dr[0]));
        pf[kk][2 * half + 1] = ptx::pack_bf16(bf16_lo(r1) * (acc_s[n][2] - Dr[1]), bf16_hi(r1) * (acc_s[n][3] - Dr[1]));
      }
      // dQ += dS K (the scale at the end).
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int n = 0; n < ND; n += 2) {
        uint32_t b0[2], b1[2];
        fa_load_b_cols<D>(b0, b1, Kt, n, kk);
        ptx::mma_bf16_16816(acc_dq[n], pf[kk], b0, acc_dq[n]);
        ptx::mma_bf16_16816(acc_dq[n + 1], pf[kk], b1, acc_dq[n + 1]);
      }
    __syncthreads();  // the tile after next overwrites this one's buffers
  }
  ptx::cp_async_wait<0>();  // (no tiles: the empty group)

  // The raw self key of a row that opens a merged pair: P_j = exp(q . raw_k *
  // scale - lse), dS_j = P_j (dO . raw_v - D), dQ += dS_j raw_k. The lane
  // holds columns 8n + 2tq (+1) of its rows; Q and dO from the warp's rows.
  if (keys.self_open) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + 8 * r;
      const bool open = i < s.Tq && keys.self_open[size_t(b) * s.Tq + i];
      const size_t row = (size_t(b) * s.Tq + (open ? i : 0)) * kv_ld + size_t(g) * D;
      const bf16_t* qr = Qs + (qr0 + gr + 8 * r) * LD;
      const bf16_t* dr = dOs + (qr0 + gr + 8 * r) * LD;
      float sq = 0.f, sd = 0.f;
      if (open) {
#pragma unroll
        for (int n = 0; n < ND; ++n) {
          const int c = 8 * n + 2 * tq;
          const uint32_t rk = ld_u32(raw_k + row + c), rv = ld_u32(raw_v + row + c);
          const uint32_t qv = ld_u32(qr + c), dv = ld_u32(dr + c);
          sq += bf16_lo(qv) * bf16_lo(rk) + bf16_hi(qv) * bf16_hi(rk);
          sd += bf16_lo(dv) * bf16_lo(rv) + bf16_hi(dv) * bf16_hi(rv);
        }
      }
      sq += __shfl_xor_sync(0xffffffffu, sq, 1);
      sq += __shfl_xor_sync(0xffffffffu, sq, 2);
      sd += __shfl_xor_sync(0xffffffffu, sd, 1);
      sd += __shfl_xor_sync(0xffffffffu, sd, 2);
      if (open) {
        const float ds = exp2f(fmaf(sq, scale_log2, -lse2[r])) * (sd - Dr[r]);
#pragma unroll
        for (int n = 0; n < ND; ++n) {
          const uint32_t rk = ld_u32(raw_k + row + 8 * n + 2 * tq);
          acc_dq[n][2 * r] += ds * bf16_lo(rk);
          acc_dq[n][2 * r + 1] += ds * bf16_hi(rk);
        }
      }
    }
  }
  __syncwarp();  // the warp's Q rows are read above and restaged below
  fa_store_rows<D>(acc_dq, scale, Qs + qr0 * LD, dq + q_off, q_ld, i0 + qr0, s.Tq, s.Tq);
}

// draw_k, draw_v of row i of group g in sequence b, a warp each: the group's
// heads in order (attention_tc.cu's dQ kernel computes them the same way);
// zero where the row does not open a merged pair.
template <int D>
__global__ void __launch_bounds__(kFaThreads)
    k_attention_bwd_draw_fa2(AttnShape s, AttnKeys keys, const bf16_t* q, const bf16_t* raw_k, const bf16_t* raw_v,
                             const float* lse, const float* Dterm, const bf16_t* dout, bf16_t* draw_k, bf16_t* draw_v) {
  const int lane = threadIdx.x & 31;
  const size_t w = size_t(blockIdx.x) * kFaWarps + (threadIdx.x >> 5);
  if (w >= size_t(s.B) * s.Tq * s.Hkv) return;  // the whole warp
  const int g = int(w % s.Hkv), i = int(w / s.Hkv % s.Tq), b = int(w / (size_t(s.Hkv) * s.Tq));
  raw_key_grad_row<D>(s, keys.self_open, b, i, g, lane, q, raw_k, raw_v, lse, Dterm, dout, draw_k, draw_v);
}

// The backward with KM key rows a dK/dV block and QM query rows a dQ block.
template <int D, int KM, int QM>
void launch_fa2_bwd(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                    CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  const size_t smem_kv = fa2_dkv_smem_bytes(D, KM), smem_q = fa2_dq_smem_bytes(D, QM);
  static const bool attr_set = [&] {
    const char* what = "attention_bwd (fa2): shared memory size";
    check(
        cudaFuncSetAttribute(k_attention_bwd_dkv_fa2<D, KM>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_kv)),
        what);
    for (auto dq_kernel : {k_attention_bwd_dq_fa2<D, QM, false>, k_attention_bwd_dq_fa2<D, QM, true>})
      check(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_q)), what);
    return true;
  }();
  (void)attr_set;
  if (s.Tk > 0) {
    const dim3 grid(unsigned((s.Tk + KM - 1) / KM), unsigned(s.Hkv), unsigned(s.B));
    k_attention_bwd_dkv_fa2<D, KM><<<grid, 2 * KM, smem_kv, c.s>>>(s, keys, dev<bf16_t>(q), dev<bf16_t>(k),
                                                                   dev<bf16_t>(v), dev<float>(lse), Dterm,
                                                                   dev<bf16_t>(dout), dev<bf16_t>(dk), dev<bf16_t>(dv));
  }
  if (s.Tq > 0) {
    const dim3 grid(unsigned((s.Tq + QM - 1) / QM), unsigned(s.H), unsigned(s.B));
    // With document starts or without: a kernel each (the one without keeps
    // its registers, ptxas_budget.json).
    auto dq_kernel = keys.doc_start ? k_attention_bwd_dq_fa2<D, QM, true> : k_attention_bwd_dq_fa2<D, QM, false>;
    dq_kernel<<<grid, 2 * QM, smem_q, c.s>>>(s, keys, dev<bf16_t>(q), dev<bf16_t>(k), dev<bf16_t>(v),
                                             dev<bf16_t>(raw_k), dev<bf16_t>(raw_v), dev<float>(lse), Dterm,
                                             dev<bf16_t>(dout), dev<bf16_t>(dq));
    if (draw_k) {
      const size_t rows = size_t(s.B) * s.Tq * s.Hkv;
      k_attention_bwd_draw_fa2<D><<<unsigned((rows + kFaWarps - 1) / kFaWarps), kFaThreads, 0, c.s>>>(
          s, keys, dev<bf16_t>(q), dev<bf16_t>(raw_k), dev<bf16_t>(raw_v), dev<float>(lse), Dterm, dev<bf16_t>(dout),
          dev<bf16_t>(draw_k), dev<bf16_t>(draw_v));
    }
  }
}

// The backward at tile shape KM x QM for the head dims it takes; false for another.
template <int KM, int QM>
bool fa2_bwd_dh(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  switch (s.dh) {
    case 32:
      launch_fa2_bwd<32, KM, QM>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
      return true;
    case 64:
      launch_fa2_bwd<64, KM, QM>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
      return true;
    case 96:
      launch_fa2_bwd<96, KM, QM>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
      return true;
    case 128:
      launch_fa2_bwd<128, KM, QM>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
      return true;
    default: return false;
  }
}

}  // namespace

bool attention_bwd_fa2(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                       CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  if (q.dtype() != DType::BF16 || k.dtype() != DType::BF16 || v.dtype() != DType::BF16 || dout.dtype() != DType::BF16 ||
      dq.dtype() != DType::BF16 || dk.dtype() != DType::BF16 || dv.dtype() != DType::BF16)
    return false;
  // The tile shape (c.attn_bwd_tile): key rows a dK/dV block x query rows a dQ block.
  const AttentionTile tile = c.attn_bwd_tile;
  const int KM = tile == AttentionTile::T128x64 || tile == AttentionTile::T128x128 ? 128 : 64;
  const int QM = tile == AttentionTile::T64x128 || tile == AttentionTile::T128x128 ? 128 : 64;
  if (s.dh % 32 != 0 || s.dh > 128 || !attention_smem_fits(fa2_dkv_smem_bytes(s.dh, KM)) ||
      !attention_smem_fits(fa2_dq_smem_bytes(s.dh, QM)))
    return false;
  // cp.async and the 16-byte stores need 16-byte aligned rows; the raw rows
  // are read in pairs.
  if (!aligned(dev<bf16_t>(q), 16) || !aligned(dev<bf16_t>(k), 16) || !aligned(dev<bf16_t>(v), 16) ||
      !aligned(dev<bf16_t>(dout), 16) || !aligned(dev<bf16_t>(dq), 16) || !aligned(dev<bf16_t>(dk), 16) ||
      !aligned(dev<bf16_t>(dv), 16) || !aligned(dev<bf16_t>(raw_k), 4) || !aligned(dev<bf16_t>(raw_v), 4))
    return false;
  if (s.B <= 0 || s.H <= 0 || (s.Tq <= 0 && s.Tk <= 0)) return true;  // nothing to do
  switch (tile) {
    case AttentionTile::T64x128:
      return fa2_bwd_dh<64, 128>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
    case AttentionTile::T128x64:
      return fa2_bwd_dh<128, 64>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
    case AttentionTile::T128x128:
      return fa2_bwd_dh<128, 128>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
    default: return fa2_bwd_dh<64, 64>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
  }
}

}  // namespace wiola::cuda
