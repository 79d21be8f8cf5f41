// Causal self-attention with GQA (g(h) = h mod H_kv) and ATM key layouts on
// the GPU (semantics: Ops::attention_fwd/bwd in kernels/ops.h). Online
// softmax: no [B, H, Tq, Tk] buffer. This first version favours being right
// and deterministic over speed: one warp per query row (forward, dq) or per
// key row (dk, dv), lanes split the head dimension, keys or queries visited
// in order; every output row has exactly one writer, so no atomics. In bf16
// the forward and backward run on tensor cores instead (attention_tc.cu),
// except for head dims it does not take; these kernels stay the fp32 path.
//
// Visibility: key row j of sequence b is visible to the query at position
// p = q_pos0 + i iff j < n_keys[b] and key_end[b, j] <= p (key_end null: j <=
// p); rows are sorted by key_end, so the visible rows are a prefix. A query
// whose position opens a merged pair also sees its own raw key/value
// (self_open). Documents (doc_start): a query sees only the rows of its
// document (attention_common.cuh), and the loops visit only those: the
// forward and dq from its document's first row, dk/dv up to the last query of
// the row's document.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "util/error.h"

namespace wiola::cuda {
namespace {

constexpr int kMaxPerLane = 8;  // head dims up to 256
constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ int n_keys_of(const AttnKeys& k, int b, int Tk) { return k.n_keys ? k.n_keys[b] : Tk; }
__device__ __forceinline__ int end_of(const AttnKeys& k, int b, int Tk, int j) {
  return k.key_end ? k.key_end[size_t(b) * Tk + j] : j;
}

// Dot product of a lane-split vector held in registers with a row in memory.
template <class E>
__device__ __forceinline__ float dot_row(const float (&a)[kMaxPerLane], const E* row, int dh, int lane) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int e = lane + 32 * k;
    if (e < dh) s += a[k] * ld(row + e);
  }
  return warp_sum(s);
}
template <class E>
__device__ __forceinline__ void load_row(float (&a)[kMaxPerLane], const E* row, int dh, int lane, float scale) {
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int e = lane + 32 * k;
    a[k] = e < dh ? ld(row + e) * scale : 0.f;
  }
}

// Forward: one warp per (b, h, query i).
template <class A>
__global__ void k_attention_fwd(AttnShape s, AttnKeys keys, const A* q, const A* k, const A* v, const A* raw_k,
                                const A* raw_v, A* o, float* lse) {
  const int warp = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (warp >= s.B * s.H * s.Tq) return;
  const int i = warp % s.Tq, h = (warp / s.Tq) % s.H, b = warp / (s.Tq * s.H);
  const int g = h % s.Hkv, dh = s.dh, p = s.q_pos0 + i;
  const size_t q_ld = size_t(s.H) * dh, kv_ld = size_t(s.Hkv) * dh;
  float qr[kMaxPerLane], acc[kMaxPerLane];
  load_row(qr, q + (size_t(b) * s.Tq + i) * q_ld + size_t(h) * dh, dh, lane, rsqrtf(float(dh)));
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  auto visit = [&](const A* krow, const A* vrow) {
    const float sc = dot_row(qr, krow, dh, lane);
    const float m_new = fmaxf(m, sc);
    const float alpha = __expf(m - m_new);  // 0 while m = -inf
    const float pj = __expf(sc - m_new);
    l = l * alpha + pj;
    m = m_new;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      acc[e] = acc[e] * alpha + (d < dh ? pj * ld(vrow + d) : 0.f);
    }
  };
  const int nk = n_keys_of(keys, b, s.Tk);
  const int j_lo = doc_first_key(keys, b, s.Tk, nk, doc_start_of(keys.doc_start, b, s.Tq, i));
  for (int j = j_lo; j < nk && end_of(keys, b, s.Tk, j) <= p; ++j) {
    const size_t row = (size_t(b) * s.Tk + j) * kv_ld + size_t(g) * dh;
    visit(k + row, v + row);
  }
  if (keys.self_open && keys.self_open[size_t(b) * s.Tq + i]) {
    const size_t row = (size_t(b) * s.Tq + i) * kv_ld + size_t(g) * dh;
    visit(raw_k + row, raw_v + row);
  }
  A* orow = o + (size_t(b) * s.Tq + i) * q_ld + size_t(h) * dh;
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < dh) st(orow + d, acc[e] * inv);
  }
  if (lane == 0) lse[(size_t(b) * s.H + h) * s.Tq + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

// D[b, h, i] = dout . o (the softmax backward's row term).
template <class A>
__global__ void k_attention_bwd_rowdot(AttnShape s, const A* o, const A* dout, float* D) {
  const int warp = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (warp >= s.B * s.H * s.Tq) return;
  const int i = warp % s.Tq, h = (warp / s.Tq) % s.H, b = warp / (s.Tq * s.H);
  const size_t off = (size_t(b) * s.Tq + i) * size_t(s.H) * s.dh + size_t(h) * s.dh;
  float acc = 0.f;
  for (int e = lane; e < s.dh; e += 32) acc += ld(o + off + e) * ld(dout + off + e);
  acc = warp_sum(acc);
  if (lane == 0) D[(size_t(b) * s.H + h) * s.Tq + i] = acc;
}

// dq, and the raw self key/value gradients: one warp per (b, query i, KV
// group g), looping over the group's heads. kDocs: with document starts (a
// kernel of its own: the one without keeps its registers, ptxas_budget.json).
template <class A, bool kDocs>
__global__ void k_attention_bwd_dq(AttnShape s, AttnKeys keys, const A* q, const A* k, const A* v, const A* raw_k,
                                   const A* raw_v, const float* lse, const float* D, const A* dout, A* dq, A* draw_k,
                                   A* draw_v) {
  const int warp = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (warp >= s.B * s.Tq * s.Hkv) return;
  const int g = warp % s.Hkv, i = (warp / s.Hkv) % s.Tq, b = warp / (s.Hkv * s.Tq);
  const int dh = s.dh, p = s.q_pos0 + i;
  const float scale = rsqrtf(float(dh));
  const size_t q_ld = size_t(s.H) * dh, kv_ld = size_t(s.Hkv) * dh;
  const bool self = keys.self_open && keys.self_open[size_t(b) * s.Tq + i];
  const size_t raw_row = (size_t(b) * s.Tq + i) * kv_ld + size_t(g) * dh;
  float drk[kMaxPerLane], drv[kMaxPerLane];
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) drk[e] = drv[e] = 0.f;
  const int nk = n_keys_of(keys, b, s.Tk);
  for (int h = g; h < s.H; h += s.Hkv) {
    const size_t qoff = (size_t(b) * s.Tq + i) * q_ld + size_t(h) * dh;
    float qr[kMaxPerLane], dor[kMaxPerLane], acc[kMaxPerLane];
    load_row(qr, q + qoff, dh, lane, scale);
    load_row(dor, dout + qoff, dh, lane, 1.f);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) acc[e] = 0.f;
    const float L = lse[(size_t(b) * s.H + h) * s.Tq + i], Dv = D[(size_t(b) * s.H + h) * s.Tq + i];
    struct PDs {
      float p, ds;
    };
    auto grad = [&](const A* krow, const A* vrow) {  // adds ds k to dq
      const float pj = __expf(dot_row(qr, krow, dh, lane) - L);
      const float ds = pj * (dot_row(dor, vrow, dh, lane) - Dv);
#pragma unroll
      for (int e = 0; e < kMaxPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < dh) acc[e] += ds * ld(krow + d);
      }
      return PDs{pj, ds};
    };
    if constexpr (kDocs) {
      // The key rows the query sees, its document's up to its position
      // (found for each head: held across the heads they cost registers).
      const size_t row0 = size_t(b) * s.Tk * kv_ld + size_t(g) * dh;
      const size_t lo = row0 + doc_first_key(keys, b, s.Tk, nk, keys.doc_start[size_t(b) * s.Tq + i]) * kv_ld;
      const size_t hi = row0 + visible_prefix(keys.key_end, b, s.Tk, nk, p) * kv_ld;
      for (size_t row = lo; row < hi; row += kv_ld) grad(k + row, v + row);
    } else {
      for (int j = 0; j < nk && end_of(keys, b, s.Tk, j) <= p; ++j) {
        const size_t row = (size_t(b) * s.Tk + j) * kv_ld + size_t(g) * dh;
        grad(k + row, v + row);
      }
    }
    if (self) {
      const PDs r = grad(raw_k + raw_row, raw_v + raw_row);
#pragma unroll
      for (int e = 0; e < kMaxPerLane; ++e) {
        drk[e] += r.ds * qr[e];  // qr holds q * scale
        drv[e] += r.p * dor[e];
      }
    }
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < dh) st(dq + qoff + d, acc[e] * scale);
    }
  }
  if (draw_k) {
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < dh) {
        st(draw_k + raw_row + d, self ? drk[e] : 0.f);
        st(draw_v + raw_row + d, self ? drv[e] : 0.f);
      }
    }
  }
}

// dk, dv: one warp per (b, key row j, KV group g), over the queries that see
// the row (positions >= its key_end, within its document) and the group's heads.
template <class A>
__global__ void k_attention_bwd_dkv(AttnShape s, AttnKeys keys, const A* q, const A* k, const A* v, const float* lse,
                                    const float* D, const A* dout, A* dk, A* dv) {
  const int warp = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (warp >= s.B * s.Tk * s.Hkv) return;
  const int g = warp % s.Hkv, j = (warp / s.Hkv) % s.Tk, b = warp / (s.Hkv * s.Tk);
  const int dh = s.dh;
  const float scale = rsqrtf(float(dh));
  const size_t q_ld = size_t(s.H) * dh, kv_ld = size_t(s.Hkv) * dh;
  const size_t row = (size_t(b) * s.Tk + j) * kv_ld + size_t(g) * dh;
  float kr[kMaxPerLane], vr[kMaxPerLane], ak[kMaxPerLane], av[kMaxPerLane];
  load_row(kr, k + row, dh, lane, 1.f);
  load_row(vr, v + row, dh, lane, 1.f);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) ak[e] = av[e] = 0.f;
  if (j < n_keys_of(keys, b, s.Tk)) {
    const int e = end_of(keys, b, s.Tk, j);
    const int i0 = max(0, e - s.q_pos0), i1 = doc_query_end(keys.doc_start, b, s.Tq, e);
    for (int h = g; h < s.H; h += s.Hkv)
      for (int i = i0; i < i1; ++i) {
        const size_t qoff = (size_t(b) * s.Tq + i) * q_ld + size_t(h) * dh;
        const float L = lse[(size_t(b) * s.H + h) * s.Tq + i], Dv = D[(size_t(b) * s.H + h) * s.Tq + i];
        float sc = 0.f, dp = 0.f;
#pragma unroll
        for (int e = 0; e < kMaxPerLane; ++e) {
          const int d = lane + 32 * e;
          if (d < dh) {
            sc += kr[e] * ld(q + qoff + d);
            dp += vr[e] * ld(dout + qoff + d);
          }
        }
        sc = warp_sum(sc) * scale;
        dp = warp_sum(dp);
        const float pj = __expf(sc - L);
        const float ds = pj * (dp - Dv) * scale;
#pragma unroll
        for (int e = 0; e < kMaxPerLane; ++e) {
          const int d = lane + 32 * e;
          if (d < dh) {
            ak[e] += ds * ld(q + qoff + d);
            av[e] += pj * ld(dout + qoff + d);
          }
        }
      }
  }
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < dh) {
      st(dk + row + d, ak[e]);
      st(dv + row + d, av[e]);
    }
  }
}

int blocks_of_warps(size_t warps) { return int((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }

void check_shape(const AttnShape& s, const char* op) {
  WIOLA_CHECK(s.dh >= 1 && s.dh <= 32 * kMaxPerLane, "cuda ", op, ": head dim ", s.dh, " outside 1..",
              32 * kMaxPerLane);
  WIOLA_CHECK(s.Hkv >= 1 && s.H % s.Hkv == 0, "cuda ", op, ": H = ", s.H, " is not a multiple of H_kv = ", s.Hkv);
}

}  // namespace

void attention_fwd(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                   Ptr o, Ptr lse) {
  check_shape(s, "attention_fwd");
  WIOLA_CHECK(!keys.self_open || (raw_k && raw_v), "attention: self_open given without raw keys/values");
  if (attention_fwd_tc(c, s, keys, q, k, v, raw_k, raw_v, o, lse)) {
    after_launch("attention_fwd (tensor cores)");
    return;
  }
  dispatch(q.dtype(), "attention_fwd", [&](auto e) {
    using A = decltype(e);
    k_attention_fwd<A><<<blocks_of_warps(size_t(s.B) * s.H * s.Tq), 32 * kWarpsPerBlock, 0, c.s>>>(
        s, keys, dev<A>(q), dev<A>(k), dev<A>(v), dev<A>(raw_k), dev<A>(raw_v), dev<A>(o), dev<float>(lse));
  });
  after_launch("attention_fwd");
}

void attention_bwd(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                   CPtr o, CPtr lse, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v) {
  check_shape(s, "attention_bwd");
  WIOLA_CHECK(!keys.self_open || (draw_k && draw_v), "attention_bwd: self_open given without draw_k/draw_v");
  DeviceTemp D(c.mem, size_t(s.B) * s.H * s.Tq * sizeof(float), "attention_bwd row terms");
  const int threads = 32 * kWarpsPerBlock;
  dispatch(q.dtype(), "attention_bwd", [&](auto e) {
    using A = decltype(e);
    k_attention_bwd_rowdot<A>
        <<<blocks_of_warps(size_t(s.B) * s.H * s.Tq), threads, 0, c.s>>>(s, dev<A>(o), dev<A>(dout), D.as<float>());
  });
  if (attention_bwd_tc(c, s, keys, q, k, v, raw_k, raw_v, lse, D.as<float>(), dout, dq, dk, dv, draw_k, draw_v)) {
    after_launch("attention_bwd (tensor cores)");
    return;
  }
  dispatch(q.dtype(), "attention_bwd", [&](auto e) {
    using A = decltype(e);
    auto dq_kernel = keys.doc_start ? k_attention_bwd_dq<A, true> : k_attention_bwd_dq<A, false>;
    dq_kernel<<<blocks_of_warps(size_t(s.B) * s.Tq * s.Hkv), threads, 0, c.s>>>(
        s, keys, dev<A>(q), dev<A>(k), dev<A>(v), dev<A>(raw_k), dev<A>(raw_v), dev<float>(lse), D.as<float>(),
        dev<A>(dout), dev<A>(dq), dev<A>(draw_k), dev<A>(draw_v));
    k_attention_bwd_dkv<A><<<blocks_of_warps(size_t(s.B) * s.Tk * s.Hkv), threads, 0, c.s>>>(
        s, keys, dev<A>(q), dev<A>(k), dev<A>(v), dev<float>(lse), D.as<float>(), dev<A>(dout), dev<A>(dk), dev<A>(dv));
  });
  after_launch("attention_bwd");
}

}  // namespace wiola::cuda
