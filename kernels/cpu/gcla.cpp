// GCLA pieces (docs/model.md §2 "Cross-layer summaries", "GCLA"): prefix-mean
// summaries, the context sub-attention, the self/context blend and the
// sigmoid output gate. The float blend and gate run on Highway, dispatched at
// run time; the rest (and double) are scalar templates.
#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gcla.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace wiola::cpu::HWY_NAMESPACE {

void BlendFwdF(const float* o_self, const float* o_ctx, float keep, float beta, size_t n, float* out) {
  const DF d;
  const VF vk = hn::Set(d, keep), vb = hn::Set(d, beta);
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    Out(d, hn::Add(hn::Mul(vk, In(d, o_self + i, t)), hn::Mul(vb, In(d, o_ctx + i, t))), out + i, t);
  });
}

// Writes d_self, d_ctx; returns sum dout (o_ctx - o_self) in double.
double BlendBwdF(const float* o_self, const float* o_ctx, float keep, float beta, const float* dout, size_t n,
                 float* d_self, float* d_ctx) {
  const DF d;
  const VF vk = hn::Set(d, keep), vb = hn::Set(d, beta);
  VD lo = hn::Zero(DD()), hi = lo;
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    const VF g = In(d, dout + i, t), a = In(d, o_self + i, t), c = In(d, o_ctx + i, t);
    Out(d, hn::Mul(vk, g), d_self + i, t);
    Out(d, hn::Mul(vb, g), d_ctx + i, t);
    lo = hn::MulAdd(PromoteLo(g), hn::Sub(PromoteLo(c), PromoteLo(a)), lo);
    hi = hn::MulAdd(PromoteHi(g), hn::Sub(PromoteHi(c), PromoteHi(a)), hi);
  });
  return SumLanes(hn::Add(lo, hi));
}

void SigmoidGateFwdF(const float* pre, const float* x, size_t n, float* out) {
  const DF d;
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    Out(d, hn::Mul(Sigmoid(d, In(d, pre + i, t)), In(d, x + i, t)), out + i, t);
  });
}

void SigmoidGateBwdF(const float* pre, const float* x, const float* dout, size_t n, float* dpre, float* dx) {
  const DF d;
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    VF s, c;
    Sigmoid2(d, In(d, pre + i, t), s, c);
    const VF g = In(d, dout + i, t);
    Out(d, hn::Mul(hn::Mul(hn::Mul(g, In(d, x + i, t)), s), c), dpre + i, t);
    Out(d, hn::Mul(g, s), dx + i, t);
  });
}

}  // namespace wiola::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd_dispatch.h"
#include "util/error.h"

namespace wiola::cpu {

HWY_EXPORT(BlendFwdF);
HWY_EXPORT(BlendBwdF);
HWY_EXPORT(SigmoidGateFwdF);
HWY_EXPORT(SigmoidGateBwdF);

namespace {

// Prefix sums run per (sequence, block of kCols columns), in double.
constexpr int kCols = 256;
// Context rows per token handled by the context attention (Lambda is 2).
constexpr int kMaxCtx = 64;

}  // namespace

// out[b,t] = mean_{u<=t} x[b,u]; with documents over u in [doc_start[b,t], t]
// (the sums restart at each document's first row).
template <class T>
void prefix_mean_fwd(const T* x, int B, int Tn, int d, const int32_t* doc_start, T* out) {
  const int nb = (d + kCols - 1) / kCols;
  const long tasks = long(B) * nb;
#pragma omp parallel for schedule(static) if (size_t(B) * Tn * d >= kParallelMin)
  for (long task = 0; task < tasks; ++task) {
    const size_t b = size_t(task / nb);
    const int c0 = int(task % nb) * kCols, c1 = std::min(d, c0 + kCols);
    double acc[kCols] = {};
    const int32_t* ds = doc_start ? doc_start + b * size_t(Tn) : nullptr;
    for (int t = 0; t < Tn; ++t) {
      const size_t r = (b * Tn + t) * d;
      if (ds && ds[t] == t) std::fill_n(acc, kCols, 0.0);
      const double inv = 1.0 / double(t + 1 - (ds ? ds[t] : 0));
#pragma omp simd
      for (int c = c0; c < c1; ++c) {
        acc[c - c0] += double(x[r + c]);
        out[r + c] = T(acc[c - c0] * inv);
      }
    }
  }
}

// dx[b,u] += sum_{t>=u} dout[b,t] / (t+1): a reverse running sum; with
// documents over t in u's document, divided by t - doc_start + 1 (the sum
// restarts below each document's first row).
template <class T>
void prefix_mean_bwd(const T* dout, int B, int Tn, int d, const int32_t* doc_start, T* dx) {
  const int nb = (d + kCols - 1) / kCols;
  const long tasks = long(B) * nb;
#pragma omp parallel for schedule(static) if (size_t(B) * Tn * d >= kParallelMin)
  for (long task = 0; task < tasks; ++task) {
    const size_t b = size_t(task / nb);
    const int c0 = int(task % nb) * kCols, c1 = std::min(d, c0 + kCols);
    double acc[kCols] = {};
    const int32_t* ds = doc_start ? doc_start + b * size_t(Tn) : nullptr;
    for (int t = Tn - 1; t >= 0; --t) {
      const size_t r = (b * Tn + t) * d;
      const double inv = 1.0 / double(t + 1 - (ds ? ds[t] : 0));
#pragma omp simd
      for (int c = c0; c < c1; ++c) {
        acc[c - c0] += double(dout[r + c]) * inv;
        dx[r + c] += T(acc[c - c0]);
      }
      if (ds && ds[t] == t) std::fill_n(acc, kCols, 0.0);
    }
  }
}

// Cached decoding (same semantics as the Ops default, without host copies).
template <class T>
void prefix_mean_carry_fwd(const T* x, int B, int Tn, int d, int pos0, T* carry, T* out) {
  const int nb = (d + kCols - 1) / kCols;
  const long tasks = long(B) * nb;
#pragma omp parallel for schedule(static) if (size_t(B) * Tn * d >= kParallelMin)
  for (long task = 0; task < tasks; ++task) {
    const size_t b = size_t(task / nb);
    const int c0 = int(task % nb) * kCols, c1 = std::min(d, c0 + kCols);
    double acc[kCols];
    for (int c = c0; c < c1; ++c) acc[c - c0] = double(carry[b * d + c]);
    for (int t = 0; t < Tn; ++t) {
      const size_t r = (b * Tn + t) * d;
      const double inv = 1.0 / double(pos0 + t + 1);
      for (int c = c0; c < c1; ++c) {
        acc[c - c0] += double(x[r + c]);
        out[r + c] = T(acc[c - c0] * inv);
      }
    }
    for (int c = c0; c < c1; ++c) carry[b * d + c] = T(acc[c - c0]);
  }
}

template <class T>
static T dot(const T* a, const T* b, int n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Per token n and head h (group g = h % Hkv): p = softmax_i(q.kc_i/sqrt(dh)),
// out = sum_i p_i vc_i. Context row (n, i) of kc and vc starts at (n nc + i)
// ldkv.
template <class T>
void ctx_attention_fwd(const T* q, const T* kc, const T* vc, int N, int nc, int H, int Hkv, int dh, int ldkv, T* out,
                       T* probs) {
  WIOLA_CHECK(nc >= 1 && nc <= kMaxCtx, "ctx_attention: nc = ", nc, " outside [1, ", kMaxCtx, "]");
  WIOLA_CHECK(ldkv >= Hkv * dh, "ctx_attention: row stride ", ldkv, " < Hkv dh = ", Hkv * dh);
  const T sc = T(1.0 / std::sqrt(double(dh)));
#pragma omp parallel for schedule(static) if (size_t(N) * H * nc * dh >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      const int g = h % Hkv;
      const T* qh = q + (size_t(n) * H + h) * dh;
      T* p = probs + (size_t(n) * H + h) * nc;
      T m = -std::numeric_limits<T>::infinity();
      for (int i = 0; i < nc; ++i) {
        p[i] = sc * dot(qh, kc + (size_t(n) * nc + i) * ldkv + size_t(g) * dh, dh);
        m = std::max(m, p[i]);
      }
      T z = 0;
      for (int i = 0; i < nc; ++i) {
        p[i] = std::exp(p[i] - m);
        z += p[i];
      }
      for (int i = 0; i < nc; ++i) p[i] /= z;
      T* o = out + (size_t(n) * H + h) * dh;
      for (int c = 0; c < dh; ++c) o[c] = T(0);
      for (int i = 0; i < nc; ++i) {
        const T* v = vc + (size_t(n) * nc + i) * ldkv + size_t(g) * dh;
        const T pi = p[i];
#pragma omp simd
        for (int c = 0; c < dh; ++c) o[c] += pi * v[c];
      }
    }
  }
}

// dp_i = dout.vc_i, ds_i = p_i (dp_i - sum_j p_j dp_j);
// dq += sc sum_i ds_i kc_i; dkc_i = sc sum_h ds_i q_h; dvc_i = sum_h p_i dout_h.
template <class T>
void ctx_attention_bwd(const T* q, const T* kc, const T* vc, const T* probs, const T* dout, int N, int nc, int H,
                       int Hkv, int dh, int ldkv, T* dq, T* dkc, T* dvc) {
  WIOLA_CHECK(nc >= 1 && nc <= kMaxCtx, "ctx_attention: nc = ", nc, " outside [1, ", kMaxCtx, "]");
  WIOLA_CHECK(ldkv >= Hkv * dh, "ctx_attention: row stride ", ldkv, " < Hkv dh = ", Hkv * dh);
  const T sc = T(1.0 / std::sqrt(double(dh)));
  const size_t row = size_t(Hkv) * dh;
#pragma omp parallel for schedule(static) if (size_t(N) * H * nc * dh >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < nc; ++i) {
      const size_t r0 = (size_t(n) * nc + i) * ldkv;
      for (size_t c = 0; c < row; ++c) {
        dkc[r0 + c] = T(0);
        dvc[r0 + c] = T(0);
      }
    }
    for (int h = 0; h < H; ++h) {
      const int g = h % Hkv;
      const size_t qo = (size_t(n) * H + h) * dh;
      const T* p = probs + (size_t(n) * H + h) * nc;
      T ds[kMaxCtx];
      T pdp = 0;
      for (int i = 0; i < nc; ++i) {
        ds[i] = dot(dout + qo, vc + (size_t(n) * nc + i) * ldkv + size_t(g) * dh, dh);
        pdp += p[i] * ds[i];
      }
      for (int i = 0; i < nc; ++i) ds[i] = p[i] * (ds[i] - pdp);
      for (int i = 0; i < nc; ++i) {
        const size_t ko = (size_t(n) * nc + i) * ldkv + size_t(g) * dh;
        const T a = sc * ds[i], pi = p[i];
#pragma omp simd
        for (int c = 0; c < dh; ++c) {
          dq[qo + c] += a * kc[ko + c];
          dkc[ko + c] += a * q[qo + c];
          dvc[ko + c] += pi * dout[qo + c];
        }
      }
    }
  }
}

template <class T>
void blend_fwd(const T* o_self, const T* o_ctx, double phi, size_t n, T* out) {
  const T beta = T(1.0 / (1.0 + std::exp(-phi)));
  const T keep = T(1) - beta;
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = keep * o_self[i] + beta * o_ctx[i];
}
template <>
void blend_fwd<float>(const float* o_self, const float* o_ctx, double phi, size_t n, float* out) {
  const float beta = float(1.0 / (1.0 + std::exp(-phi)));
  const float keep = 1.0f - beta;
  const auto fn = WIOLA_DISPATCH(BlendFwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(o_self + i0, o_ctx + i0, keep, beta, i1 - i0, out + i0); });
}

// dL/dphi = beta (1 - beta) sum dout (o_ctx - o_self), a chunked reduction.
template <class T>
double blend_bwd(const T* o_self, const T* o_ctx, double phi, const T* dout, size_t n, T* d_self, T* d_ctx) {
  const double bd = 1.0 / (1.0 + std::exp(-phi));
  const T beta = T(bd), keep = T(1) - beta;
  const double s = chunked_sum(n, [=](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      d_self[i] = keep * dout[i];
      d_ctx[i] = beta * dout[i];
    }
    return lane_sum(i0, i1, [=](size_t i) { return double(dout[i]) * (double(o_ctx[i]) - double(o_self[i])); });
  });
  return s * bd * (1.0 - bd);
}
template <>
double blend_bwd<float>(const float* o_self, const float* o_ctx, double phi, const float* dout, size_t n, float* d_self,
                        float* d_ctx) {
  const double bd = 1.0 / (1.0 + std::exp(-phi));
  const float beta = float(bd), keep = 1.0f - beta;
  const auto fn = WIOLA_DISPATCH(BlendBwdF);
  const double s = chunked_sum(n, [&](size_t i0, size_t i1) {
    return fn(o_self + i0, o_ctx + i0, keep, beta, dout + i0, i1 - i0, d_self + i0, d_ctx + i0);
  });
  return s * bd * (1.0 - bd);
}

// out = sigmoid(pre) * x
template <class T>
void sigmoid_gate_fwd(const T* pre, const T* x, size_t n, T* out) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = sigmoid(pre[i]) * x[i];
}
template <>
void sigmoid_gate_fwd<float>(const float* pre, const float* x, size_t n, float* out) {
  const auto fn = WIOLA_DISPATCH(SigmoidGateFwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(pre + i0, x + i0, i1 - i0, out + i0); });
}

template <class T>
void sigmoid_gate_bwd(const T* pre, const T* x, const T* dout, size_t n, T* dpre, T* dx) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    T s, c;
    sigmoid2(pre[i], s, c);
    dpre[i] = dout[i] * x[i] * s * c;
    dx[i] = dout[i] * s;
  }
}
template <>
void sigmoid_gate_bwd<float>(const float* pre, const float* x, const float* dout, size_t n, float* dpre, float* dx) {
  const auto fn = WIOLA_DISPATCH(SigmoidGateBwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(pre + i0, x + i0, dout + i0, i1 - i0, dpre + i0, dx + i0); });
}

#define WIOLA_INST(T) \
  template void prefix_mean_fwd<T>(const T*, int, int, int, const int32_t*, T*); \
  template void prefix_mean_bwd<T>(const T*, int, int, int, const int32_t*, T*); \
  template void prefix_mean_carry_fwd<T>(const T*, int, int, int, int, T*, T*); \
  template void ctx_attention_fwd<T>(const T*, const T*, const T*, int, int, int, int, int, int, T*, T*); \
  template void ctx_attention_bwd<T>(const T*, const T*, const T*, const T*, const T*, int, int, int, int, int, int, \
                                     T*, T*, T*);
WIOLA_INST(float)
WIOLA_INST(double)
#undef WIOLA_INST
template void blend_fwd<double>(const double*, const double*, double, size_t, double*);
template double blend_bwd<double>(const double*, const double*, double, const double*, size_t, double*, double*);
template void sigmoid_gate_fwd<double>(const double*, const double*, size_t, double*);
template void sigmoid_gate_bwd<double>(const double*, const double*, const double*, size_t, double*, double*);

}  // namespace wiola::cpu
#endif  // HWY_ONCE
