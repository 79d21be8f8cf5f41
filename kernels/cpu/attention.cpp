// CPU self-attention kernels: see attention.h for the design.
#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "util/error.h"

namespace wiola::cpu {
namespace {

constexpr int BQ = kAttnTileQ;
constexpr int BK = kAttnTileK;

// exp(x) for float written so that loops over it vectorise (relative error
// ~2e-7 = a few ulp); 0 for x < -87 (including -inf). Double uses std::exp.
inline float exp_vec(float x) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
  // n = round(x / ln2) by the 1.5*2^23 trick (exact for |n| < 2^22).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : p * two_n;
}

template <class T>
inline T texp(T x) {
  if constexpr (sizeof(T) == 4)
    return exp_vec(x);
  else
    return std::exp(x);
}

// 64-byte aligned, zero-initialised per-thread scratch.
template <class T>
class Scratch {
 public:
  explicit Scratch(size_t n) {
    const size_t bytes = std::max<size_t>(64, (n * sizeof(T) + 63) / 64 * 64);
    p_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!p_) throw std::bad_alloc();
    std::memset(p_, 0, bytes);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p_); }
  T* get() const { return p_; }

 private:
  T* p_;
};

// Rows per register block of the tile products.
template <class T>
constexpr int lanes() { return 64 / int(sizeof(T)); }
template <class T>
constexpr int rb_scores() { return std::clamp(16 * lanes<T>() / BK, 1, 4); }
template <class T, int DH>
constexpr int rb_rows() {
  return DH > 0 ? std::clamp(16 * lanes<T>() / DH, 1, 4) : 1;
}

// 64-byte SIMD vectors (GCC/Clang vector extension) so the register blocks
// of the tile products stay in registers; W = lanes per vector.
template <class T>
struct Simd {
  typedef T V __attribute__((vector_size(64)));
  static constexpr int W = 64 / int(sizeof(T));
  static V load(const T* p) {
    V x;
    std::memcpy(&x, p, sizeof(V));
    return x;
  }
  static void store(T* p, V x) { std::memcpy(p, &x, sizeof(V)); }
};

// C[r, 0..BK) = sum_d A[r, d] * Bt[d, 0..BK) for R rows; A ld dh, C ld BK.
template <class T, int DH, int R>
inline void abt_block(const T* __restrict A, const T* __restrict Bt,
                      T* __restrict C, int dh_rt) {
  using S = Simd<T>;
  using V = typename S::V;
  constexpr int NV = BK / S::W;
  const int dh = DH > 0 ? DH : dh_rt;
  V acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int d = 0; d < dh; ++d) {
    V b[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) b[v] = S::load(Bt + size_t(d) * BK + v * S::W);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const T a = A[size_t(r) * dh + d];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) S::store(C + size_t(r) * BK + v * S::W, acc[r][v]);
}

// C[nq x BK] = A[nq x dh] * Bt[dh x BK].
template <class T, int DH>
void mm_abt(const T* A, const T* Bt, T* C, int nq, int dh_rt) {
  const int dh = DH > 0 ? DH : dh_rt;
  constexpr int R = rb_scores<T>();
  int i = 0;
  for (; i + R <= nq; i += R)
    abt_block<T, DH, R>(A + size_t(i) * dh, Bt, C + size_t(i) * BK, dh_rt);
  for (; i < nq; ++i)
    abt_block<T, DH, 1>(A + size_t(i) * dh, Bt, C + size_t(i) * BK, dh_rt);
}

// For R output rows r: C[r*ldc + 0..dh) += sum_{t<n} cf[r*rs + t*ts] *
// M[t*dh + 0..dh).
template <class T, int DH, int R>
inline void acc_block(const T* __restrict cf, size_t rs, size_t ts, int n,
                      const T* __restrict M, T* __restrict C, size_t ldc,
                      int dh_rt) {
  if constexpr (DH > 0 && DH % Simd<T>::W == 0) {
    using S = Simd<T>;
    using V = typename S::V;
    constexpr int NV = DH / S::W;
    V acc[R][NV];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = S::load(C + r * ldc + v * S::W);
    for (int t = 0; t < n; ++t) {
      V m[NV];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) m[v] = S::load(M + size_t(t) * DH + v * S::W);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const T c = cf[r * rs + t * ts];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[r][v] += c * m[v];
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) S::store(C + r * ldc + v * S::W, acc[r][v]);
  } else {
    const int dh = dh_rt;
    for (int r = 0; r < R; ++r) {
      T* __restrict c_row = C + r * ldc;
      for (int t = 0; t < n; ++t) {
        const T c = cf[r * rs + t * ts];
        const T* __restrict m = M + size_t(t) * dh;
        for (int d = 0; d < dh; ++d) c_row[d] += c * m[d];
      }
    }
  }
}

// C[r, :] += sum_t P[r, t] M[t, :], r < nq, t < kn (P is a BQ x BK tile).
template <class T, int DH>
void mm_pm(const T* P, const T* M, int nq, int kn, T* C, size_t ldc,
           int dh_rt) {
  constexpr int R = rb_rows<T, DH>();
  int r = 0;
  for (; r + R <= nq; r += R)
    acc_block<T, DH, R>(P + size_t(r) * BK, BK, 1, kn, M, C + r * ldc, ldc,
                        dh_rt);
  for (; r < nq; ++r)
    acc_block<T, DH, 1>(P + size_t(r) * BK, BK, 1, kn, M, C + r * ldc, ldc,
                        dh_rt);
}

// C[j, :] += sum_i P[i, j] M[i, :], j < kn, i < nq.
template <class T, int DH>
void mm_ptm(const T* P, const T* M, int nq, int kn, T* C, size_t ldc,
            int dh_rt) {
  constexpr int R = rb_rows<T, DH>();
  int j = 0;
  for (; j + R <= kn; j += R)
    acc_block<T, DH, R>(P + j, 1, BK, nq, M, C + j * ldc, ldc, dh_rt);
  for (; j < kn; ++j)
    acc_block<T, DH, 1>(P + j, 1, BK, nq, M, C + j * ldc, ldc, dh_rt);
}

template <class T>
inline T dot(const T* __restrict a, const T* __restrict b, int n) {
  T acc = T(0);
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// max and sum over x[0..n) with lane-wise partial results, so the loops
// vectorise without -ffast-math (fixed order: deterministic).
template <class T>
inline T row_max(const T* __restrict x, int n) {
  constexpr int W = lanes<T>();
  T acc[W];
  for (int w = 0; w < W; ++w) acc[w] = -std::numeric_limits<T>::infinity();
  int j = 0;
  for (; j + W <= n; j += W)
    for (int w = 0; w < W; ++w) acc[w] = acc[w] < x[j + w] ? x[j + w] : acc[w];
  for (; j < n; ++j) acc[0] = std::max(acc[0], x[j]);
  T m = acc[0];
  for (int w = 1; w < W; ++w) m = std::max(m, acc[w]);
  return m;
}
template <class T>
inline T row_sum(const T* __restrict x, int n) {
  constexpr int W = lanes<T>();
  T acc[W];
  for (int w = 0; w < W; ++w) acc[w] = T(0);
  int j = 0;
  for (; j + W <= n; j += W)
    for (int w = 0; w < W; ++w) acc[w] += x[j + w];
  for (; j < n; ++j) acc[0] += x[j];
  T t = T(0);
  for (int w = 0; w < W; ++w) t += acc[w];
  return t;
}

// Number of key rows visible to the query at position p (a prefix).
inline int visible(const int32_t* key_end_b, int nk, int p) {
  if (!key_end_b) return std::min(p + 1, nk);
  return int(std::upper_bound(key_end_b, key_end_b + nk, p) - key_end_b);
}

inline int n_keys_of(const AttnShape& s, const AttnKeys& keys, int b) {
  return keys.n_keys ? keys.n_keys[b] : s.Tk;
}

void validate(const AttnShape& s, const AttnKeys& keys, bool has_raw) {
  WIOLA_CHECK(s.B >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.q_pos0 >= 0,
              "attention: negative shape (B=", s.B, " Tq=", s.Tq, " Tk=", s.Tk,
              " q_pos0=", s.q_pos0, ")");
  WIOLA_CHECK(s.H > 0 && s.Hkv > 0 && s.H % s.Hkv == 0,
              "attention: H=", s.H, " must be a positive multiple of Hkv=",
              s.Hkv);
  WIOLA_CHECK(s.dh > 0, "attention: head dim dh=", s.dh, " must be positive");
  WIOLA_CHECK(!keys.self_open || has_raw,
              "attention: self_open given without raw keys/values");
  for (int b = 0; b < s.B; ++b) {
    const int nk = n_keys_of(s, keys, b);
    WIOLA_CHECK(nk >= 0 && nk <= s.Tk, "attention: n_keys[", b, "]=", nk,
                " outside [0, Tk=", s.Tk, "]");
    if (keys.key_end) {
      const int32_t* ke = keys.key_end + size_t(b) * s.Tk;
      for (int j = 1; j < nk; ++j)
        WIOLA_CHECK(ke[j - 1] <= ke[j], "attention: key_end of sequence ", b,
                    " not sorted at row ", j);
    }
  }
}

template <class T, int DH>
void fwd_impl(const AttnShape& s, const AttnKeys& keys, const T* q,
              const T* k, const T* v, const T* raw_k, const T* raw_v, T* o,
              T* lse) {
  const int dh = DH > 0 ? DH : s.dh;
  const int B = s.B, Tq = s.Tq, Tk = s.Tk, H = s.H, Hkv = s.Hkv;
  const T scale = T(1) / std::sqrt(T(dh));
  const int n_qt = (Tq + BQ - 1) / BQ;
  const long n_items = long(B) * n_qt * H;
  const size_t q_ld = size_t(H) * dh, kv_ld = size_t(Hkv) * dh;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();

#pragma omp parallel
  {
    Scratch<T> qs_buf(size_t(BQ) * dh), kt_buf(size_t(dh) * BK),
        vp_buf(size_t(BK) * dh), s_buf(size_t(BQ) * BK),
        acc_buf(size_t(BQ) * dh);
    T* Qs = qs_buf.get();
    T* Kt = kt_buf.get();
    T* Vp = vp_buf.get();
    T* S = s_buf.get();
    T* O = acc_buf.get();
    T m[BQ], l[BQ];
    int nvis[BQ];

    // Items ordered (b, query tile descending, h): long tiles first.
#pragma omp for schedule(dynamic, 1)
    for (long item = 0; item < n_items; ++item) {
      const int h = int(item % H);
      const int qt = n_qt - 1 - int((item / H) % n_qt);
      const int b = int(item / (long(H) * n_qt));
      const int g = h % Hkv;
      const int i0 = qt * BQ, nq = std::min(BQ, Tq - i0);
      const int nk = n_keys_of(s, keys, b);
      const int32_t* ke = keys.key_end ? keys.key_end + size_t(b) * Tk : nullptr;

      int kmax = 0;
      for (int r = 0; r < nq; ++r) {
        nvis[r] = visible(ke, nk, s.q_pos0 + i0 + r);
        kmax = std::max(kmax, nvis[r]);
        const T* src = q + (size_t(b) * Tq + i0 + r) * q_ld + size_t(h) * dh;
        for (int d = 0; d < dh; ++d) Qs[size_t(r) * dh + d] = src[d] * scale;
        for (int d = 0; d < dh; ++d) O[size_t(r) * dh + d] = T(0);
        m[r] = kNegInf;
        l[r] = T(0);
      }

      for (int j0 = 0; j0 < kmax; j0 += BK) {
        const int kn = std::min(BK, kmax - j0);
        for (int j = 0; j < kn; ++j) {
          const size_t row = (size_t(b) * Tk + j0 + j) * kv_ld + size_t(g) * dh;
          for (int d = 0; d < dh; ++d) Kt[size_t(d) * BK + j] = k[row + d];
          for (int d = 0; d < dh; ++d) Vp[size_t(j) * dh + d] = v[row + d];
        }
        mm_abt<T, DH>(Qs, Kt, S, nq, dh);
        for (int r = 0; r < nq; ++r) {
          T* srow = S + size_t(r) * BK;
          const int lim = std::clamp(nvis[r] - j0, 0, kn);
          if (lim == 0) {
            for (int j = 0; j < kn; ++j) srow[j] = T(0);
            continue;
          }
          const T m_new = std::max(m[r], row_max(srow, lim));
          const T alpha = std::exp(m[r] - m_new);  // 0 when m[r] = -inf
          for (int j = 0; j < lim; ++j) srow[j] = texp(srow[j] - m_new);
          for (int j = lim; j < kn; ++j) srow[j] = T(0);
          const T sum = row_sum(srow, lim);
          l[r] = l[r] * alpha + sum;
          m[r] = m_new;
          if (alpha != T(1)) {
            T* orow = O + size_t(r) * dh;
            for (int d = 0; d < dh; ++d) orow[d] *= alpha;
          }
        }
        mm_pm<T, DH>(S, Vp, nq, kn, O, size_t(dh), dh);
      }

      for (int r = 0; r < nq; ++r) {
        const int i = i0 + r;
        T* orow = O + size_t(r) * dh;
        if (keys.self_open && keys.self_open[size_t(b) * Tq + i]) {
          const size_t row = (size_t(b) * Tq + i) * kv_ld + size_t(g) * dh;
          const T sc = dot(Qs + size_t(r) * dh, raw_k + row, dh);
          const T m_new = std::max(m[r], sc);
          const T alpha = std::exp(m[r] - m_new);
          const T p = std::exp(sc - m_new);
          for (int d = 0; d < dh; ++d)
            orow[d] = orow[d] * alpha + p * raw_v[row + d];
          l[r] = l[r] * alpha + p;
          m[r] = m_new;
        }
        T* dst = o + (size_t(b) * Tq + i) * q_ld + size_t(h) * dh;
        T& lse_i = lse[(size_t(b) * H + h) * Tq + i];
        if (l[r] > T(0)) {
          const T inv = T(1) / l[r];
          for (int d = 0; d < dh; ++d) dst[d] = orow[d] * inv;
          lse_i = m[r] + std::log(l[r]);
        } else {
          for (int d = 0; d < dh; ++d) dst[d] = T(0);
          lse_i = kNegInf;
        }
      }
    }
  }
}

template <class T, int DH>
void bwd_impl(const AttnShape& s, const AttnKeys& keys, const T* q,
              const T* k, const T* v, const T* raw_k, const T* raw_v,
              const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv,
              T* draw_k, T* draw_v) {
  const int dh = DH > 0 ? DH : s.dh;
  const int B = s.B, Tq = s.Tq, Tk = s.Tk, H = s.H, Hkv = s.Hkv;
  const T scale = T(1) / std::sqrt(T(dh));
  const int n_qt = (Tq + BQ - 1) / BQ;
  const long n_items = long(B) * Hkv;
  const size_t q_ld = size_t(H) * dh, kv_ld = size_t(Hkv) * dh;

#pragma omp parallel
  {
    Scratch<T> qs_buf(size_t(BQ) * dh), do_buf(size_t(BQ) * dh),
        dq_buf(size_t(BQ) * dh), kt_buf(size_t(dh) * BK),
        kp_buf(size_t(BK) * dh), vt_buf(size_t(dh) * BK),
        p_buf(size_t(BQ) * BK), ds_buf(size_t(BQ) * BK);
    T* Qs = qs_buf.get();
    T* dO = do_buf.get();
    T* dQ = dq_buf.get();
    T* Kt = kt_buf.get();
    T* Kp = kp_buf.get();
    T* Vt = vt_buf.get();
    T* P = p_buf.get();
    T* dS = ds_buf.get();
    T Dr[BQ], L[BQ];
    int nvis[BQ];

#pragma omp for schedule(dynamic, 1)
    for (long item = 0; item < n_items; ++item) {
      const int b = int(item / Hkv), g = int(item % Hkv);
      const int nk = n_keys_of(s, keys, b);
      const int32_t* ke = keys.key_end ? keys.key_end + size_t(b) * Tk : nullptr;

      // This thread owns the rows (b, *, g) of dk, dv, draw_k, draw_v.
      for (int j = 0; j < Tk; ++j) {
        const size_t row = (size_t(b) * Tk + j) * kv_ld + size_t(g) * dh;
        std::fill_n(dk + row, dh, T(0));
        std::fill_n(dv + row, dh, T(0));
      }
      if (draw_k && draw_v)
        for (int i = 0; i < Tq; ++i) {
          const size_t row = (size_t(b) * Tq + i) * kv_ld + size_t(g) * dh;
          std::fill_n(draw_k + row, dh, T(0));
          std::fill_n(draw_v + row, dh, T(0));
        }

      for (int h = g; h < H; h += Hkv) {
        for (int qt = 0; qt < n_qt; ++qt) {
          const int i0 = qt * BQ, nq = std::min(BQ, Tq - i0);
          int kmax = 0;
          for (int r = 0; r < nq; ++r) {
            const size_t qrow = (size_t(b) * Tq + i0 + r) * q_ld + size_t(h) * dh;
            nvis[r] = visible(ke, nk, s.q_pos0 + i0 + r);
            kmax = std::max(kmax, nvis[r]);
            double D = 0;
            for (int d = 0; d < dh; ++d) {
              Qs[size_t(r) * dh + d] = q[qrow + d] * scale;
              dO[size_t(r) * dh + d] = dout[qrow + d];
              dQ[size_t(r) * dh + d] = T(0);
              D += double(dout[qrow + d]) * double(o[qrow + d]);
            }
            Dr[r] = T(D);
            L[r] = lse[(size_t(b) * H + h) * Tq + i0 + r];
          }

          for (int j0 = 0; j0 < kmax; j0 += BK) {
            const int kn = std::min(BK, kmax - j0);
            for (int j = 0; j < kn; ++j) {
              const size_t row = (size_t(b) * Tk + j0 + j) * kv_ld + size_t(g) * dh;
              for (int d = 0; d < dh; ++d) {
                Kt[size_t(d) * BK + j] = k[row + d];
                Kp[size_t(j) * dh + d] = k[row + d];
                Vt[size_t(d) * BK + j] = v[row + d];
              }
            }
            mm_abt<T, DH>(Qs, Kt, P, nq, dh);      // scores
            mm_abt<T, DH>(dO, Vt, dS, nq, dh);     // dP = dO V^T
            for (int r = 0; r < nq; ++r) {
              T* prow = P + size_t(r) * BK;
              T* dsrow = dS + size_t(r) * BK;
              int lim = std::clamp(nvis[r] - j0, 0, kn);
              if (!(L[r] > -std::numeric_limits<T>::infinity())) lim = 0;
              const T Lr = L[r], D = Dr[r];
              for (int j = 0; j < lim; ++j) {
                const T p = texp(prow[j] - Lr);
                prow[j] = p;
                dsrow[j] = p * (dsrow[j] - D);
              }
              for (int j = lim; j < kn; ++j) prow[j] = dsrow[j] = T(0);
            }
            const size_t kvrow0 = (size_t(b) * Tk + j0) * kv_ld + size_t(g) * dh;
            mm_ptm<T, DH>(P, dO, nq, kn, dv + kvrow0, kv_ld, dh);   // dV += P^T dO
            mm_ptm<T, DH>(dS, Qs, nq, kn, dk + kvrow0, kv_ld, dh);  // dK += dS^T Qs
            mm_pm<T, DH>(dS, Kp, nq, kn, dQ, size_t(dh), dh);       // dQ += dS K
          }

          for (int r = 0; r < nq; ++r) {
            const int i = i0 + r;
            T* dqr = dQ + size_t(r) * dh;
            if (keys.self_open && keys.self_open[size_t(b) * Tq + i] &&
                L[r] > -std::numeric_limits<T>::infinity()) {
              const size_t row = (size_t(b) * Tq + i) * kv_ld + size_t(g) * dh;
              const T* qsr = Qs + size_t(r) * dh;
              const T* dor = dO + size_t(r) * dh;
              const T p = std::exp(dot(qsr, raw_k + row, dh) - L[r]);
              const T ds = p * (dot(dor, raw_v + row, dh) - Dr[r]);
              for (int d = 0; d < dh; ++d) {
                draw_v[row + d] += p * dor[d];
                draw_k[row + d] += ds * qsr[d];
                dqr[d] += ds * raw_k[row + d];
              }
            }
            T* dst = dq + (size_t(b) * Tq + i) * q_ld + size_t(h) * dh;
            for (int d = 0; d < dh; ++d) dst[d] = dqr[d] * scale;
          }
        }
      }
    }
  }
}

}  // namespace

template <class T>
void attention_fwd(const AttnShape& s, const AttnKeys& keys, const T* q,
                   const T* k, const T* v, const T* raw_k, const T* raw_v,
                   T* o, T* lse) {
  validate(s, keys, raw_k && raw_v);
  if (s.B == 0 || s.Tq == 0) return;
  switch (s.dh) {
    case 32: fwd_impl<T, 32>(s, keys, q, k, v, raw_k, raw_v, o, lse); break;
    case 64: fwd_impl<T, 64>(s, keys, q, k, v, raw_k, raw_v, o, lse); break;
    case 128: fwd_impl<T, 128>(s, keys, q, k, v, raw_k, raw_v, o, lse); break;
    default: fwd_impl<T, 0>(s, keys, q, k, v, raw_k, raw_v, o, lse); break;
  }
}

template <class T>
void attention_bwd(const AttnShape& s, const AttnKeys& keys, const T* q,
                   const T* k, const T* v, const T* raw_k, const T* raw_v,
                   const T* o, const T* lse, const T* dout, T* dq, T* dk,
                   T* dv, T* draw_k, T* draw_v) {
  validate(s, keys, raw_k && raw_v);
  WIOLA_CHECK(!keys.self_open || (draw_k && draw_v),
              "attention_bwd: self_open given without draw_k/draw_v");
  if (s.B == 0) return;
#define WIOLA_ATTN_BWD(DH)                                                  \
  bwd_impl<T, DH>(s, keys, q, k, v, raw_k, raw_v, o, lse, dout, dq, dk, dv, \
                  draw_k, draw_v)
  switch (s.dh) {
    case 32: WIOLA_ATTN_BWD(32); break;
    case 64: WIOLA_ATTN_BWD(64); break;
    case 128: WIOLA_ATTN_BWD(128); break;
    default: WIOLA_ATTN_BWD(0); break;
  }
#undef WIOLA_ATTN_BWD
}

template void attention_fwd<float>(const AttnShape&, const AttnKeys&,
                                   const float*, const float*, const float*,
                                   const float*, const float*, float*, float*);
template void attention_fwd<double>(const AttnShape&, const AttnKeys&,
                                    const double*, const double*,
                                    const double*, const double*,
                                    const double*, double*, double*);
template void attention_bwd<float>(const AttnShape&, const AttnKeys&,
                                   const float*, const float*, const float*,
                                   const float*, const float*, const float*,
                                   const float*, const float*, float*, float*,
                                   float*, float*, float*);
template void attention_bwd<double>(const AttnShape&, const AttnKeys&,
                                    const double*, const double*,
                                    const double*, const double*,
                                    const double*, const double*,
                                    const double*, const double*, double*,
                                    double*, double*, double*, double*);

}  // namespace wiola::cpu
