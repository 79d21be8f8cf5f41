// Self-attention forward on tensor cores, for bf16 activations (the training
// default): flash-style tiles, online softmax, the same visibility rule and
// outputs (o, lse) as the row kernel of attention.cu, which fp32 mode and
// head dims outside {32, 64, 96, 128} keep using. WIOLA_CUDA_ATTENTION=rows
// selects the row kernel in bf16 too (docs/gpu.md).
//
// One block per (64 query rows, head h, sequence b); four warps, 16 query
// rows each. Per tile of 64 key rows (up to the prefix the block's last query
// sees): S = Q K^T by warp-level bf16 MMA (fp32 accumulate) into shared
// memory; each warp updates its rows' running max m and sum l, writes P =
// exp(S - m) as bf16 and rescales its O rows; then O += P V by MMA with O
// held in shared memory in fp32. A query whose position opens a merged pair
// adds its own raw key/value after the tiles, as the row kernel does. No
// atomics: each output row has one writer.
#include <mma.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "util/error.h"

namespace wiola::cuda {
namespace {

constexpr int kTileQ = 64, kTileK = 64, kWarps = 4;

struct TcKeys {
  const int32_t* key_end;
  const int32_t* n_keys;
  const uint8_t* self_open;
};

// Shared memory of one block, in bytes (every part a multiple of 128 bytes).
constexpr size_t tc_smem_bytes(int D) {
  return size_t(3 * kTileQ * D) * 2     // Q, K, V tiles (bf16)
         + size_t(kTileQ * kTileK) * 2  // P (bf16)
         + size_t(kTileQ * kTileK) * 4  // S (fp32)
         + size_t(kTileQ * D) * 4       // O (fp32)
         + size_t(2 * kTileQ) * 4;      // m, l
}

// Key rows visible to position p: a prefix of [0, nk) (rows sorted by key_end).
__device__ int visible_prefix(const TcKeys& keys, int b, int Tk, int nk, int p) {
  if (!keys.key_end) return min(nk, max(p + 1, 0));
  const int32_t* e = keys.key_end + size_t(b) * Tk;
  int lo = 0, hi = nk;  // first row with key_end > p
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (e[mid] <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

template <int D>
__global__ void __launch_bounds__(32 * kWarps) k_attn_fwd_tc(AttnShape s, TcKeys keys, const bf16_t* q,
                                                              const bf16_t* k, const bf16_t* v, const bf16_t* raw_k,
                                                              const bf16_t* raw_v, bf16_t* o, float* lse) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem);  // [kTileQ][D]
  bf16_t* Ks = Qs + kTileQ * D;                  // [kTileK][D]
  bf16_t* Vs = Ks + kTileK * D;                  // [kTileK][D]
  bf16_t* Ps = Vs + kTileK * D;                  // [kTileQ][kTileK]
  float* Ss = reinterpret_cast<float*>(Ps + kTileQ * kTileK);  // [kTileQ][kTileK]
  float* Os = Ss + kTileQ * kTileK;                            // [kTileQ][D]
  float* ms = Os + kTileQ * D;                                 // [kTileQ]
  float* ls = ms + kTileQ;                                     // [kTileQ]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int i0 = blockIdx.x * kTileQ, h = blockIdx.y, b = blockIdx.z, g = h % s.Hkv;
  const size_t q_ld = size_t(s.H) * D, kv_ld = size_t(s.Hkv) * D;
  const float scale = rsqrtf(float(D));
  const bf16_t zero = __float2bfloat16(0.f);

  for (int idx = tid; idx < kTileQ * D; idx += blockDim.x) {
    const int r = idx / D, c = idx % D, i = i0 + r;
    Qs[idx] = i < s.Tq ? q[(size_t(b) * s.Tq + i) * q_ld + size_t(h) * D + c] : zero;
    Os[idx] = 0.f;
  }
  if (tid < kTileQ) {
    ms[tid] = -INFINITY;
    ls[tid] = 0.f;
  }
  const int nk = keys.n_keys ? keys.n_keys[b] : s.Tk;
  const int i_last = min(i0 + kTileQ, s.Tq) - 1;
  const int kmax = visible_prefix(keys, b, s.Tk, nk, s.q_pos0 + i_last);
  __syncthreads();

  for (int j0 = 0; j0 < kmax; j0 += kTileK) {
    for (int idx = tid; idx < kTileK * D; idx += blockDim.x) {
      const int r = idx / D, c = idx % D, j = j0 + r;
      const size_t at = (size_t(b) * s.Tk + j) * kv_ld + size_t(g) * D + c;
      Ks[idx] = j < kmax ? k[at] : zero;
      Vs[idx] = j < kmax ? v[at] : zero;
    }
    __syncthreads();

    // S[16 rows of this warp][kTileK] = Q K^T.
    {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major> fb;  // K^T
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
      for (int n = 0; n < kTileK / 16; ++n) {
        wmma::fill_fragment(fc, 0.f);
        for (int kk = 0; kk < D / 16; ++kk) {
          wmma::load_matrix_sync(fa, Qs + warp * 16 * D + kk * 16, D);
          wmma::load_matrix_sync(fb, Ks + n * 16 * D + kk * 16, D);
          wmma::mma_sync(fc, fa, fb, fc);
        }
        wmma::store_matrix_sync(Ss + warp * 16 * kTileK + n * 16, fc, kTileK, wmma::mem_row_major);
      }
    }
    __syncwarp();

    // Online softmax of this warp's rows; lanes hold columns lane, lane + 32.
    for (int rr = 0; rr < 16; ++rr) {
      const int r = warp * 16 + rr, i = i0 + r, p = s.q_pos0 + i;
      float sv[kTileK / 32], mx = -INFINITY;
#pragma unroll
      for (int t = 0; t < kTileK / 32; ++t) {
        const int c = lane + 32 * t, j = j0 + c;
        const bool vis = i < s.Tq && j < kmax &&
                         (keys.key_end ? keys.key_end[size_t(b) * s.Tk + j] <= p : j <= p);
        sv[t] = vis ? Ss[r * kTileK + c] * scale : -INFINITY;
        mx = fmaxf(mx, sv[t]);
      }
      mx = warp_max(mx);
      const float m_old = ms[r], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
#pragma unroll
      for (int t = 0; t < kTileK / 32; ++t) {
        const float pj = sv[t] == -INFINITY ? 0.f : __expf(sv[t] - m_new);
        Ps[r * kTileK + lane + 32 * t] = __float2bfloat16(pj);
        sum += pj;
      }
      sum = warp_sum(sum);
      const float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
      for (int c = lane; c < D; c += 32) Os[r * D + c] *= alpha;
      __syncwarp();
      if (lane == 0) {
        ms[r] = m_new;
        ls[r] = ls[r] * alpha + sum;
      }
      __syncwarp();
    }

    // O[16 rows][D] += P V.
    {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major> pa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major> vb;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> oc;
      for (int n = 0; n < D / 16; ++n) {
        wmma::load_matrix_sync(oc, Os + warp * 16 * D + n * 16, D, wmma::mem_row_major);
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          wmma::load_matrix_sync(pa, Ps + warp * 16 * kTileK + kk * 16, kTileK);
          wmma::load_matrix_sync(vb, Vs + kk * 16 * D + n * 16, D);
          wmma::mma_sync(oc, pa, vb, oc);
        }
        wmma::store_matrix_sync(Os + warp * 16 * D + n * 16, oc, D, wmma::mem_row_major);
      }
    }
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
      for (int c = lane; c < D; c += 32) Os[r * D + c] = Os[r * D + c] * alpha + pj * ld(raw_v + row + c);
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
    o[(size_t(b) * s.Tq + i) * q_ld + size_t(h) * D + c] = __float2bfloat16(l > 0.f ? Os[idx] / l : 0.f);
  }
  if (tid < kTileQ && i0 + tid < s.Tq) {
    const float l = ls[tid];
    lse[(size_t(b) * s.H + h) * s.Tq + i0 + tid] = l > 0.f ? ms[tid] + logf(l) : -INFINITY;
  }
}

template <int D>
void launch_tc(Ctx c, const AttnShape& s, const TcKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
               Ptr o, Ptr lse) {
  const size_t smem = tc_smem_bytes(D);
  static const bool attr_set = [&] {
    check(cudaFuncSetAttribute(k_attn_fwd_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "attention_fwd (tensor cores): shared memory size");
    return true;
  }();
  (void)attr_set;
  const dim3 grid(unsigned((s.Tq + kTileQ - 1) / kTileQ), unsigned(s.H), unsigned(s.B));
  k_attn_fwd_tc<D><<<grid, 32 * kWarps, smem, c.s>>>(s, keys, dev<bf16_t>(q), dev<bf16_t>(k), dev<bf16_t>(v),
                                                     dev<bf16_t>(raw_k), dev<bf16_t>(raw_v), dev<bf16_t>(o),
                                                     dev<float>(lse));
}

}  // namespace

bool attention_tc_enabled() {
  const char* e = std::getenv("WIOLA_CUDA_ATTENTION");
  if (!e || !*e || std::strcmp(e, "tc") == 0) return true;
  WIOLA_CHECK(std::strcmp(e, "rows") == 0, "WIOLA_CUDA_ATTENTION=", e, ": expected tc (tensor cores, the default "
              "for bf16) or rows");
  return false;
}

bool attention_fwd_tc(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k,
                      CPtr raw_v, Ptr o, Ptr lse) {
  if (q.dtype() != DType::BF16 || k.dtype() != DType::BF16 || o.dtype() != DType::BF16 || !attention_tc_enabled())
    return false;
  if (s.Tq <= 0 || s.B <= 0 || s.H <= 0) return true;  // nothing to do
  const TcKeys tk{keys.key_end, keys.n_keys, keys.self_open};
  switch (s.dh) {
    case 32: launch_tc<32>(c, s, tk, q, k, v, raw_k, raw_v, o, lse); return true;
    case 64: launch_tc<64>(c, s, tk, q, k, v, raw_k, raw_v, o, lse); return true;
    case 96: launch_tc<96>(c, s, tk, q, k, v, raw_k, raw_v, o, lse); return true;
    case 128: launch_tc<128>(c, s, tk, q, k, v, raw_k, raw_v, o, lse); return true;
    default: return false;
  }
}

}  // namespace wiola::cuda
