// SRPE (docs/model.md §2): rotate-half pairs (j, j + dh/2) of every head by the
// per-position (c, s) of the table; the inverse uses (c, -s) (the transpose,
// = the backward pass). The rotation fused with the split of the fused
// Q|K|V|gate projection output (srpe_split_fwd) and with the join of its
// gradient (srpe_split_bwd) runs the same per-row code as srpe_apply.
#include <cstring>

#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"
#include "util/error.h"

namespace wiola::cpu {
namespace {

// dst = the rotation of the nh heads of one row at src (src may be dst), by
// the row's table entries tab[dh/2, 2]. Not inlined: srpe_apply and the
// fused split execute these very instructions, so they give the same bits
// whatever the compiler contracts or vectorises.
template <class T>
[[gnu::noinline]] void rotate_row(const T* src, T* dst, int nh, int dh, const T* tab, bool inverse) {
  const int half = dh / 2;
  const T sign = inverse ? T(-1) : T(1);
  for (int h = 0; h < nh; ++h) {
    const T* lo = src + size_t(h) * size_t(dh);
    const T* hi = lo + half;
    T* out_lo = dst + size_t(h) * size_t(dh);
    T* out_hi = out_lo + half;
#pragma omp simd
    for (int j = 0; j < half; ++j) {
      const T c = tab[2 * j], s = sign * tab[2 * j + 1];
      const T a = lo[j], b = hi[j];
      out_lo[j] = a * c - b * s;
      out_hi[j] = a * s + b * c;
    }
  }
}

// SRPE position of flat row r = b Tn + t: t, or t - doc_start[r] with
// documents (each document's positions start at 0, docs/model.md §2).
inline long position(long r, int Tn, const int32_t* doc_start) { return doc_start ? r % Tn - doc_start[r] : r % Tn; }

}  // namespace

template <class T>
void srpe_apply(T* x, int B, int Tn, int nh, int dh, const T* table, bool inverse) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_apply: head dim ", dh, " is odd");
  const long rows = long(B) * Tn;
  const size_t w = size_t(nh) * size_t(dh);
#pragma omp parallel for schedule(static) if (size_t(rows) * w >= kParallelMin)
  for (long r = 0; r < rows; ++r) {
    T* row = x + size_t(r) * w;
    rotate_row(row, row, nh, dh, table + size_t(r % Tn) * size_t(dh), inverse);
  }
}

template <class T>
void srpe_split_fwd(const T* proj, int B, int Tn, int H, int Hkv, int dh, const T* table, const int32_t* doc_start,
                    T* q, T* k, T* v, T* gate) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_split_fwd: head dim ", dh, " is odd");
  const long rows = long(B) * Tn;
  const size_t hd = size_t(H) * size_t(dh), kvd = size_t(Hkv) * size_t(dh), width = 2 * hd + 2 * kvd;
#pragma omp parallel for schedule(static) if (size_t(rows) * width >= kParallelMin)
  for (long r = 0; r < rows; ++r) {
    const T* src = proj + size_t(r) * width;
    const T* tab = table + size_t(position(r, Tn, doc_start)) * size_t(dh);
    rotate_row(src, q + size_t(r) * hd, H, dh, tab, false);
    rotate_row(src + hd, k + size_t(r) * kvd, Hkv, dh, tab, false);
    std::memcpy(v + size_t(r) * kvd, src + hd + kvd, kvd * sizeof(T));
    std::memcpy(gate + size_t(r) * hd, src + hd + 2 * kvd, hd * sizeof(T));
  }
}

template <class T>
void srpe_split_bwd(const T* dq, const T* dk, const T* dv, const T* dgate, int B, int Tn, int H, int Hkv, int dh,
                    const T* table, const int32_t* doc_start, T* dproj) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_split_bwd: head dim ", dh, " is odd");
  const long rows = long(B) * Tn;
  const size_t hd = size_t(H) * size_t(dh), kvd = size_t(Hkv) * size_t(dh), width = 2 * hd + 2 * kvd;
#pragma omp parallel for schedule(static) if (size_t(rows) * width >= kParallelMin)
  for (long r = 0; r < rows; ++r) {
    T* dst = dproj + size_t(r) * width;
    const T* tab = table + size_t(position(r, Tn, doc_start)) * size_t(dh);
    rotate_row(dq + size_t(r) * hd, dst, H, dh, tab, true);
    rotate_row(dk + size_t(r) * kvd, dst + hd, Hkv, dh, tab, true);
    std::memcpy(dst + hd + kvd, dv + size_t(r) * kvd, kvd * sizeof(T));
    std::memcpy(dst + hd + 2 * kvd, dgate + size_t(r) * hd, hd * sizeof(T));
  }
}

#define WIOLA_INSTANTIATE_SRPE(T) \
  template void srpe_apply<T>(T*, int, int, int, int, const T*, bool); \
  template void srpe_split_fwd<T>(const T*, int, int, int, int, int, const T*, const int32_t*, T*, T*, T*, T*); \
  template void srpe_split_bwd<T>(const T*, const T*, const T*, const T*, int, int, int, int, int, const T*, \
                                  const int32_t*, T*);
WIOLA_INSTANTIATE_SRPE(float)
WIOLA_INSTANTIATE_SRPE(double)

}  // namespace wiola::cpu
