// Self-attention on tensor cores, forward and backward, for bf16 activations
// (the training default): flash-style tiles, the same visibility rule and
// outputs as the row kernels of attention.cu, which fp32 mode and head dims
// outside {32, 64, 96, 128} keep using. The backend option attention = rows
// (train.cuda_attention, kernels/backend_options.h; c.attn_fwd) selects the
// row kernels in bf16 too (docs/gpu.md); fa2 the forward of attention_fa2_fwd.cu
// (FlashAttention-2 form), attention_bwd = fa2 its backward (attention_fa2_bwd.cu).
//
// Forward: one block per (64 query rows, head h, sequence b); four warps, 16
// query rows each. Per tile of 64 key rows (up to the prefix the block's last
// query sees): S = Q K^T by warp-level bf16 MMA (fp32 accumulate) into shared
// memory; each warp updates its rows' running max m and sum l (two lanes per
// row), writes P = exp(S - m) as bf16 and rescales its O rows; then O += P V
// by MMA with O held in shared memory in fp32. The next key tile's loads are
// in flight meanwhile (TileRegs). A query whose position opens a merged pair
// adds its own raw key/value after the tiles, as the row kernel does.
// Documents (doc_start): a block's key tiles start at the tile of the first
// row its first query's document sees (attention_common.cuh) instead of at
// row 0, and each element is masked by its row's document as by the causal
// edge.
// Backward: below. No atomics anywhere: each output row has one writer.
#include <mma.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "util/error.h"

namespace wiola::cuda {
namespace {

constexpr int kTileQ = 64, kTileK = 64, kWarps = 4;

// Row strides of the forward's shared tiles, padded by 8 elements: the
// softmax has two lanes per row reading 16-byte pieces, and unpadded rows
// (256 bytes apart) would put every row on the same banks.
constexpr int kLdS = kTileK + 8;             // S (fp32) and P (bf16)
constexpr int ld_o(int D) { return D + 8; }  // O (fp32)

// Shared memory of one block, in bytes (every part a multiple of 32 bytes,
// as wmma wants its tile pointers).
constexpr size_t tc_smem_bytes(int D) {
  return size_t(3 * kTileQ * D) * 2      // Q, K, V tiles (bf16)
         + size_t(kTileQ * kLdS) * 2     // P (bf16)
         + size_t(kTileQ * kLdS) * 4     // S (fp32)
         + size_t(kTileQ * ld_o(D)) * 4  // O (fp32)
         + size_t(2 * kTileQ) * 4        // m, l
         + size_t(kTileK) * 4            // the key tile's visibility ends
         + size_t(kTileQ) * 4;           // the query rows' document starts
}

// The visibility ends of key rows [j0, j0 + 64) into kend[64]: key j is
// visible to position p iff kend[j - j0] <= p. Rows at or past jmax get
// INT_MAX (never visible). One global read per key per tile instead of one
// per (query, key) pair.
__device__ void load_key_ends(int* kend, const AttnKeys& keys, int b, int Tk, int j0, int jmax) {
  for (int c = threadIdx.x; c < 64; c += blockDim.x) {
    const int j = j0 + c;
    kend[c] = j >= jmax ? INT_MAX : keys.key_end ? keys.key_end[size_t(b) * Tk + j] : j;
  }
}

// Rows [r0, r0 + 64) of the D-wide block at src + row0_off of a row-major
// bf16 matrix (rows ld apart) as a [64][D] tile; rows at or past `valid` are
// zero. Moved in two steps: issue() starts the global loads into registers
// (16-byte vectors, 8 bf16, when the block is 16-byte aligned), commit()
// stores them to shared memory. The forward issues the next key tile's loads
// before computing on the current one, so their latency hides behind it.
template <int D>
struct TileRegs {
  static constexpr int kVec = 8, kRowVecs = D / kVec, kPer = 64 * kRowVecs / (32 * kWarps);
  static_assert(64 * kRowVecs % (32 * kWarps) == 0, "a tile is a whole number of vectors per thread");
  uint4 v[kPer];
  const bf16_t* base = nullptr;
  size_t ld = 0;
  int r0 = 0, valid = 0;
  bool vec = false;  // v holds the tile; else commit() reads it element by element

  __device__ void issue(const bf16_t* src, size_t row0_off, size_t ld_, int r0_, int valid_) {
    base = src + row0_off, ld = ld_, r0 = r0_, valid = valid_;
    vec = blockDim.x == 32 * kWarps && ld % kVec == 0 && (reinterpret_cast<uintptr_t>(base) & 15) == 0;
    if (!vec) return;
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int idx = threadIdx.x + t * 32 * kWarps, r = idx / kRowVecs, c = (idx % kRowVecs) * kVec;
      v[t] = r0 + r < valid ? *reinterpret_cast<const uint4*>(base + size_t(r0 + r) * ld + c) : uint4{0, 0, 0, 0};
    }
  }
  __device__ void commit(bf16_t* dst) const {
    if (vec) {
#pragma unroll
      for (int t = 0; t < kPer; ++t) *reinterpret_cast<uint4*>(dst + (threadIdx.x + t * 32 * kWarps) * kVec) = v[t];
      return;
    }
    const bf16_t zero = __float2bfloat16(0.f);
    for (int idx = threadIdx.x; idx < 64 * D; idx += blockDim.x) {
      const int r = idx / D, c = idx % D;
      dst[idx] = r0 + r < valid ? base[size_t(r0 + r) * ld + c] : zero;
    }
  }
};

template <int D>
__device__ void load_tile(bf16_t* dst, const bf16_t* src, size_t row0_off, size_t ld, int r0, int valid) {
  TileRegs<D> t;
  t.issue(src, row0_off, ld, r0, valid);
  t.commit(dst);
}

// C[16 rows of warp w][n] (+)= A[16 x K] B[K x n] for the warp's rows, with
// A row-major (lda) or column-major (A^T stored row-major), B row-major or
// column-major (B^T stored row-major); C fp32 in shared memory (ldc).
template <class ALayout, class BLayout, int K, int N>
__device__ void warp_mma(float* C, int ldc, const bf16_t* A, int lda, const bf16_t* B, int ldb, bool accumulate) {
  using namespace nvcuda;
  const bool a_row = std::is_same_v<ALayout, wmma::row_major>, b_row = std::is_same_v<BLayout, wmma::row_major>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, ALayout> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, BLayout> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  for (int n = 0; n < N / 16; ++n) {
    if (accumulate) wmma::load_matrix_sync(fc, C + n * 16, ldc, wmma::mem_row_major);
    else wmma::fill_fragment(fc, 0.f);
    for (int kk = 0; kk < K / 16; ++kk) {
      // A: rows 0..15, columns kk*16..; B: rows kk*16.., columns n*16..
      wmma::load_matrix_sync(fa, a_row ? A + kk * 16 : A + size_t(kk) * 16 * lda, lda);
      wmma::load_matrix_sync(fb, b_row ? B + size_t(kk) * 16 * ldb + n * 16 : B + size_t(n) * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(fc, fa, fb, fc);
    }
    wmma::store_matrix_sync(C + n * 16, fc, ldc, wmma::mem_row_major);
  }
}

// The accumulators of a warp's 16 x D output rows, held in registers across a
// loop of tiles (backward v2, below).
using AccFrag = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// acc[n] += A[16 x K] B[K x (16 n .. 16 n + 15)] for the warp, A and B
// row-major bf16 in shared memory; A's fragments are loaded once for all n.
template <int K, int NF>
__device__ void warp_mma_regs(AccFrag (&acc)[NF], const bf16_t* A, int lda, const bf16_t* B, int ldb) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major> fa[K / 16];
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major> fb;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) wmma::load_matrix_sync(fa[kk], A + kk * 16, lda);
#pragma unroll
  for (int n = 0; n < NF; ++n)
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
      wmma::load_matrix_sync(fb, B + size_t(kk) * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa[kk], fb, acc[n]);
    }
}

template <int NF>
__device__ void zero_acc(AccFrag (&acc)[NF]) {
#pragma unroll
  for (int n = 0; n < NF; ++n) nvcuda::wmma::fill_fragment(acc[n], 0.f);
}

// One warp's online-softmax update after S = Q K^T of a key tile: two lanes
// per row (lane 2r' and 2r'+1 of the warp's rows), each taking every other
// 16-byte piece of the row, so a row costs one shuffle per reduction instead
// of five, and all 16 rows go at once. Writes P = exp(S - m) as bf16,
// rescales the row of O and updates the row's m and l. kDocs: masked by the
// rows' document starts too (dss, shared memory).
template <int D, bool kDocs>
__device__ void warp_online_softmax(const float* Ss, bf16_t* Ps, float* Os, float* ms, float* ls, const int* kend,
                                    int i0, int Tq, int q_pos0, const int* dss, float scale) {
  constexpr int kPieces = kTileK / 4 / 2;  // float4 pieces of S per lane
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = lane & 1;
  const int r = warp * 16 + (lane >> 1), i = i0 + r, p = q_pos0 + i;
  // Documents: key c is visible iff ds <= kend[c] <= p, one unsigned compare.
  const int ds = kDocs ? dss[r] : 0;
  const unsigned span = unsigned(p - ds);
  const float* srow = Ss + r * kLdS;
  float sv[4 * kPieces], mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    const int c0 = (2 * k + half) * 4;
    const float4 f = *reinterpret_cast<const float4*>(srow + c0);
    const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool vis = i < Tq && (kDocs ? unsigned(kend[c0 + u] - ds) <= span : kend[c0 + u] <= p);
      sv[4 * k + u] = vis ? e[u] * scale : -INFINITY;
      mx = fmaxf(mx, sv[4 * k + u]);
    }
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  const float m_old = ms[r], m_new = fmaxf(m_old, mx);
  float sum = 0.f;
  bf16_t* prow = Ps + r * kLdS;
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    const int c0 = (2 * k + half) * 4;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float v = sv[4 * k + u];
      const float pj = v == -INFINITY ? 0.f : __expf(v - m_new);
      prow[c0 + u] = __float2bfloat16(pj);
      sum += pj;
    }
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
  float* orow = Os + r * ld_o(D);
#pragma unroll
  for (int k = 0; k < D / 8; ++k) {
    float4* o4 = reinterpret_cast<float4*>(orow + (2 * k + half) * 4);
    float4 f = *o4;
    f.x *= alpha, f.y *= alpha, f.z *= alpha, f.w *= alpha;
    *o4 = f;
  }
  __syncwarp();  // both lanes of the row have read m before it changes
  if (half == 0) {
    ms[r] = m_new;
    ls[r] = ls[r] * alpha + sum;
  }
  __syncwarp();
}

// kDocs: with document starts (keys.doc_start; a variant of its own, so the
// kernel without them keeps its registers: ptxas_budget.json).
template <int D, bool kDocs>
__global__ void __launch_bounds__(32 * kWarps)
    k_attention_fwd_tc(AttnShape s, AttnKeys keys, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                       const bf16_t* raw_k, const bf16_t* raw_v, bf16_t* o, float* lse) {
  using namespace nvcuda;
  constexpr int kLdO = ld_o(D);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem);              // [kTileQ][D]
  bf16_t* Ks = Qs + kTileQ * D;                              // [kTileK][D]
  bf16_t* Vs = Ks + kTileK * D;                              // [kTileK][D]
  bf16_t* Ps = Vs + kTileK * D;                              // [kTileQ][kLdS]
  float* Ss = reinterpret_cast<float*>(Ps + kTileQ * kLdS);  // [kTileQ][kLdS]
  float* Os = Ss + kTileQ * kLdS;                            // [kTileQ][kLdO]
  float* ms = Os + kTileQ * kLdO;                            // [kTileQ]
  float* ls = ms + kTileQ;                                   // [kTileQ]
  int* kend = reinterpret_cast<int*>(ls + kTileQ);           // [kTileK]
  int* dss = kend + kTileK;                                  // [kTileQ]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int i0 = blockIdx.x * kTileQ, h = blockIdx.y, b = blockIdx.z, g = h % s.Hkv;
  const size_t q_ld = size_t(s.H) * D, kv_ld = size_t(s.Hkv) * D, kv_off = size_t(b) * s.Tk * kv_ld + size_t(g) * D;
  const float scale = rsqrtf(float(D));
  load_tile<D>(Qs, q, size_t(b) * s.Tq * q_ld + size_t(h) * D, q_ld, i0, s.Tq);
  for (int idx = tid; idx < kTileQ * kLdO; idx += blockDim.x) Os[idx] = 0.f;
  if (tid < kTileQ) {
    ms[tid] = -INFINITY;
    ls[tid] = 0.f;
  }
  const int nk = keys.n_keys ? keys.n_keys[b] : s.Tk;
  const int i_last = min(i0 + kTileQ, s.Tq) - 1;
  const int kmax = visible_prefix(keys.key_end, b, s.Tk, nk, s.q_pos0 + i_last);
  // Documents: from the tile of the first key row the block's first query sees.
  // The rows' document starts, staged for the mask (0 without documents).
  const int j_start =
      kDocs ? doc_first_key(keys, b, s.Tk, nk, keys.doc_start[size_t(b) * s.Tq + i0]) / kTileK * kTileK : 0;
  if (kDocs && tid < kTileQ) dss[tid] = keys.doc_start[size_t(b) * s.Tq + min(i0 + tid, s.Tq - 1)];
  TileRegs<D> kr, vr;
  if (kmax > j_start) {
    kr.issue(k, kv_off, kv_ld, j_start, kmax);
    vr.issue(v, kv_off, kv_ld, j_start, kmax);
  }

  for (int j0 = j_start; j0 < kmax; j0 += kTileK) {
    kr.commit(Ks);
    vr.commit(Vs);
    load_key_ends(kend, keys, b, s.Tk, j0, kmax);
    __syncthreads();
    if (j0 + kTileK < kmax) {  // the next tile's loads fly while this one is computed
      kr.issue(k, kv_off, kv_ld, j0 + kTileK, kmax);
      vr.issue(v, kv_off, kv_ld, j0 + kTileK, kmax);
    }

    // S[16 rows of this warp][kTileK] = Q K^T.
    warp_mma<wmma::row_major, wmma::col_major, D, kTileK>(Ss + warp * 16 * kLdS, kLdS, Qs + warp * 16 * D, D, Ks, D,
                                                          false);
    __syncwarp();
    warp_online_softmax<D, kDocs>(Ss, Ps, Os, ms, ls, kend, i0, s.Tq, s.q_pos0, dss, scale);

    // O[16 rows][D] += P V.
    warp_mma<wmma::row_major, wmma::row_major, kTileK, D>(Os + warp * 16 * kLdO, kLdO, Ps + warp * 16 * kLdS, kLdS, Vs,
                                                          D, true);
    __syncthreads();  // the next tile overwrites K and V
  }

  // The raw self key/value of a query that opens a merged pair.
  if (keys.self_open) {
    for (int rr = 0; rr < 16; ++rr) {
      const int r = warp * 16 + rr, i = i0 + r;
      if (i >= s.Tq || !keys.self_open[size_t(b) * s.Tq + i]) continue;
      const size_t row = (size_t(b) * s.Tq + i) * kv_ld + size_t(g) * D;
      float part = 0.f;
      for (int c = lane; c < D; c += 32) part += __bfloat162float(Qs[r * D + c]) * ld(raw_k + row + c);
      const float sc = warp_sum(part) * scale;
      const float m_old = ms[r], m_new = fmaxf(m_old, sc);
      const float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new), pj = __expf(sc - m_new);
      for (int c = lane; c < D; c += 32) Os[r * kLdO + c] = Os[r * kLdO + c] * alpha + pj * ld(raw_v + row + c);
      __syncwarp();
      if (lane == 0) {
        ms[r] = m_new;
        ls[r] = ls[r] * alpha + pj;
      }
      __syncwarp();
    }
  }
  __syncthreads();

  for (int idx = tid; idx < kTileQ * D; idx += blockDim.x) {
    const int r = idx / D, c = idx % D, i = i0 + r;
    if (i >= s.Tq) continue;
    const float l = ls[r];
    o[(size_t(b) * s.Tq + i) * q_ld + size_t(h) * D + c] = __float2bfloat16(l > 0.f ? Os[r * kLdO + c] / l : 0.f);
  }
  if (tid < kTileQ && i0 + tid < s.Tq) {
    const float l = ls[tid];
    lse[(size_t(b) * s.H + h) * s.Tq + i0 + tid] = l > 0.f ? ms[tid] + logf(l) : -INFINITY;
  }
}

// ---- backward -------------------------------------------------------------------------
// Deterministic without atomics, FA2-style: one kernel owns key tiles (dK, dV
// summed over the group's heads and the queries that see them), another owns
// query tiles of a KV group (dQ of each head, and the raw self-key gradients
// summed over the heads). Both recompute P = exp(S - lse) from the forward's
// log-sum-exp and use D = rowsum(dO * O) (attention.cu's row kernel).

// Shared memory of a backward kernel: four [64][D] bf16 tiles (K, V, Q, dO
// in some order), P and dS (bf16), S or dP (fp32), n_acc [64][D] fp32
// accumulators (dK and dV, or dQ), the rows' lse and D, the key tile's ends
// and the query rows' document starts.
constexpr size_t tc_bwd_smem_bytes(int D, int n_acc) {
  return size_t(4 * 64 * D) * 2 + size_t(2 * 64 * 64) * 2 + size_t(64 * 64) * 4 + size_t(n_acc * 64 * D) * 4 +
         size_t(2 * 64) * 4 + size_t(64) * 4 + size_t(64) * 4;
}
struct BwdSmem {
  bf16_t* tile[4];
  bf16_t *Ps, *dSs;
  float *Ss, *acc[2], *lse_s, *D_s;
  int* kend;  // the key tile's visibility ends (load_key_ends)
  int* ds_s;  // the query rows' document starts (load_query_rows)
};
template <int D>
__device__ BwdSmem carve_bwd_smem(unsigned char* smem, int n_acc) {
  BwdSmem m;
  bf16_t* h = reinterpret_cast<bf16_t*>(smem);
  for (int t = 0; t < 4; ++t) m.tile[t] = h + t * 64 * D;
  m.Ps = h + 4 * 64 * D;
  m.dSs = m.Ps + 64 * 64;
  float* f = reinterpret_cast<float*>(m.dSs + 64 * 64);
  m.Ss = f;
  f += 64 * 64;
  for (int a = 0; a < 2; ++a) m.acc[a] = a < n_acc ? f + a * 64 * D : nullptr;
  m.lse_s = f + n_acc * 64 * D;
  m.D_s = m.lse_s + 64;
  m.kend = reinterpret_cast<int*>(m.D_s + 64);
  m.ds_s = m.kend + 64;
  return m;
}

// The warp's 16 query rows of a (query tile, key tile) pair, tiles [64][D]
// in shared memory: S = Q K^T into Ss; P = exp(S*scale - lse) where visible
// (kend, load_key_ends; ds_s: the rows' document starts, load_query_rows)
// into Ps as bf16; dP = dO V^T into Ss; dS = P (dP - D) * scale into dSs as
// bf16.
template <int D, bool kDocs>
__device__ void warp_probs_dscores(const bf16_t* Qs, const bf16_t* dOs, const bf16_t* Ks, const bf16_t* Vs,
                                   const float* lse_s, const float* D_s, const int* kend, const int* ds_s, float* Ss,
                                   bf16_t* Ps, bf16_t* dSs, const AttnShape& s, int i0, float scale) {
  using namespace nvcuda;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* S = Ss + warp * 16 * 64;
  warp_mma<wmma::row_major, wmma::col_major, D, 64>(S, 64, Qs + warp * 16 * D, D, Ks, D, false);
  __syncwarp();
  for (int rr = 0; rr < 16; ++rr) {
    const int r = warp * 16 + rr, i = i0 + r, p = s.q_pos0 + i;
    const int ds = kDocs ? ds_s[r] : 0;  // documents: ds <= kend[c] <= p, one unsigned compare
    for (int c = lane; c < 64; c += 32) {
      const bool vis = i < s.Tq && (kDocs ? unsigned(kend[c] - ds) <= unsigned(p - ds) : kend[c] <= p);
      Ps[r * 64 + c] = __float2bfloat16(vis ? __expf(Ss[r * 64 + c] * scale - lse_s[r]) : 0.f);
    }
  }
  __syncwarp();
  warp_mma<wmma::row_major, wmma::col_major, D, 64>(S, 64, dOs + warp * 16 * D, D, Vs, D, false);
  __syncwarp();
  for (int rr = 0; rr < 16; ++rr) {
    const int r = warp * 16 + rr;
    for (int c = lane; c < 64; c += 32) {
      const float pj = __bfloat162float(Ps[r * 64 + c]);
      dSs[r * 64 + c] = __float2bfloat16(pj * (Ss[r * 64 + c] - D_s[r]) * scale);
    }
  }
}

// Query rows [i0, i0 + 64) of head h in sequence b as both backward kernels
// read them: the Q and dO tiles, and each row's lse, D (0 past Tq) and
// document start (0 without documents).
// (Issuing the next rows' loads before computing, as the forward does, made
// the backward 3 % slower on an H100: docs/gpu.md.)
template <int D, bool kDocs>
__device__ void load_query_rows(const AttnShape& s, int b, int h, int i0, const bf16_t* q, const bf16_t* dout,
                                const float* lse, const float* Dterm, const int32_t* doc_start, bf16_t* Qs, bf16_t* dOs,
                                float* lse_s, float* D_s, int* ds_s) {
  const size_t q_ld = size_t(s.H) * D, q_off = size_t(b) * s.Tq * q_ld + size_t(h) * D;
  load_tile<D>(Qs, q, q_off, q_ld, i0, s.Tq);
  load_tile<D>(dOs, dout, q_off, q_ld, i0, s.Tq);
  if (threadIdx.x < 64) {
    const int i = i0 + threadIdx.x;
    const size_t at = (size_t(b) * s.H + h) * s.Tq + i;
    lse_s[threadIdx.x] = i < s.Tq ? lse[at] : 0.f;
    D_s[threadIdx.x] = i < s.Tq ? Dterm[at] : 0.f;
    if constexpr (kDocs) ds_s[threadIdx.x] = i < s.Tq ? doc_start[size_t(b) * s.Tq + i] : 0;
  }
}

// The key block of a dK/dV kernel: rows [j0, j0 + 64) of group g in sequence
// b (from the block index), its K and V tiles and visibility ends loaded into
// shared memory, the first query that sees any of its rows (rows sorted by
// key_end) and the end of the queries that see any (with documents, the last
// row's document ends them; doc_query_end). The caller syncs before reading
// them.
struct KeyBlock {
  int j0, g, b, nk, i_start, i_end;
  size_t kv_ld, kv_off;
};
template <int D, bool kDocs>
__device__ KeyBlock load_key_block(const AttnShape& s, const AttnKeys& keys, const bf16_t* k, const bf16_t* v,
                                   bf16_t* Ks, bf16_t* Vs, int* kend) {
  KeyBlock kb;
  kb.j0 = blockIdx.x * 64, kb.g = blockIdx.y, kb.b = blockIdx.z;
  kb.kv_ld = size_t(s.Hkv) * D;
  kb.nk = keys.n_keys ? keys.n_keys[kb.b] : s.Tk;
  kb.kv_off = size_t(kb.b) * s.Tk * kb.kv_ld + size_t(kb.g) * D;
  load_tile<D>(Ks, k, kb.kv_off, kb.kv_ld, kb.j0, kb.nk);
  load_tile<D>(Vs, v, kb.kv_off, kb.kv_ld, kb.j0, kb.nk);
  load_key_ends(kend, keys, kb.b, s.Tk, kb.j0, kb.nk);
  kb.i_start =
      kb.j0 < kb.nk ? max(0, (keys.key_end ? keys.key_end[size_t(kb.b) * s.Tk + kb.j0] : kb.j0) - s.q_pos0) : s.Tq;
  const int j_last = min(kb.j0 + 64, kb.nk) - 1;
  kb.i_end = !kDocs || j_last < kb.j0
                 ? s.Tq
                 : doc_query_end(keys.doc_start, kb.b, s.Tq,
                                 keys.key_end ? keys.key_end[size_t(kb.b) * s.Tk + j_last] : j_last);
  return kb;
}

// dK, dV of key rows [j0, j0 + 64) of group g in sequence b (kDocs: with
// document starts, as the forward).
template <int D, bool kDocs>
__global__ void __launch_bounds__(32 * kWarps)
    k_attention_bwd_dkv_tc(AttnShape s, AttnKeys keys, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                           const float* lse, const float* Dterm, const bf16_t* dout, bf16_t* dk, bf16_t* dv) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdSmem m = carve_bwd_smem<D>(smem, 2);
  bf16_t *Ks = m.tile[0], *Vs = m.tile[1], *Qs = m.tile[2], *dOs = m.tile[3], *Ps = m.Ps, *dSs = m.dSs;
  float *Ss = m.Ss, *dKs = m.acc[0], *dVs = m.acc[1], *lse_s = m.lse_s, *D_s = m.D_s;

  const int tid = threadIdx.x, warp = tid >> 5;
  const float scale = rsqrtf(float(D));
  const KeyBlock kb = load_key_block<D, kDocs>(s, keys, k, v, Ks, Vs, m.kend);
  const int j0 = kb.j0, g = kb.g, b = kb.b, nk = kb.nk;
  const size_t kv_ld = kb.kv_ld, kv_off = kb.kv_off;
  for (int idx = tid; idx < 64 * D; idx += blockDim.x) dKs[idx] = dVs[idx] = 0.f;
  __syncthreads();

  for (int h = g; h < s.H; h += s.Hkv) {
    for (int i0 = (kb.i_start / 64) * 64; i0 < kb.i_end; i0 += 64) {
      load_query_rows<D, kDocs>(s, b, h, i0, q, dout, lse, Dterm, keys.doc_start, Qs, dOs, lse_s, D_s, m.ds_s);
      __syncthreads();
      warp_probs_dscores<D, kDocs>(Qs, dOs, Ks, Vs, lse_s, D_s, m.kend, m.ds_s, Ss, Ps, dSs, s, i0, scale);
      __syncthreads();
      // Per warp, its 16 key rows: dV += P^T dO, dK += dS^T Q.
      warp_mma<wmma::col_major, wmma::row_major, 64, D>(dVs + warp * 16 * D, D, Ps + warp * 16, 64, dOs, D, true);
      warp_mma<wmma::col_major, wmma::row_major, 64, D>(dKs + warp * 16 * D, D, dSs + warp * 16, 64, Qs, D, true);
      __syncthreads();
    }
  }
  for (int idx = tid; idx < 64 * D; idx += blockDim.x) {
    const int r = idx / D, c = idx % D, j = j0 + r;
    if (j >= s.Tk) continue;
    const size_t at = kv_off + size_t(j) * kv_ld + c;
    dk[at] = __float2bfloat16(j < nk ? dKs[idx] : 0.f);
    dv[at] = __float2bfloat16(j < nk ? dVs[idx] : 0.f);
  }
}

// dQ of query rows [i0, i0 + 64) for every head of group g, then the raw
// self-key gradients of those rows (summed over the group's heads). kRegAcc
// (backward v2): each warp's dQ rows stay in registers over the key tiles and
// go to shared memory once per head, instead of at every tile.
template <int D, bool kRegAcc, bool kDocs>
__global__ void __launch_bounds__(32 * kWarps)
    k_attention_bwd_dq_tc(AttnShape s, AttnKeys keys, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                          const bf16_t* raw_k, const bf16_t* raw_v, const float* lse, const float* Dterm,
                          const bf16_t* dout, bf16_t* dq, bf16_t* draw_k, bf16_t* draw_v) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdSmem m = carve_bwd_smem<D>(smem, 1);
  bf16_t *Qs = m.tile[0], *dOs = m.tile[1], *Ks = m.tile[2], *Vs = m.tile[3], *Ps = m.Ps, *dSs = m.dSs;
  float *Ss = m.Ss, *dQs = m.acc[0], *lse_s = m.lse_s, *D_s = m.D_s;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int i0 = blockIdx.x * 64, g = blockIdx.y, b = blockIdx.z;
  const size_t q_ld = size_t(s.H) * D, kv_ld = size_t(s.Hkv) * D;
  const float scale = rsqrtf(float(D));
  const int nk = keys.n_keys ? keys.n_keys[b] : s.Tk;
  const int kmax = visible_prefix(keys.key_end, b, s.Tk, nk, s.q_pos0 + min(i0 + 64, s.Tq) - 1);
  const size_t kv_off = size_t(b) * s.Tk * kv_ld + size_t(g) * D;

  for (int h = g; h < s.H; h += s.Hkv) {
    const size_t q_off = size_t(b) * s.Tq * q_ld + size_t(h) * D;
    load_query_rows<D, kDocs>(s, b, h, i0, q, dout, lse, Dterm, keys.doc_start, Qs, dOs, lse_s, D_s, m.ds_s);
    AccFrag acc[kRegAcc ? D / 16 : 1];
    if constexpr (kRegAcc) {
      zero_acc(acc);
    } else {
      (void)acc;
      for (int idx = tid; idx < 64 * D; idx += blockDim.x) dQs[idx] = 0.f;
    }
    __syncthreads();
    // Documents: from the tile of the first key row the block's first query
    // sees (found again for each head, from the staged document starts:
    // held across the heads it costs registers).
    for (int j0 = kDocs ? doc_first_key(keys, b, s.Tk, nk, m.ds_s[0]) / 64 * 64 : 0; j0 < kmax; j0 += 64) {
      __syncthreads();  // the previous tile's K and V are no longer read
      load_tile<D>(Ks, k, kv_off, kv_ld, j0, kmax);
      load_tile<D>(Vs, v, kv_off, kv_ld, j0, kmax);
      load_key_ends(m.kend, keys, b, s.Tk, j0, kmax);
      __syncthreads();
      warp_probs_dscores<D, kDocs>(Qs, dOs, Ks, Vs, lse_s, D_s, m.kend, m.ds_s, Ss, Ps, dSs, s, i0, scale);
      __syncwarp();
      // dQ[16 rows][D] += dS K.
      if constexpr (kRegAcc) {
        warp_mma_regs<64>(acc, dSs + warp * 16 * 64, 64, Ks, D);
      } else {
        warp_mma<wmma::row_major, wmma::row_major, 64, D>(dQs + warp * 16 * D, D, dSs + warp * 16 * 64, 64, Ks, D,
                                                          true);
      }
    }
    if constexpr (kRegAcc) {
      for (int n = 0; n < D / 16; ++n)
        wmma::store_matrix_sync(dQs + warp * 16 * D + n * 16, acc[n], D, wmma::mem_row_major);
    }
    __syncwarp();
    // The raw self key of a row that opens a merged pair: its share of dq.
    if (keys.self_open) {
      for (int rr = 0; rr < 16; ++rr) {
        const int r = warp * 16 + rr, i = i0 + r;
        if (i >= s.Tq || !keys.self_open[size_t(b) * s.Tq + i]) continue;
        const size_t row = (size_t(b) * s.Tq + i) * kv_ld + size_t(g) * D;
        float sq = 0.f, sd = 0.f;
        for (int c = lane; c < D; c += 32) {
          sq += __bfloat162float(Qs[r * D + c]) * ld(raw_k + row + c);
          sd += __bfloat162float(dOs[r * D + c]) * ld(raw_v + row + c);
        }
        const float pj = __expf(warp_sum(sq) * scale - lse_s[r]);
        const float ds = pj * (warp_sum(sd) - D_s[r]) * scale;
        for (int c = lane; c < D; c += 32) dQs[r * D + c] += ds * ld(raw_k + row + c);
      }
    }
    __syncthreads();
    for (int idx = tid; idx < 64 * D; idx += blockDim.x) {
      const int r = idx / D, c = idx % D, i = i0 + r;
      if (i < s.Tq) dq[q_off + size_t(i) * q_ld + c] = __float2bfloat16(dQs[idx]);
    }
    __syncthreads();  // the next head reloads Q, dO and clears dQ
  }
  // draw_k, draw_v: per row, the group's heads in order (from global memory).
  if (draw_k) {
    for (int rr = 0; rr < 16; ++rr) {
      const int r = warp * 16 + rr, i = i0 + r;
      if (i >= s.Tq) continue;
      raw_key_grad_row<D>(s, keys.self_open, b, i, g, lane, q, raw_k, raw_v, lse, Dterm, dout, draw_k, draw_v);
    }
  }
}

// ---- backward v2 (attention_bwd = v2; not yet measured on a GPU) ----------------------
// The dK/dV kernel arranged so that no warp needs another's results: a warp
// owns 16 key rows and computes S^T = K Q^T, P^T, dP^T = V dO^T and dS^T for
// them against the whole 64-row query tile, in shared memory of its own. The
// block then meets only around each query tile's loads (v1: three barriers a
// tile, because a warp's P rows feed every warp's dK, dV), and the dK, dV
// accumulators stay in registers across the tiles (v1 loads and stores them
// in shared memory at every tile). The dQ kernel is v1's with its
// accumulators in registers (kRegAcc). Same outputs as v1 up to the order of
// fp32 sums.

// Shared memory of the v2 dK/dV kernel: K, V, Q, dO tiles [64][D] (bf16); per
// warp S^T or dP^T [16][64] (fp32) and P^T, dS^T [16][64] (bf16); the query
// tile's lse, D and document starts; the key tile's visibility ends.
constexpr size_t tc_bwd2_smem_bytes(int D) {
  return size_t(4 * 64 * D) * 2 + size_t(kWarps * 16 * 64) * 4 + size_t(2 * kWarps * 16 * 64) * 2 + size_t(3 * 64) * 4 +
         size_t(64) * 4;
}

// The warp's 16 key rows (K_w, V_w, their ends kend_w) against the query tile
// [i0, i0 + 64): S^T = K Q^T into S_w; P^T = exp(S^T*scale - lse) where
// visible (ds_s: the query rows' document starts) into P_w (bf16); dP^T = V
// dO^T into S_w; dS^T = P^T (dP^T - D) * scale into dS_w (bf16). Lane c and
// c + 32 take query columns.
template <int D, bool kDocs>
__device__ void warp_keys_dscores(const bf16_t* K_w, const bf16_t* V_w, const int* kend_w, const int* ds_s,
                                  const bf16_t* Qs, const bf16_t* dOs, const float* lse_s, const float* D_s, float* S_w,
                                  bf16_t* P_w, bf16_t* dS_w, const AttnShape& s, int i0, float scale) {
  using namespace nvcuda;
  const int lane = threadIdx.x & 31;
  warp_mma<wmma::row_major, wmma::col_major, D, 64>(S_w, 64, K_w, D, Qs, D, false);
  __syncwarp();
  for (int rr = 0; rr < 16; ++rr)
    for (int c = lane; c < 64; c += 32) {
      const int i = i0 + c;
      const bool vis = i < s.Tq && (kDocs ? unsigned(kend_w[rr] - ds_s[c]) <= unsigned(s.q_pos0 + i - ds_s[c])
                                          : kend_w[rr] <= s.q_pos0 + i);
      P_w[rr * 64 + c] = __float2bfloat16(vis ? __expf(S_w[rr * 64 + c] * scale - lse_s[c]) : 0.f);
    }
  __syncwarp();
  warp_mma<wmma::row_major, wmma::col_major, D, 64>(S_w, 64, V_w, D, dOs, D, false);
  __syncwarp();
  for (int rr = 0; rr < 16; ++rr)
    for (int c = lane; c < 64; c += 32) {
      const float pj = __bfloat162float(P_w[rr * 64 + c]);
      dS_w[rr * 64 + c] = __float2bfloat16(pj * (S_w[rr * 64 + c] - D_s[c]) * scale);
    }
  __syncwarp();
}

// The warp's 16 x D accumulator rows as bf16 rows [j, j + 16) of dst (rows ld
// apart; rows at or past Tk skipped, rows at or past nk written as 0),
// through a 16 x 16 fp32 staging tile of the warp's own.
template <int D>
__device__ void store_acc_rows(const AccFrag (&acc)[D / 16], float* stage, bf16_t* dst, size_t ld, int j, int Tk,
                               int nk) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    nvcuda::wmma::store_matrix_sync(stage, acc[n], 16, nvcuda::wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, c = e % 16;
      if (j + r < Tk) dst[size_t(j + r) * ld + n * 16 + c] = __float2bfloat16(j + r < nk ? stage[e] : 0.f);
    }
    __syncwarp();
  }
}

// dK, dV of key rows [j0, j0 + 64) of group g in sequence b (v2; kDocs:
// with document starts).
template <int D, bool kDocs>
__global__ void __launch_bounds__(32 * kWarps)
    k_attention_bwd_dkv_tc2(AttnShape s, AttnKeys keys, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                            const float* lse, const float* Dterm, const bf16_t* dout, bf16_t* dk, bf16_t* dv) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem);  // [64][D] each
  bf16_t *Vs = Ks + 64 * D, *Qs = Vs + 64 * D, *dOs = Qs + 64 * D;
  float* St = reinterpret_cast<float*>(dOs + 64 * D);             // [warp][16][64]
  bf16_t* Pt = reinterpret_cast<bf16_t*>(St + kWarps * 16 * 64);  // [warp][16][64]
  bf16_t* dSt = Pt + kWarps * 16 * 64;                            // [warp][16][64]
  float* lse_s = reinterpret_cast<float*>(dSt + kWarps * 16 * 64);
  float* D_s = lse_s + 64;
  int* kend = reinterpret_cast<int*>(D_s + 64);
  int* ds_s = kend + 64;

  const int warp = threadIdx.x >> 5;
  const float scale = rsqrtf(float(D));
  const KeyBlock kb = load_key_block<D, kDocs>(s, keys, k, v, Ks, Vs, kend);
  float* S_w = St + warp * 16 * 64;
  bf16_t *P_w = Pt + warp * 16 * 64, *dS_w = dSt + warp * 16 * 64;
  AccFrag acc_dk[D / 16], acc_dv[D / 16];
  zero_acc(acc_dk);
  zero_acc(acc_dv);
  __syncthreads();

  for (int h = kb.g; h < s.H; h += s.Hkv) {
    for (int i0 = (kb.i_start / 64) * 64; i0 < kb.i_end; i0 += 64) {
      load_query_rows<D, kDocs>(s, kb.b, h, i0, q, dout, lse, Dterm, keys.doc_start, Qs, dOs, lse_s, D_s, ds_s);
      __syncthreads();
      warp_keys_dscores<D, kDocs>(Ks + warp * 16 * D, Vs + warp * 16 * D, kend + warp * 16, ds_s, Qs, dOs, lse_s, D_s,
                                  S_w, P_w, dS_w, s, i0, scale);
      // The warp's 16 key rows: dV += P^T dO, dK += dS^T Q.
      warp_mma_regs<64>(acc_dv, P_w, 64, dOs, D);
      warp_mma_regs<64>(acc_dk, dS_w, 64, Qs, D);
      __syncthreads();  // the next tile overwrites Q and dO
    }
  }
  store_acc_rows<D>(acc_dk, S_w, dk + kb.kv_off, kb.kv_ld, kb.j0 + warp * 16, s.Tk, kb.nk);
  store_acc_rows<D>(acc_dv, S_w, dv + kb.kv_off, kb.kv_ld, kb.j0 + warp * 16, s.Tk, kb.nk);
}

template <int D, bool kDocs>
void launch_tc_bwd_v(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                     CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  const size_t smem_kv = tc_bwd_smem_bytes(D, 2), smem_q = tc_bwd_smem_bytes(D, 1), smem_kv2 = tc_bwd2_smem_bytes(D);
  static const bool attr_set = [&] {
    const char* what = "attention_bwd (tensor cores): shared memory size";
    const auto max_smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
    check(cudaFuncSetAttribute(k_attention_bwd_dkv_tc<D, kDocs>, max_smem, int(smem_kv)), what);
    check(cudaFuncSetAttribute(k_attention_bwd_dq_tc<D, false, kDocs>, max_smem, int(smem_q)), what);
    check(cudaFuncSetAttribute(k_attention_bwd_dkv_tc2<D, kDocs>, max_smem, int(smem_kv2)), what);
    check(cudaFuncSetAttribute(k_attention_bwd_dq_tc<D, true, kDocs>, max_smem, int(smem_q)), what);
    return true;
  }();
  (void)attr_set;
  const bool v2 = c.attn_bwd == AttentionBwd::V2;
  const dim3 grid_kv(unsigned((s.Tk + 63) / 64), unsigned(s.Hkv), unsigned(s.B));
  if (v2)
    k_attention_bwd_dkv_tc2<D, kDocs><<<grid_kv, 32 * kWarps, smem_kv2, c.s>>>(
        s, keys, dev<bf16_t>(q), dev<bf16_t>(k), dev<bf16_t>(v), dev<float>(lse), Dterm, dev<bf16_t>(dout),
        dev<bf16_t>(dk), dev<bf16_t>(dv));
  else
    k_attention_bwd_dkv_tc<D, kDocs><<<grid_kv, 32 * kWarps, smem_kv, c.s>>>(
        s, keys, dev<bf16_t>(q), dev<bf16_t>(k), dev<bf16_t>(v), dev<float>(lse), Dterm, dev<bf16_t>(dout),
        dev<bf16_t>(dk), dev<bf16_t>(dv));
  const dim3 grid_q(unsigned((s.Tq + 63) / 64), unsigned(s.Hkv), unsigned(s.B));
  auto dq_kernel = v2 ? k_attention_bwd_dq_tc<D, true, kDocs> : k_attention_bwd_dq_tc<D, false, kDocs>;
  dq_kernel<<<grid_q, 32 * kWarps, smem_q, c.s>>>(
      s, keys, dev<bf16_t>(q), dev<bf16_t>(k), dev<bf16_t>(v), dev<bf16_t>(raw_k), dev<bf16_t>(raw_v), dev<float>(lse),
      Dterm, dev<bf16_t>(dout), dev<bf16_t>(dq), dev<bf16_t>(draw_k), dev<bf16_t>(draw_v));
}

// The backward's kernels with document starts or without (kDocs).
template <int D>
void launch_tc_bwd(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                   CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  if (keys.doc_start)
    launch_tc_bwd_v<D, true>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
  else launch_tc_bwd_v<D, false>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
}

template <int D, bool kDocs>
void launch_tc_v(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o,
                 Ptr lse) {
  const size_t smem = tc_smem_bytes(D);
  static const bool attr_set = [&] {
    check(cudaFuncSetAttribute(k_attention_fwd_tc<D, kDocs>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "attention_fwd (tensor cores): shared memory size");
    return true;
  }();
  (void)attr_set;
  const dim3 grid(unsigned((s.Tq + kTileQ - 1) / kTileQ), unsigned(s.H), unsigned(s.B));
  k_attention_fwd_tc<D, kDocs><<<grid, 32 * kWarps, smem, c.s>>>(s, keys, dev<bf16_t>(q), dev<bf16_t>(k),
                                                                 dev<bf16_t>(v), dev<bf16_t>(raw_k), dev<bf16_t>(raw_v),
                                                                 dev<bf16_t>(o), dev<float>(lse));
}

// The forward with document starts or without (kDocs).
template <int D>
void launch_tc(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o,
               Ptr lse) {
  if (keys.doc_start) launch_tc_v<D, true>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
  else launch_tc_v<D, false>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
}

}  // namespace

bool attention_smem_fits(size_t bytes) {
  static const int max_optin = [] {
    int dev = 0, v = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
    return v;
  }();
  return bytes <= size_t(max_optin);
}

bool attention_fwd_tc(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                      Ptr o, Ptr lse) {
  if (q.dtype() != DType::BF16 || k.dtype() != DType::BF16 || o.dtype() != DType::BF16 ||
      c.attn_fwd == AttentionFwd::Rows)
    return false;
  if (c.attn_fwd == AttentionFwd::Fa2 && attention_fwd_fa2(c, s, keys, q, k, v, raw_k, raw_v, o, lse)) return true;
  if (s.dh % 32 != 0 || s.dh > 128 || !attention_smem_fits(tc_smem_bytes(s.dh))) return false;
  if (s.Tq <= 0 || s.B <= 0 || s.H <= 0) return true;  // nothing to do
  switch (s.dh) {
    case 32: launch_tc<32>(c, s, keys, q, k, v, raw_k, raw_v, o, lse); return true;
    case 64: launch_tc<64>(c, s, keys, q, k, v, raw_k, raw_v, o, lse); return true;
    case 96: launch_tc<96>(c, s, keys, q, k, v, raw_k, raw_v, o, lse); return true;
    case 128: launch_tc<128>(c, s, keys, q, k, v, raw_k, raw_v, o, lse); return true;
    default: return false;
  }
}

bool attention_bwd_tc(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                      CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  if (q.dtype() != DType::BF16 || k.dtype() != DType::BF16 || dout.dtype() != DType::BF16 ||
      dq.dtype() != DType::BF16 || c.attn_fwd == AttentionFwd::Rows || s.q_pos0 != 0)
    return false;
  if (c.attn_bwd == AttentionBwd::Fa2 &&
      attention_bwd_fa2(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v))
    return true;
  if (s.dh % 32 != 0 || s.dh > 128 ||
      !attention_smem_fits(std::max(tc_bwd_smem_bytes(s.dh, 2), tc_bwd2_smem_bytes(s.dh))))
    return false;
  if (s.B <= 0 || s.H <= 0 || (s.Tq <= 0 && s.Tk <= 0)) return true;
  switch (s.dh) {
    case 32:
      launch_tc_bwd<32>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
      return true;
    case 64:
      launch_tc_bwd<64>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
      return true;
    case 96:
      launch_tc_bwd<96>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
      return true;
    case 128:
      launch_tc_bwd<128>(c, s, keys, q, k, v, raw_k, raw_v, lse, Dterm, dout, dq, dk, dv, draw_k, draw_v);
      return true;
    default: return false;
  }
}

}  // namespace wiola::cuda
