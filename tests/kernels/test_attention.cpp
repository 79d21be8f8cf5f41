// Tests of the CPU self-attention kernels (kernels/cpu/attention.h) against a
// naive double-precision reference with the full score matrix per head, and
// finite differences in double.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "util/error.h"

namespace wiola {
namespace {

using Vec = std::vector<double>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// An attention problem: shape, key layout and double inputs.
struct Problem {
  AttnShape s;
  std::vector<int32_t> key_end;    // empty = plain causal
  std::vector<int32_t> n_keys;     // empty = Tk
  std::vector<uint8_t> self_open;  // empty = none
  std::vector<int32_t> doc_start;  // [B, Tq]; empty = one document
  Vec q, k, v, rk, rv, dout;

  AttnKeys keys() const {
    AttnKeys a;
    a.key_end = key_end.empty() ? nullptr : key_end.data();
    a.n_keys = n_keys.empty() ? nullptr : n_keys.data();
    a.self_open = self_open.empty() ? nullptr : self_open.data();
    a.doc_start = doc_start.empty() ? nullptr : doc_start.data();
    return a;
  }
  int ds(int b, int i) const { return doc_start.empty() ? 0 : doc_start[size_t(b) * s.Tq + i]; }
  bool starts_doc(int b, int i) const { return !doc_start.empty() && ds(b, i) == i; }
  int nk(int b) const { return n_keys.empty() ? s.Tk : n_keys[b]; }
  int ke(int b, int j) const { return key_end.empty() ? j : key_end[size_t(b) * s.Tk + j]; }
  bool open(int b, int i) const { return !self_open.empty() && self_open[size_t(b) * s.Tq + i]; }
  size_t nq() const { return size_t(s.B) * s.Tq * s.H * s.dh; }
  size_t nkv() const { return size_t(s.B) * s.Tk * s.Hkv * s.dh; }
  size_t nraw() const { return size_t(s.B) * s.Tq * s.Hkv * s.dh; }
  size_t qi(int b, int i, int h, int d) const { return ((size_t(b) * s.Tq + i) * s.H + h) * s.dh + d; }
  size_t ki(int b, int j, int g, int d) const { return ((size_t(b) * s.Tk + j) * s.Hkv + g) * s.dh + d; }
  size_t ri(int b, int i, int g, int d) const { return ((size_t(b) * s.Tq + i) * s.Hkv + g) * s.dh + d; }
};

void fill_random(Vec& x, size_t n, std::mt19937_64& rng, double sd) {
  std::normal_distribution<double> nd(0.0, sd);
  x.resize(n);
  for (auto& e : x) e = nd(rng);
}

// Random inputs; key rows >= n_keys and raw rows of closed queries are NaN so
// any read of them shows up.
void randomize(Problem& p, uint64_t seed, double sd = 1.0) {
  std::mt19937_64 rng(seed);
  fill_random(p.q, p.nq(), rng, sd);
  fill_random(p.k, p.nkv(), rng, sd);
  fill_random(p.v, p.nkv(), rng, 1.0);
  fill_random(p.rk, p.nraw(), rng, sd);
  fill_random(p.rv, p.nraw(), rng, 1.0);
  fill_random(p.dout, p.nq(), rng, 1.0);
  const auto& s = p.s;
  for (int b = 0; b < s.B; ++b) {
    for (int j = p.nk(b); j < s.Tk; ++j)
      for (int g = 0; g < s.Hkv; ++g)
        for (int d = 0; d < s.dh; ++d) p.k[p.ki(b, j, g, d)] = p.v[p.ki(b, j, g, d)] = kNaN;
    for (int i = 0; i < s.Tq; ++i)
      if (!p.open(b, i))
        for (int g = 0; g < s.Hkv; ++g)
          for (int d = 0; d < s.dh; ++d) p.rk[p.ri(b, i, g, d)] = p.rv[p.ri(b, i, g, d)] = kNaN;
  }
}

// ATM layout: greedy random pairs (t, t+1) per sequence (positions 0..T-1):
// key_end = last member, self_open = t opens a pair. Different per sequence.
void atm_layout(Problem& p, uint64_t seed, double merge_prob) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  const auto& s = p.s;
  p.key_end.assign(size_t(s.B) * s.Tk, 0);
  p.n_keys.assign(s.B, 0);
  p.self_open.assign(size_t(s.B) * s.Tq, 0);
  for (int b = 0; b < s.B; ++b) {
    const double pr = merge_prob * (1.0 + 0.5 * b);  // differs per sequence
    int n = 0;
    for (int t = 0; t < s.Tq; ++t) {
      if (t + 1 < s.Tq && u(rng) < pr && !p.starts_doc(b, t + 1)) {  // no pair crosses a document
        p.key_end[size_t(b) * s.Tk + n++] = t + 1;
        p.self_open[size_t(b) * s.Tq + t] = 1;
        ++t;
      } else {
        p.key_end[size_t(b) * s.Tk + n++] = t;
      }
    }
    p.n_keys[b] = n;
    for (int j = n; j < s.Tk; ++j) p.key_end[size_t(b) * s.Tk + j] = 1 << 30;
  }
}

struct Ref {
  Vec o, lse, dq, dk, dv, drk, drv;
};

// Naive reference: per (b, h) the full score row of each query.
Ref reference(const Problem& p) {
  const auto& s = p.s;
  const double scale = 1.0 / std::sqrt(double(s.dh));
  Ref r;
  r.o.assign(p.nq(), 0);
  r.lse.assign(size_t(s.B) * s.H * s.Tq, 0);
  r.dq.assign(p.nq(), 0);
  r.dk.assign(p.nkv(), 0);
  r.dv.assign(p.nkv(), 0);
  r.drk.assign(p.nraw(), 0);
  r.drv.assign(p.nraw(), 0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const int g = h % s.Hkv;
      for (int i = 0; i < s.Tq; ++i) {
        const int pos = s.q_pos0 + i;
        // Visible keys: pointers to k/v rows and their gradients.
        std::vector<const double*> K, V;
        std::vector<double*> dK, dV;
        // (Documents: the keys of i's document, those ending at or after
        // its start; a group never crosses one.)
        for (int j = 0; j < p.nk(b); ++j)
          if (p.ke(b, j) <= pos && p.ke(b, j) >= p.ds(b, i)) {
            K.push_back(&p.k[p.ki(b, j, g, 0)]);
            V.push_back(&p.v[p.ki(b, j, g, 0)]);
            dK.push_back(&r.dk[p.ki(b, j, g, 0)]);
            dV.push_back(&r.dv[p.ki(b, j, g, 0)]);
          }
        if (p.open(b, i)) {
          K.push_back(&p.rk[p.ri(b, i, g, 0)]);
          V.push_back(&p.rv[p.ri(b, i, g, 0)]);
          dK.push_back(&r.drk[p.ri(b, i, g, 0)]);
          dV.push_back(&r.drv[p.ri(b, i, g, 0)]);
        }
        const double* qr = &p.q[p.qi(b, i, h, 0)];
        const double* dor = &p.dout[p.qi(b, i, h, 0)];
        const size_t n = K.size();
        double* lse = &r.lse[(size_t(b) * s.H + h) * s.Tq + i];
        if (n == 0) {
          *lse = -std::numeric_limits<double>::infinity();
          continue;
        }
        std::vector<double> sc(n), pr(n), dp(n);
        double mx = -std::numeric_limits<double>::infinity();
        for (size_t j = 0; j < n; ++j) {
          double a = 0;
          for (int d = 0; d < s.dh; ++d) a += qr[d] * K[j][d];
          sc[j] = a * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (size_t j = 0; j < n; ++j) sum += std::exp(sc[j] - mx);
        *lse = mx + std::log(sum);
        double D = 0;
        for (size_t j = 0; j < n; ++j) {
          pr[j] = std::exp(sc[j] - *lse);
          double a = 0;
          for (int d = 0; d < s.dh; ++d) {
            r.o[p.qi(b, i, h, d)] += pr[j] * V[j][d];
            a += dor[d] * V[j][d];
          }
          dp[j] = a;
          D += pr[j] * a;
        }
        for (size_t j = 0; j < n; ++j) {
          const double ds = pr[j] * (dp[j] - D);
          for (int d = 0; d < s.dh; ++d) {
            r.dq[p.qi(b, i, h, d)] += ds * K[j][d] * scale;
            dK[j][d] += ds * qr[d] * scale;
            dV[j][d] += pr[j] * dor[d];
          }
        }
      }
    }
  return r;
}

template <class T>
std::vector<T> cast(const Vec& x) {
  return std::vector<T>(x.begin(), x.end());
}
template <class T>
Vec to_double(const std::vector<T>& x) {
  return Vec(x.begin(), x.end());
}

// Kernel outputs (as double).
struct Out {
  Vec o, lse, dq, dk, dv, drk, drv;
};

template <class T>
Out run_kernel(const Problem& p, bool with_raw_grads = true) {
  const auto& s = p.s;
  const auto q = cast<T>(p.q), k = cast<T>(p.k), v = cast<T>(p.v), rk = cast<T>(p.rk), rv = cast<T>(p.rv),
             dout = cast<T>(p.dout);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  // Outputs pre-filled with NaN: the kernels must overwrite every element.
  std::vector<T> o(p.nq(), nan), lse(size_t(s.B) * s.H * s.Tq, nan), dq(p.nq(), nan), dk(p.nkv(), nan),
      dv(p.nkv(), nan), drk(p.nraw(), nan), drv(p.nraw(), nan);
  const AttnKeys keys = p.keys();
  cpu::attention_fwd<T>(s, keys, q.data(), k.data(), v.data(), rk.data(), rv.data(), o.data(), lse.data());
  cpu::attention_bwd<T>(s, keys, q.data(), k.data(), v.data(), rk.data(), rv.data(), o.data(), lse.data(), dout.data(),
                        dq.data(), dk.data(), dv.data(), with_raw_grads ? drk.data() : nullptr,
                        with_raw_grads ? drv.data() : nullptr);
  Out r{to_double(o), to_double(lse), to_double(dq), to_double(dk), to_double(dv), to_double(drk), to_double(drv)};
  return r;
}

// max |a - r| / max |r| (NaN anywhere in a counts as failure); -inf == -inf.
double rel_err(const Vec& a, const Vec& r) {
  EXPECT_EQ(a.size(), r.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(r[i]) && a[i] == r[i]) continue;
    if (std::isnan(a[i]) || std::isnan(r[i])) return kNaN;
    num = std::max(num, std::abs(a[i] - r[i]));
    den = std::max(den, std::abs(r[i]));
  }
  return den > 0 ? num / den : num;
}

template <class T>
double tol() {
  return sizeof(T) == 4 ? 1e-5 : 1e-12;
}

// Compares every output with the reference; returns the largest error.
template <class T>
double check_against_reference(const Problem& p, const char* what) {
  const Ref ref = reference(p);
  const Out out = run_kernel<T>(p, true);
  Problem pr = p;  // reference in double from the rounded inputs
  if (sizeof(T) == 4) {
    for (Vec* x : {&pr.q, &pr.k, &pr.v, &pr.rk, &pr.rv, &pr.dout})
      for (auto& e : *x) e = double(float(e));
  }
  const Ref rr = sizeof(T) == 4 ? reference(pr) : ref;
  const struct {
    const char* name;
    const Vec& a;
    const Vec& r;
  } cmp[] = {{"o", out.o, rr.o},    {"lse", out.lse, rr.lse},    {"dq", out.dq, rr.dq},      {"dk", out.dk, rr.dk},
             {"dv", out.dv, rr.dv}, {"draw_k", out.drk, rr.drk}, {"draw_v", out.drv, rr.drv}};
  double worst = 0;
  for (const auto& c : cmp) {
    const double e = rel_err(c.a, c.r);
    EXPECT_LE(e, tol<T>()) << what << ": " << c.name << " (T=" << sizeof(T) * 8 << " bit)";
    EXPECT_FALSE(std::isnan(e)) << what << ": NaN in " << c.name;
    worst = std::max(worst, std::isnan(e) ? 1.0 : e);
  }
  std::printf("  [max rel err] %-22s %-6s %.3g\n", what, sizeof(T) == 4 ? "float" : "double", worst);
  return worst;
}

Problem causal(int B, int T, int H, int Hkv, int dh, uint64_t seed) {
  Problem p;
  p.s = AttnShape{B, T, T, H, Hkv, dh, 0};
  randomize(p, seed);
  return p;
}

// Documents of random lengths (mean about mean_len; a few of length 1, an
// EOS-only document) in each sequence: doc_start as the model makes it.
void documents(Problem& p, uint64_t seed, double mean_len) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  const auto& s = p.s;
  p.doc_start.assign(size_t(s.B) * s.Tq, 0);
  for (int b = 0; b < s.B; ++b) {
    int start = 0;
    for (int t = 0; t < s.Tq; ++t) {
      if (t > 0 && (u(rng) < 1.0 / mean_len || t == 3)) start = t;  // t = 3: after a document of 3
      if (t == 4) start = 4;                                        // and one of 1 (an EOS alone)
      p.doc_start[size_t(b) * s.Tq + t] = start;
    }
  }
}

Problem atm(int B, int T, int H, int Hkv, int dh, uint64_t seed, double merge_prob = 0.25, double doc_len = 0) {
  Problem p;
  p.s = AttnShape{B, T, T, H, Hkv, dh, 0};
  if (doc_len > 0) documents(p, seed * 5 + 3, doc_len);
  atm_layout(p, seed * 7 + 1, merge_prob);
  randomize(p, seed);
  return p;
}

template <class T>
class AttentionTyped : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(AttentionTyped, Types);

TYPED_TEST(AttentionTyped, PlainCausalSmall) {
  check_against_reference<TypeParam>(causal(2, 37, 4, 2, 16, 1), "causal T=37 dh=16");
  check_against_reference<TypeParam>(causal(1, 1, 1, 1, 8, 2), "causal T=1");
  check_against_reference<TypeParam>(causal(3, 5, 2, 2, 32, 3), "causal T=5 dh=32");
}

TYPED_TEST(AttentionTyped, PlainCausalMultiTile) {
  for (int dh : {32, 64, 128, 24})
    check_against_reference<TypeParam>(causal(2, 150, 4, 2, dh, 10 + dh), "causal T=150");
  check_against_reference<TypeParam>(causal(1, 128, 3, 1, 64, 5), "causal T=128 MQA");
}

TYPED_TEST(AttentionTyped, GqaGroupMapping) {
  // H=4, Hkv=2: heads 0,2 use group 0, heads 1,3 group 1 (h % Hkv, not
  // h / (H/Hkv)). v = 1 in group 0 and 0 in group 1 gives o = 1 / 0.
  Problem p = causal(2, 9, 4, 2, 8, 4);
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 9; ++j)
      for (int d = 0; d < 8; ++d) {
        p.v[p.ki(b, j, 0, d)] = 1.0;
        p.v[p.ki(b, j, 1, d)] = 0.0;
      }
  const Out out = run_kernel<TypeParam>(p);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 9; ++i)
      for (int h = 0; h < 4; ++h)
        for (int d = 0; d < 8; ++d)
          EXPECT_NEAR(out.o[p.qi(b, i, h, d)], h % 2 == 0 ? 1.0 : 0.0, 1e-6) << "b=" << b << " i=" << i << " h=" << h;
  // (v constant per group makes the exact dk zero, so compare o and lse.)
  const Ref ref = reference(p);
  EXPECT_LE(rel_err(out.o, ref.o), tol<TypeParam>());
  EXPECT_LE(rel_err(out.lse, ref.lse), tol<TypeParam>());
  check_against_reference<TypeParam>(causal(2, 70, 6, 3, 32, 6), "gqa H=6 Hkv=3");
}

TYPED_TEST(AttentionTyped, AtmLayouts) {
  check_against_reference<TypeParam>(atm(3, 37, 4, 2, 16, 21), "atm T=37");
  check_against_reference<TypeParam>(atm(3, 150, 4, 2, 32, 22), "atm T=150");
  check_against_reference<TypeParam>(atm(2, 150, 4, 4, 64, 23, 0.45), "atm T=150 dh=64");
  check_against_reference<TypeParam>(atm(2, 20, 2, 1, 5, 24, 1.0), "atm all pairs");
}

// Documents (docs/model.md §2 "Documents"): each query sees only the keys of
// its document, plain and with ATM (groups inside documents), in short
// windows, over several blocks, and at T >= kAttnLongKeys (the backward's
// long blocks); and a document's outputs equal the document run alone.
TYPED_TEST(AttentionTyped, Documents) {
  Problem p = causal(2, 150, 4, 2, 32, 81);
  documents(p, 82, 20);
  check_against_reference<TypeParam>(p, "documents T=150");
  check_against_reference<TypeParam>(atm(3, 150, 4, 2, 16, 83, 0.3, 12), "documents atm T=150");
  check_against_reference<TypeParam>(atm(2, 37, 2, 1, 8, 84, 1.0, 5), "documents atm pairs");
  check_against_reference<TypeParam>(atm(1, cpu::kAttnLongKeys + 40, 2, 1, 8, 85, 0.2, 300), "documents atm T=1064");
  // The document [s, e) of sequence 1 alone (B = 1, positions from 0).
  const Out all = run_kernel<TypeParam>(p);
  int s0 = 0;
  while (p.ds(1, s0) == 0) ++s0;
  int e0 = s0;
  while (e0 < p.s.Tq && p.ds(1, e0) == s0) ++e0;
  Problem one;
  one.s = AttnShape{1, e0 - s0, e0 - s0, 4, 2, 32, 0};
  randomize(one, 1);
  for (int i = 0; i < e0 - s0; ++i)
    for (int g = 0; g < 2; ++g)
      for (int d = 0; d < 32; ++d) {
        one.k[one.ki(0, i, g, d)] = p.k[p.ki(1, s0 + i, g, d)];
        one.v[one.ki(0, i, g, d)] = p.v[p.ki(1, s0 + i, g, d)];
      }
  for (int i = 0; i < e0 - s0; ++i)
    for (int h = 0; h < 4; ++h)
      for (int d = 0; d < 32; ++d) {
        one.q[one.qi(0, i, h, d)] = p.q[p.qi(1, s0 + i, h, d)];
        one.dout[one.qi(0, i, h, d)] = p.dout[p.qi(1, s0 + i, h, d)];
      }
  const Out alone = run_kernel<TypeParam>(one);
  for (int i = 0; i < e0 - s0; ++i)
    for (int h = 0; h < 4; ++h)
      for (int d = 0; d < 32; ++d) {
        EXPECT_NEAR(all.o[p.qi(1, s0 + i, h, d)], alone.o[one.qi(0, i, h, d)], 10 * tol<TypeParam>());
        EXPECT_NEAR(all.dq[p.qi(1, s0 + i, h, d)], alone.dq[one.qi(0, i, h, d)], 10 * tol<TypeParam>());
      }
}

TYPED_TEST(AttentionTyped, HandMadeAtmLayout) {
  // T = 8, sequence 0 groups {0,1},{2},{3,4},{5},{6,7}; sequence 1 no merges
  // but only 6 keys valid with key_end shifted; n_keys differ.
  Problem p;
  p.s = AttnShape{2, 8, 8, 2, 1, 4, 0};
  p.key_end = {1, 2, 4, 5, 7, 99, 99, 99,  //
               0, 1, 2, 3, 4, 5,  99, 99};
  p.n_keys = {5, 6};
  p.self_open = {1, 0, 0, 1, 0, 0, 1, 0,  //
                 0, 0, 0, 0, 0, 0, 1, 0};
  randomize(p, 31);
  // Query 7 of sequence 1 sees keys 0..5 only (no own key, not open): fine.
  check_against_reference<TypeParam>(p, "hand-made atm");
  // Query 0 of sequence 0 sees only its raw key: o = raw_v.
  const Out out = run_kernel<TypeParam>(p);
  for (int h = 0; h < 2; ++h)
    for (int d = 0; d < 4; ++d) EXPECT_NEAR(out.o[p.qi(0, 0, h, d)], p.rv[p.ri(0, 0, 0, d)], 1e-6);
}

TYPED_TEST(AttentionTyped, CachedDecoding) {
  // Queries are the last Tq positions, keys 0..Tk-1.
  for (auto [Tq, Tk, dh] :
       {std::tuple{1, 40, 16}, std::tuple{5, 40, 32}, std::tuple{70, 150, 64}, std::tuple{64, 200, 32}}) {
    Problem p;
    p.s = AttnShape{2, Tq, Tk, 4, 2, dh, Tk - Tq};
    randomize(p, 40 + Tq);
    check_against_reference<TypeParam>(p, "cached decoding");
  }
}

TYPED_TEST(AttentionTyped, QueryWithNoVisibleKey) {
  // Queries 0..2 see nothing: o = 0, lse = -inf, gradients finite (0).
  Problem p;
  p.s = AttnShape{1, 6, 6, 2, 2, 4, 0};
  p.key_end = {3, 4, 5, 99, 99, 99};
  p.n_keys = {3};
  randomize(p, 50);
  check_against_reference<TypeParam>(p, "empty rows");
  const Out out = run_kernel<TypeParam>(p);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(std::isinf(out.lse[size_t(h) * 6 + i]) && out.lse[size_t(h) * 6 + i] < 0);
      for (int d = 0; d < 4; ++d) {
        EXPECT_EQ(out.o[p.qi(0, i, h, d)], 0.0);
        EXPECT_EQ(out.dq[p.qi(0, i, h, d)], 0.0);
      }
    }
}

TYPED_TEST(AttentionTyped, LargeScoresStable) {
  // Scores of order 100: the online softmax must not overflow.
  Problem p;
  p.s = AttnShape{1, 130, 130, 2, 1, 32, 0};
  randomize(p, 60, 4.0);
  check_against_reference<TypeParam>(p, "large scores");
}

TYPED_TEST(AttentionTyped, DeterministicAcrossThreadCounts) {
  const Problem p = atm(3, 150, 4, 2, 32, 70);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Out a = run_kernel<TypeParam>(p);
  omp_set_num_threads(std::max(2, saved));
  const Out b = run_kernel<TypeParam>(p);
  const Out c = run_kernel<TypeParam>(p);
  omp_set_num_threads(saved);
  for (const auto* x : {&b, &c}) {
    EXPECT_EQ(a.o, x->o);
    EXPECT_EQ(a.lse, x->lse);
    EXPECT_EQ(a.dq, x->dq);
    EXPECT_EQ(a.dk, x->dk);
    EXPECT_EQ(a.dv, x->dv);
    EXPECT_EQ(a.drk, x->drk);
    EXPECT_EQ(a.drv, x->drv);
  }
}

TEST(Attention, RawGradsMayBeNullWithoutSelfOpen) {
  const Problem p = causal(2, 20, 4, 2, 8, 80);
  const Ref ref = reference(p);
  const Out out = run_kernel<double>(p, /*with_raw_grads=*/false);
  EXPECT_LE(rel_err(out.dq, ref.dq), 1e-12);
  EXPECT_LE(rel_err(out.dk, ref.dk), 1e-12);
  EXPECT_LE(rel_err(out.dv, ref.dv), 1e-12);
}

TEST(Attention, InvalidArguments) {
  Problem p = causal(1, 4, 3, 2, 4, 90);  // H % Hkv != 0
  std::vector<double> o(p.nq()), lse(3 * 4);
  EXPECT_THROW(cpu::attention_fwd<double>(p.s, p.keys(), p.q.data(), p.k.data(), p.v.data(), nullptr, nullptr, o.data(),
                                          lse.data()),
               Error);
  Problem p2 = causal(1, 4, 2, 2, 4, 91);
  p2.n_keys = {5};  // > Tk
  EXPECT_THROW(cpu::attention_fwd<double>(p2.s, p2.keys(), p2.q.data(), p2.k.data(), p2.v.data(), nullptr, nullptr,
                                          o.data(), lse.data()),
               Error);
}

// Finite differences in double of L = sum(o * dout) w.r.t. every input.
void finite_difference_check(Problem p, const char* what) {
  const auto& s = p.s;
  const Out an = run_kernel<double>(p);
  const AttnKeys keys = p.keys();
  auto loss = [&]() {
    Vec o(p.nq()), lse(size_t(s.B) * s.H * s.Tq);
    cpu::attention_fwd<double>(s, keys, p.q.data(), p.k.data(), p.v.data(), p.rk.data(), p.rv.data(), o.data(),
                               lse.data());
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * p.dout[i];
    return l;
  };
  const double eps = 1e-6;
  const struct {
    const char* name;
    Vec* x;
    const Vec* g;
  } inputs[] = {{"dq", &p.q, &an.dq},
                {"dk", &p.k, &an.dk},
                {"dv", &p.v, &an.dv},
                {"draw_k", &p.rk, &an.drk},
                {"draw_v", &p.rv, &an.drv}};
  for (const auto& in : inputs) {
    double num = 0, den = 0;
    for (size_t i = 0; i < in.x->size(); ++i) {
      double& x = (*in.x)[i];
      if (std::isnan(x)) {  // unused row: gradient must be exactly 0
        EXPECT_EQ((*in.g)[i], 0.0) << what << " " << in.name << " [" << i << "]";
        continue;
      }
      const double x0 = x;
      x = x0 + eps;
      const double lp = loss();
      x = x0 - eps;
      const double lm = loss();
      x = x0;
      const double fd = (lp - lm) / (2 * eps);
      num = std::max(num, std::abs(fd - (*in.g)[i]));
      den = std::max(den, std::abs(fd));
    }
    const double rel = den > 0 ? num / den : num;
    std::printf("  [fd rel err] %-18s %-7s %.3g\n", what, in.name, rel);
    EXPECT_LT(rel, 1e-6) << what << ": " << in.name;
  }
}

TEST(Attention, FiniteDifferencesCausalGqa) { finite_difference_check(causal(2, 7, 4, 2, 3, 100), "causal"); }

TEST(Attention, FiniteDifferencesAtm) { finite_difference_check(atm(2, 9, 4, 2, 3, 101, 0.4), "atm"); }

TEST(Attention, FiniteDifferencesCachedMultiTile) {
  Problem p;
  p.s = AttnShape{1, 66, 70, 2, 1, 2, 4};
  randomize(p, 102);
  finite_difference_check(p, "cached multi-tile");
}

}  // namespace
}  // namespace wiola
