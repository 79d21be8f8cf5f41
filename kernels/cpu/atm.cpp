// ATM (docs/model.md §2 "ATM"): neighbour cosine similarity for the merge map, and the
// mean of each group's rows (merged keys/values) with its backward.
#include "kernels/atm_plan.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"
#include "util/error.h"

namespace wiola::cpu {
namespace {

// Groups of sequence b: n_groups[b] in [0, Tn]; group j covers rows
// group_first..key_end inside [0, Tn), groups disjoint and in order (so the
// parallel backward has one writer per row).
void check_groups(int B, int Tn, const int32_t* group_first, const int32_t* key_end, const int32_t* n_groups) {
  for (int b = 0; b < B; ++b) {
    const int ng = n_groups[b];
    WIOLA_CHECK(ng >= 0 && ng <= Tn, "atm_merge_rows: n_groups[", b, "] = ", ng, " outside [0, ", Tn, "]");
    int prev_end = -1;
    for (int j = 0; j < ng; ++j) {
      const int f = group_first[size_t(b) * Tn + j];
      const int e = key_end[size_t(b) * Tn + j];
      WIOLA_CHECK(f > prev_end && f <= e && e < Tn, "atm_merge_rows: group ", j, " of sequence ", b, " covers rows ", f,
                  "..", e, " (previous group ends at ", prev_end, ", Tn = ", Tn, ")");
      prev_end = e;
    }
  }
}

}  // namespace

template <class T>
void atm_similarity(const T* x, int B, int Tn, int d, double* rho) {
  const long rows = long(B) * Tn;
  const bool par = size_t(rows) * d >= kParallelMin;
  std::vector<double> nrm(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static) if (par)
  for (long r = 0; r < rows; ++r) {
    const T* a = x + size_t(r) * d;
    nrm[size_t(r)] = std::sqrt(lane_sum(0, size_t(d), [a](size_t j) { return double(a[j]) * double(a[j]); }));
  }
  if (Tn < 2) return;
#pragma omp parallel for schedule(static) if (par)
  for (long r = 0; r < rows; ++r) {
    const int t = int(r % Tn);
    if (t == Tn - 1) continue;
    const T* a = x + size_t(r) * d;
    const T* b = a + d;
    const double s = lane_sum(0, size_t(d), [a, b](size_t j) { return double(a[j]) * double(b[j]); });
    const double n0 = nrm[size_t(r)], n1 = nrm[size_t(r) + 1];
    rho[size_t(r / Tn) * (Tn - 1) + t] = (n0 > 0 && n1 > 0) ? s / (n0 * n1) : 0.0;
  }
}

template <class T>
void atm_merge_rows(const T* x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                    const int32_t* n_groups, T* out) {
  check_groups(B, Tn, group_first, key_end, n_groups);
  const long rows = long(B) * Tn;
#pragma omp parallel for schedule(static) if (size_t(rows) * w >= kParallelMin)
  for (long r = 0; r < rows; ++r) {
    const long b = r / Tn;
    const int j = int(r % Tn);
    T* o = out + size_t(r) * w;
    if (j >= n_groups[b]) {
      for (int c = 0; c < w; ++c) o[c] = T(0);
      continue;
    }
    const int f = group_first[r], e = key_end[r];
    const T* xb = x + size_t(b) * Tn * w;
    const T inv = T(1) / T(e - f + 1);
    for (int c = 0; c < w; ++c) o[c] = xb[size_t(f) * w + c];
    for (int t = f + 1; t <= e; ++t)
      for (int c = 0; c < w; ++c) o[c] += xb[size_t(t) * w + c];
    if (e > f)
      for (int c = 0; c < w; ++c) o[c] *= inv;
  }
}

template <class T>
void atm_merge_rows_bwd(const T* dout, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                        const int32_t* n_groups, T* dx) {
  check_groups(B, Tn, group_first, key_end, n_groups);
  const long rows = long(B) * Tn;
#pragma omp parallel for schedule(static) if (size_t(rows) * w >= kParallelMin)
  for (long r = 0; r < rows; ++r) {
    const long b = r / Tn;
    const int j = int(r % Tn);
    if (j >= n_groups[b]) continue;
    const int f = group_first[r], e = key_end[r];
    const T inv = T(1) / T(e - f + 1);
    const T* g = dout + size_t(r) * w;
    for (int t = f; t <= e; ++t) {
      T* d = dx + (size_t(b) * Tn + t) * w;
      for (int c = 0; c < w; ++c) d[c] += g[c] * inv;
    }
  }
}

void atm_plan(const double* rho, int B, int Tn, double tau, const int32_t* doc_start, uint8_t* open,
              int32_t* group_first, int32_t* key_end, int32_t* n_groups) {
  for (int b = 0; b < B; ++b) {
    uint8_t* ob = open + size_t(b) * Tn;
    atm_greedy_row(rho + size_t(b) * (Tn - 1), Tn, tau, ob, doc_start ? doc_start + size_t(b) * Tn : nullptr);
    n_groups[b] = atm_layout_row(ob, Tn, group_first + size_t(b) * Tn, key_end + size_t(b) * Tn);
  }
}

#define WIOLA_INST(T) \
  template void atm_similarity<T>(const T*, int, int, int, double*); \
  template void atm_merge_rows<T>(const T*, int, int, int, const int32_t*, const int32_t*, const int32_t*, T*); \
  template void atm_merge_rows_bwd<T>(const T*, int, int, int, const int32_t*, const int32_t*, const int32_t*, T*);
WIOLA_INST(float)
WIOLA_INST(double)
#undef WIOLA_INST

}  // namespace wiola::cpu
