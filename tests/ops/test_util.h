// Helpers of the CPU op tests: random vectors, central finite differences in
// double, and a table of the largest errors printed at the end of the run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace wiola::test {

using Vec = std::vector<double>;
using Fvec = std::vector<float>;

inline std::mt19937_64& rng() {
  static std::mt19937_64 g(20240611);
  return g;
}

inline Vec randn(size_t n, double sd = 1.0, double mean = 0.0) {
  std::normal_distribution<double> d(mean, sd);
  Vec v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

inline int randint(int lo, int hi) {  // [lo, hi]
  return std::uniform_int_distribution<int>(lo, hi)(rng());
}

inline Fvec to_float(const Vec& v) { return Fvec(v.begin(), v.end()); }

// Reductions and dL/dφ leave their results in backend memory; these tests
// run the host-memory CPU backend, so a host double serves as that memory.
template <class O, class T>
double sum_squares_of(O& ops, const T* x, size_t n) {
  double acc = 0;
  ops.sum_squares(x, n, &acc);
  return acc;
}
template <class O, class T>
double sum_of(O& ops, const T* x, size_t n) {
  double acc = 0;
  ops.sum(x, n, &acc);
  return acc;
}
template <class O, class T>
double blend_bwd_dphi(O& ops, const T* o_self, const T* o_ctx, T phi, const T* dout, size_t n,
                      T* d_self, T* d_ctx) {
  double dphi = 0;
  ops.blend_bwd(o_self, o_ctx, &phi, dout, n, d_self, d_ctx, &dphi);
  return dphi;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline Vec minus(const Vec& a, const Vec& b) {
  Vec r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

// max |a - b| / max(max |b|, floor): error relative to the tensor's scale.
inline double rel_err(const Vec& a, const Vec& b, double floor = 1e-300) {
  double num = 0, den = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

// Largest error seen per named check; printed when the run ends.
inline std::map<std::string, double>& report_table() {
  static std::map<std::string, double> t;
  return t;
}
inline void report(const std::string& name, double err) {
  auto& e = report_table()[name];
  e = std::max(e, err);
}

// Central differences of L with respect to every element of x (restored
// afterwards), compared with the analytic gradient `an`; records and returns
// the relative error.
inline double fd_check(const std::string& name, Vec& x, const Vec& an,
                       const std::function<double()>& L, double eps = 1e-6) {
  EXPECT_EQ(x.size(), an.size()) << name;
  Vec fd(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = L();
    x[i] = x0 - eps;
    const double lm = L();
    x[i] = x0;
    fd[i] = (lp - lm) / (2 * eps);
  }
  const double err = rel_err(an, fd);
  report("fd " + name, err);
  EXPECT_LT(err, 1e-6) << name;
  return err;
}

}  // namespace wiola::test
