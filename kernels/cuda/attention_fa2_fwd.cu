// Self-attention forward in the FlashAttention-2 form, for bf16 activations
// at head dims 32, 64, 96, 128 (backend option attention = fa2; attention_tc.cu's
// WMMA kernel stays the default until this one is measured on a GPU), and a
// backward in the same form (attention_bwd = fa2, described at
// "backward" in attention_fa2_bwd.cu; v1 stays the default until measured). Same
// contract and outputs as attention_tc.cu's forward (kernels/op_list.h,
// attention_fwd): o, and lse in fp32, which the tensor-core backward reads.
//
// One block per (64 query rows, head h, sequence b), four warps of 16 query
// rows; the query tiles run last to first (the causal tiles with the most
// keys start first). That is the default tile shape; the kernel is a template
// on query rows a block (64 or 128: a warp per 16 rows, so 128 is eight
// warps) and key rows a tile (64 or 128), chosen by the backend option
// attention_tile (c.attn_tile, docs/gpu.md "The fa2 forward's tile shapes");
// 64 below reads BM or BN there. Everything goes through the warp-level instructions of
// ptx.cuh (mma.m16n8k16, ldmatrix, cp.async), whose fragment layouts are
// documented there:
// - Q is copied once (cp.async) and kept as A fragments in registers.
// - K and V tiles of 64 rows are double-buffered in shared memory: the copies
//   of tile t+1 are in flight while tile t is computed. Rows are padded to
//   D + 8 elements, so the eight 16-byte rows an ldmatrix reads lie on
//   distinct banks.
// - S = Q K^T into fp32 fragments (K by ldmatrix, non-transposed, gives the
//   col-major B operand), masked by visibility where the tile is not wholly
//   visible to the block's first query; the online softmax runs on the
//   fragments (a row's four values of a quad reduced with __shfl_xor_sync),
//   in base 2 with the scale folded into one FMA; each lane keeps a partial
//   row sum, reduced over its quad at the end.
// - P goes to bf16 A fragments straight from the S accumulators (an
//   m16n8k16 C fragment pair is the A fragment of the next product) and
//   O += P V with V by ldmatrix .trans; O, m, l stay in registers (fp32).
// - Key tiles stop at the last one visible to the block's last query.
// - Documents (doc_start): key tiles start at the tile (of the BN-row grid)
//   holding the first key row the block's first query's document sees
//   (attention_common.cuh), not at row 0; a tile is masked where some key is
//   not visible to the block's first query or lies before its last query's
//   document, each element by its row's position and document.
// - A query whose position opens a merged pair adds its own raw key/value
//   after the tiles: q . raw_k by the row's quad (a shuffle reduction), then
//   m, l and O are updated, as attention_tc.cu does.
// - O / l goes out as bf16 through the warp's own rows of the Q tile (16-byte
//   stores), lse = m + log l in fp32.
// Head packing (backend option attention_heads_per_block = HP, 2 or 4; 1 is
// the kernel above, c.attn_heads): a block takes HP query heads of one KV
// group (heads g + Hkv (HP P + p), p < HP, of group g) over the same R =
// (tile's query rows) / HP positions each (the kernel's BM is then R), so
// the tile's query rows are the block's rows over all of its heads: the
// warps, registers and shared memory of the unpacked tile, and each K/V
// tile copied to shared memory serves HP heads. Warp w takes head p = w /
// (R / 16) and 16 rows of it; a warp's work is that of the unpacked kernel
// (its rows meet the same key tiles or fewer, the others wholly masked for
// it), so packing gives the bits of HP = 1 at the same key tile (tested).
// The causal skip and ATM's key list are per position, the same for every
// packed head. docs/gpu.md "Head packing in the fa2 forward".
// Tile helpers shared with the backward: attention_fa2.cuh.
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

// Shared memory of the forward with BM query rows a block and BN key rows a
// tile: the Q tile [BM][D + 8], K[2], V[2] tiles [BN][D + 8] (bf16) and the
// visibility ends of the two K/V tiles in flight, and the document starts of
// the block's positions (at most BM). At most 171 KB (128 x 128, d_h 128),
// within H100's opt-in 227 KB a block.
constexpr size_t fa2_fwd_smem_bytes(int D, int BM = kFaRows, int BN = kFaRows) {
  return size_t((BM + 4 * BN) * fa_ld(D)) * 2 + size_t(2 * BN + BM) * 4;
}

// Blocks per SM the register allocation is held to (__launch_bounds__): the
// register cap is 64K / (threads x blocks), at most 255. 64 x 64 as measured
// before the variants; 128 query rows (eight warps, 256 threads) hold one
// block (255 registers) except 128 x 64 at d_h 32 (two, 128 registers).
constexpr int fa2_fwd_min_blocks(int D, int BM = kFaRows, int BN = kFaRows) {
  return BM == 64 ? (BN == 64 ? (D <= 64 ? 3 : 2) : (D <= 32 ? 3 : 2)) : (D <= 32 && BN == 64 ? 2 : 1);
}
// Whether the forward holds the warp's Q rows as A fragments from first tile
// to last: not at d_h 128 with 128-key tiles, where S (64 fp32 a lane), O (64)
// and Q (32) would spill; there Q is reloaded from shared memory (ldmatrix)
// at every k step: the same values, the same products.
constexpr bool fa2_fwd_hold_q(int D, int BN) { return D * BN < 128 * 128; }

// BM query rows of each of HP heads a block (a warp per 16 rows of a head;
// BM x HP is the tile's query rows, 64 or 128), BN key rows a tile.
// long-function: one tile loop whose fragments (S, P, O or
// dK/dV, m, l) live in registers from the first tile to the last; cut into
// functions, they would pass through arrays the compiler may put in local
// memory, and the PTX (registers, spills: ptxas_budget.json) and bits are
// pinned to this form (docs/gpu.md). Its steps are marked by comments.
// (clang-format 14 reads a product in __launch_bounds__ as a pointer)
// clang-format off
template <int D, int BM, int BN, int HP, bool kDocs>
__global__ void __launch_bounds__(2 * BM * HP, fa2_fwd_min_blocks(D, BM * HP, BN))
    k_attention_fwd_fa2(AttnShape s, AttnKeys keys, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                        const bf16_t* raw_k, const bf16_t* raw_v, bf16_t* o, float* lse) {
  // clang-format on
  // KQ: 16-wide k steps of Q K^T; NO: 8-wide column tiles of O; NS: of S;
  // KP: 16-wide k steps of P V.
  constexpr int LD = fa_ld(D), KQ = D / 16, NO = D / 8, NS = BN / 8, KP = BN / 16, NT = 2 * BM * HP;
  static_assert((BM * HP == 64 || BM * HP == 128) && BM % 16 == 0 && (BN == 64 || BN == 128),
                "the tile shapes of AttentionTile");
  static_assert(HP == 1 || HP == 2 || HP == 4, "heads a block: 1, 2 or 4");
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem);          // [HP][BM][LD]
  bf16_t* Ks = Qs + HP * BM * LD;                        // [2][BN][LD]
  bf16_t* Vs = Ks + 2 * BN * LD;                         // [2][BN][LD]
  int* kend = reinterpret_cast<int*>(Vs + 2 * BN * LD);  // [2][BN]
  int* dss = kend + 2 * BN;                              // [BM]: the positions' document starts

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
  // The warp's head among the block's (hw) and its 16 rows of that head (wr):
  // warp * 16 is its first row of the Q tile either way.
  const int hw = HP == 1 ? 0 : warp / (BM / 16), wr = HP == 1 ? warp : warp % (BM / 16);
  const int i0 = (gridDim.x - 1 - blockIdx.x) * BM, b = blockIdx.z;
  // blockIdx.y = P Hkv + g: heads g + Hkv (HP P + p), p < HP, of group g;
  // the first, g + HP P Hkv, is blockIdx.y + (HP - 1) (blockIdx.y - g).
  const int y = int(blockIdx.y), g = y % s.Hkv, h0 = y + (HP - 1) * (y - g);
  const int h = h0 + s.Hkv * hw;  // the warp's head
  const size_t q_ld = size_t(s.H) * D, kv_ld = size_t(s.Hkv) * D;
  const bf16_t* qb = q + size_t(b) * s.Tq * q_ld + size_t(h0) * D;
  const bf16_t* kb = k + size_t(b) * s.Tk * kv_ld + size_t(g) * D;
  const bf16_t* vb = v + size_t(b) * s.Tk * kv_ld + size_t(g) * D;
  const int nk = keys.n_keys ? keys.n_keys[b] : s.Tk;
  const int i_last = min(i0 + BM, s.Tq) - 1;
  const int kmax = visible_prefix(keys.key_end, b, s.Tk, nk, s.q_pos0 + i_last);
  // Documents (kDocs): the first key tile (of the BN grid) the block's rows
  // see (0 without); the rows' document starts are staged in shared memory
  // for the mask (a row past Tq takes the last row's), where reading them
  // costs no registers across the tiles.
  const int j_base = kDocs ? doc_first_key(keys, b, s.Tk, nk, keys.doc_start[size_t(b) * s.Tq + i0]) / BN * BN : 0;
  const int n_tiles = (kmax - j_base + BN - 1) / BN;
  if constexpr (kDocs)
    for (int r = threadIdx.x; r < BM; r += NT) dss[r] = keys.doc_start[size_t(b) * s.Tq + min(i0 + r, i_last)];

  // Copies: Q (group 1), then K and V tile 0 (group 2).
  if constexpr (HP == 1) {
    fa_copy_tile<D, BM, NT>(Qs, qb, q_ld, i0, s.Tq);
  } else {
    fa_copy_heads<D, BM, HP, NT>(Qs, qb, size_t(s.Hkv) * D, q_ld, i0, s.Tq);
  }
  ptx::cp_async_commit();
  if (n_tiles > 0) {
    fa_copy_tile<D, BN, NT>(Ks, kb, kv_ld, j_base, kmax);
    fa_copy_tile<D, BN, NT>(Vs, vb, kv_ld, j_base, kmax);
    fa_key_ends<BN>(kend, keys, b, s.Tk, j_base, kmax);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<1>();
  __syncthreads();

  // The warp's 16 rows of Q as A fragments: matrix i of the x4 is rows
  // (i & 1) * 8.., columns (i >> 1) * 8.. of the 16 x 16 block. Held from
  // here (kHoldQ) or loaded at each k step and again after the last tile.
  constexpr bool kHoldQ = fa2_fwd_hold_q(D, BN);
  uint32_t qf[KQ][4];
  const bf16_t* q_frag = Qs + (warp * 16 + (lane & 8) + (lane & 7)) * LD + (lane >> 4) * 8;
  if constexpr (kHoldQ) {
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) ptx::ldmatrix_x4(qf[kk], q_frag + kk * 16);
  }

  // The lane's rows r = 0, 1: the warp's rows gr and gr + 8. m in base 2
  // units (the scaled score times log2 e); l the lane's share of the sum.
  const int row0 = i0 + wr * 16 + gr;
  const int pos[2] = {s.q_pos0 + row0, s.q_pos0 + row0 + 8};
  const float scale = rsqrtf(float(D)), scale_log2 = scale * 1.4426950408889634f;
  float acc_o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) acc_o[n][0] = acc_o[n][1] = acc_o[n][2] = acc_o[n][3] = 0.f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};

  for (int t = 0; t < n_tiles; ++t) {
    const int cur = t & 1;
    if (t + 1 < n_tiles) {  // the next tile's copies fly while this one is computed
      const int nxt = cur ^ 1;
      const int j1 = j_base + (t + 1) * BN;
      fa_copy_tile<D, BN, NT>(Ks + nxt * BN * LD, kb, kv_ld, j1, kmax);
      fa_copy_tile<D, BN, NT>(Vs + nxt * BN * LD, vb, kv_ld, j1, kmax);
      fa_key_ends<BN>(kend + nxt * BN, keys, b, s.Tk, j1, kmax);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t* Kt = Ks + cur * BN * LD;
    const bf16_t* Vt = Vs + cur * BN * LD;
    const int* ke = kend + cur * BN;

    // S = Q K^T: matrix i of an x4 of K is key rows (i >> 1) * 8.., columns
    // (i & 1) * 8..: the B fragments of column tiles n and n + 1.
    float acc_s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) acc_s[n][0] = acc_s[n][1] = acc_s[n][2] = acc_s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      if constexpr (!kHoldQ) ptx::ldmatrix_x4(qf[kk], q_frag + kk * 16);
#pragma unroll
      for (int n = 0; n < NS; n += 2) {
        uint32_t kf[4];
        ptx::ldmatrix_x4(kf, Kt + (8 * n + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 + (lane & 8));
        const uint32_t b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
        ptx::mma_bf16_16816(acc_s[n], qf[kk], b0, acc_s[n]);
        ptx::mma_bf16_16816(acc_s[n + 1], qf[kk], b1, acc_s[n + 1]);
      }
    }

    // Visibility: only a tile with a key that the block's first query does
    // not see (keys sorted by their ends; past kmax INT_MAX) or that ends
    // before its last query's document needs the mask.
    if (ke[BN - 1] > s.q_pos0 + i0 || (kDocs && ke[0] < dss[BM - 1])) {
      const int ds[2] = {kDocs ? dss[wr * 16 + gr] : 0, kDocs ? dss[wr * 16 + gr + 8] : 0};
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kc = ke[8 * n + 2 * tq + (e & 1)];
          if (kc > pos[e >> 1] || (kDocs && kc < ds[e >> 1])) acc_s[n][e] = -INFINITY;
        }
    }

    // Online softmax on the fragments: values e = 0, 1 are row 0's, 2, 3 row 1's.
    float m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(acc_s[n][2 * r], acc_s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_r[r], mx * scale_log2);
      m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet
      const float alpha = exp2f(m_r[r] - m_use[r]);
      m_r[r] = m_new;
      l_r[r] *= alpha;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        acc_o[n][2 * r] *= alpha;
        acc_o[n][2 * r + 1] *= alpha;
      }
    }
    // P = exp(S - m) as bf16 A fragments: the C fragments of column tiles
    // 2kk and 2kk + 1 are the A fragment of k step kk.
    uint32_t pf[KP][4];
#pragma unroll
    for (int kk = 0; kk < KP; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float* sv = acc_s[2 * kk + half];
        const float p0 = exp2f(fmaf(sv[0], scale_log2, -m_use[0])), p1 = exp2f(fmaf(sv[1], scale_log2, -m_use[0]));
        const float p2 = exp2f(fmaf(sv[2], scale_log2, -m_use[1])), p3 = exp2f(fmaf(sv[3], scale_log2, -m_use[1]));
        l_r[0] += p0 + p1;
        l_r[1] += p2 + p3;
        pf[kk][2 * half] = ptx::pack_bf16(p0, p1);
        pf[kk][2 * half + 1] = ptx::pack_bf16(p2, p3);
      }

      // O += P V: matrix i of an x4 .trans of V is key rows (i & 1) * 8..,
      // columns (i >> 1) * 8..: the B fragments of column tiles n and n + 1.
#pragma unroll
    for (int kk = 0; kk < KP; ++kk)
#pragma unroll
      for (int n = 0; n < NO; n += 2) {
        uint32_t vf[4];
        ptx::ldmatrix_x4_trans(vf, Vt + (16 * kk + (lane & 8) + (lane & 7)) * LD + 8 * n + (lane >> 4) * 8);
        const uint32_t b0[2] = {vf[0], vf[1]}, b1[2] = {vf[2], vf[3]};
        ptx::mma_bf16_16816(acc_o[n], pf[kk], b0, acc_o[n]);
        ptx::mma_bf16_16816(acc_o[n + 1], pf[kk], b1, acc_o[n + 1]);
      }
    __syncthreads();  // the tile after next overwrites this one's buffers
  }
  ptx::cp_async_wait<0>();  // (no tiles: the empty group)

  // The row sums over the quad.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
    l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
  }

  // The raw self key/value of a query that opens a merged pair: the lane
  // holds row r's Q at columns 16kk + 2tq (+1) in qf[kk][r] and 16kk + 8 +
  // 2tq (+1) in qf[kk][2 + r], and O at columns 8n + 2tq (+1).
  if (keys.self_open) {
    if constexpr (!kHoldQ) {
#pragma unroll
      for (int kk = 0; kk < KQ; ++kk) ptx::ldmatrix_x4(qf[kk], q_frag + kk * 16);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + 8 * r;
      const bool open = i < s.Tq && keys.self_open[size_t(b) * s.Tq + i];
      const size_t row = (size_t(b) * s.Tq + (open ? i : 0)) * kv_ld + size_t(g) * D;
      float dot = 0.f;
      if (open) {
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk) {
          const uint32_t k0 = ld_u32(raw_k + row + kk * 16 + 2 * tq), k8 = ld_u32(raw_k + row + kk * 16 + 8 + 2 * tq);
          dot += bf16_lo(qf[kk][r]) * bf16_lo(k0) + bf16_hi(qf[kk][r]) * bf16_hi(k0) +
                 bf16_lo(qf[kk][2 + r]) * bf16_lo(k8) + bf16_hi(qf[kk][2 + r]) * bf16_hi(k8);
        }
      }
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      dot += __shfl_xor_sync(0xffffffffu, dot, 2);
      if (open) {
        const float sc = dot * scale_log2, m_new = fmaxf(m_r[r], sc);
        const float alpha = exp2f(m_r[r] - m_new), pj = exp2f(sc - m_new);
        m_r[r] = m_new;
        l_r[r] = l_r[r] * alpha + pj;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          const uint32_t rv = ld_u32(raw_v + row + 8 * n + 2 * tq);
          acc_o[n][2 * r] = acc_o[n][2 * r] * alpha + pj * bf16_lo(rv);
          acc_o[n][2 * r + 1] = acc_o[n][2 * r + 1] * alpha + pj * bf16_hi(rv);
        }
      }
    }
  }

  // O / l as bf16 into the warp's own 16 rows of the Q tile (only this warp
  // read them), then out in 16-byte rows; lse = m + log l.
  bf16_t* Ow = Qs + warp * 16 * LD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv = l_r[r] > 0.f ? 1.f / l_r[r] : 0.f;
#pragma unroll
    for (int n = 0; n < NO; ++n)
      *reinterpret_cast<uint32_t*>(Ow + (gr + 8 * r) * LD + 8 * n + 2 * tq) =
          ptx::pack_bf16(acc_o[n][2 * r] * inv, acc_o[n][2 * r + 1] * inv);
  }
  __syncwarp();
  bf16_t* ob = o + size_t(b) * s.Tq * q_ld + size_t(h) * D;
#pragma unroll
  for (int idx = lane; idx < 16 * NO; idx += 32) {
    const int r = idx / NO, c = (idx % NO) * 8, i = i0 + wr * 16 + r;
    if (i < s.Tq)
      *reinterpret_cast<uint4*>(ob + size_t(i) * q_ld + c) = *reinterpret_cast<const uint4*>(Ow + r * LD + c);
  }
  if (tq == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + 8 * r;
      if (i < s.Tq)
        lse[(size_t(b) * s.H + h) * s.Tq + i] = l_r[r] > 0.f ? m_r[r] * 0.6931471805599453f + logf(l_r[r]) : -INFINITY;
    }
  }
}

// BM query rows of each of HP heads a block (BM x HP: the tile's query rows);
// kDocs: the variant with document starts.
template <int D, int BM, int BN, int HP, bool kDocs>
void launch_fa2_fwd_v(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                      Ptr o, Ptr lse) {
  const size_t smem = fa2_fwd_smem_bytes(D, BM * HP, BN);
  static const bool attr_set = [&] {
    check(cudaFuncSetAttribute(k_attention_fwd_fa2<D, BM, BN, HP, kDocs>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(smem)),
          "attention_fwd (fa2): shared memory size");
    return true;
  }();
  (void)attr_set;
  const dim3 grid(unsigned((s.Tq + BM - 1) / BM), unsigned(s.H / HP), unsigned(s.B));
  k_attention_fwd_fa2<D, BM, BN, HP, kDocs>
      <<<grid, 2 * BM * HP, smem, c.s>>>(s, keys, dev<bf16_t>(q), dev<bf16_t>(k), dev<bf16_t>(v), dev<bf16_t>(raw_k),
                                         dev<bf16_t>(raw_v), dev<bf16_t>(o), dev<float>(lse));
}

// The forward with document starts or without: a kernel each (the one
// without keeps its registers, ptxas_budget.json).
template <int D, int BM, int BN, int HP>
void launch_fa2_fwd(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                    Ptr o, Ptr lse) {
  if (keys.doc_start) launch_fa2_fwd_v<D, BM, BN, HP, true>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
  else launch_fa2_fwd_v<D, BM, BN, HP, false>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
}

// The forward at tile shape BM x BN (BM / HP rows of HP heads a block) for the
// head dims it takes; false for another.
template <int BM, int BN, int HP = 1>
bool fa2_fwd_dh(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o,
                Ptr lse) {
  constexpr int R = BM / HP;
  switch (s.dh) {
    case 32: launch_fa2_fwd<32, R, BN, HP>(c, s, keys, q, k, v, raw_k, raw_v, o, lse); return true;
    case 64: launch_fa2_fwd<64, R, BN, HP>(c, s, keys, q, k, v, raw_k, raw_v, o, lse); return true;
    case 96: launch_fa2_fwd<96, R, BN, HP>(c, s, keys, q, k, v, raw_k, raw_v, o, lse); return true;
    case 128: launch_fa2_fwd<128, R, BN, HP>(c, s, keys, q, k, v, raw_k, raw_v, o, lse); return true;
    default: return false;
  }
}

// The forward at tile shape BM x BN with c.attn_heads heads a block.
template <int BM, int BN>
bool fa2_fwd_hp(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o,
                Ptr lse) {
  switch (c.attn_heads) {
    case 2: return fa2_fwd_dh<BM, BN, 2>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
    case 4: return fa2_fwd_dh<BM, BN, 4>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
    default: return fa2_fwd_dh<BM, BN>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
  }
}

}  // namespace

bool attention_fwd_fa2(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                       Ptr o, Ptr lse) {
  if (q.dtype() != DType::BF16 || k.dtype() != DType::BF16 || v.dtype() != DType::BF16 || o.dtype() != DType::BF16)
    return false;
  const int BM = c.attn_tile == AttentionTile::T128x64 || c.attn_tile == AttentionTile::T128x128 ? 128 : 64;
  const int BN = c.attn_tile == AttentionTile::T64x128 || c.attn_tile == AttentionTile::T128x128 ? 128 : 64;
  if (s.dh % 32 != 0 || s.dh > 128 || !attention_smem_fits(fa2_fwd_smem_bytes(s.dh, BM, BN))) return false;
  // cp.async and the 16-byte stores of o need 16-byte aligned rows (rows are
  // multiples of 64 bytes: the bases decide); the raw rows are read in pairs.
  if (!aligned(dev<bf16_t>(q), 16) || !aligned(dev<bf16_t>(k), 16) || !aligned(dev<bf16_t>(v), 16) ||
      !aligned(dev<bf16_t>(o), 16) || !aligned(dev<bf16_t>(raw_k), 4) || !aligned(dev<bf16_t>(raw_v), 4))
    return false;
  // Head packing: the heads a block must divide a KV group's (the same at
  // every TP degree: ranks keep whole groups); refused, not ignored.
  WIOLA_CHECK(c.attn_heads == 1 || (s.Hkv > 0 && s.H % s.Hkv == 0 && s.H / s.Hkv % c.attn_heads == 0),
              "train.cuda_attention_heads_per_block (--attention-heads-per-block) must be 1 or divide the query "
              "heads of a KV group (H / H_kv = ",
              s.H, " / ", s.Hkv, "; got ", c.attn_heads, ")");
  if (s.Tq <= 0 || s.B <= 0 || s.H <= 0) return true;  // nothing to do
  // The tile shape (c.attn_tile), the heads a block, then the head dim: every
  // triple instantiated.
  switch (c.attn_tile) {
    case AttentionTile::T64x128: return fa2_fwd_hp<64, 128>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
    case AttentionTile::T128x64: return fa2_fwd_hp<128, 64>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
    case AttentionTile::T128x128: return fa2_fwd_hp<128, 128>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
    default: return fa2_fwd_hp<64, 64>(c, s, keys, q, k, v, raw_k, raw_v, o, lse);
  }
}

}  // namespace wiola::cuda
