// The cpu-bf16 debug backend (kernels/cpu/bf16_storage_ops.h): each op on
// bf16 buffers computes what the cpu backend computes on their widened
// values, and rounds its bf16 outputs once to nearest even; nothing else in
// an allocation changes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "util/error.h"

namespace wiola {
namespace {

std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<uint16_t> to_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_round(v[i]);
  return b;
}
std::vector<float> widen(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_widen(b[i]);
  return v;
}

// One allocation of the backend holding n bf16 elements.
struct Bf16Buf {
  Buffer<float, unsigned char> mem;
  size_t n;
  Bf16Buf(Ops<float>& ops, size_t n_) : mem(ops, n_ * 2), n(n_) {}
  Ptr ptr() { return Ptr(mem.data(), DType::BF16); }
  void set(Ops<float>& ops, const std::vector<uint16_t>& b) { ops.upload(mem.data(), b.data(), b.size() * 2); }
  std::vector<uint16_t> get(Ops<float>& ops) {
    std::vector<uint16_t> b(n);
    ops.download(b.data(), mem.data(), n * 2);
    return b;
  }
};

// C = A B^T with bf16 operands and a bf16 result: the fp32 product of the
// widened operands (the cpu backend's), rounded once.
TEST(Bf16StorageOps, GemmRoundsItsOutputOnce) {
  auto bf = make_backend<float>("cpu-bf16");
  auto cpu = make_backend<float>("cpu");
  const int m = 19, n = 23, k = 37;
  const auto a = to_bits(randn(size_t(m) * k, 1)), b = to_bits(randn(size_t(n) * k, 2));
  Bf16Buf A(*bf, a.size()), B(*bf, b.size()), C(*bf, size_t(m) * n);
  A.set(*bf, a);
  B.set(*bf, b);
  bf->gemm(Trans::N, Trans::T, m, n, k, 1.0f, A.ptr(), k, B.ptr(), k, 0.0f, C.ptr(), n);

  std::vector<float> wa = widen(a), wb = widen(b), want(size_t(m) * n);
  cpu->gemm(Trans::N, Trans::T, m, n, k, 1.0f, wa.data(), k, wb.data(), k, 0.0f, want.data(), n);
  EXPECT_EQ(C.get(*bf), to_bits(want));
}

// convert: fp32 -> bf16 rounds to nearest even (ties included), bf16 -> fp32
// is exact.
TEST(Bf16StorageOps, ConvertRoundsToNearestEven) {
  auto bf = make_backend<float>("cpu-bf16");
  std::vector<float> x = randn(100, 3);
  const uint32_t ties[] = {0x3F808000u, 0x3F818000u, 0x3F808001u, 0xBF7F8000u};
  for (size_t i = 0; i < std::size(ties); ++i) std::memcpy(&x[i], &ties[i], 4);
  Buffer<float> src(*bf, x.size()), back(*bf, x.size());
  Bf16Buf dst(*bf, x.size());
  bf->upload(src.data(), x.data(), x.size() * 4);
  bf->convert(src.data(), dst.ptr(), x.size());
  const auto bits = dst.get(*bf);
  EXPECT_EQ(bits, to_bits(x));
  EXPECT_EQ(bits[0], 0x3F80);  // tie, even below
  EXPECT_EQ(bits[1], 0x3F82);  // tie, odd: up
  bf->convert(dst.ptr(), back.data(), x.size());
  std::vector<float> got(x.size());
  bf->download(got.data(), back.data(), x.size() * 4);
  EXPECT_EQ(got, widen(bits));
}

// A bf16 output followed, in the same allocation, by fp32 data whose low
// halves are bf16 NaN patterns (which a bf16 round trip would quiet): an op
// writing the bf16 part leaves every other byte as it was. In place too.
TEST(Bf16StorageOps, OnlyTheOutputChanges) {
  auto bf = make_backend<float>("cpu-bf16");
  const size_t n = 40, tail = 64;
  Buffer<float, unsigned char> mem(*bf, n * 2 + tail * 4);
  std::vector<unsigned char> host(n * 2 + tail * 4);
  const auto x = to_bits(randn(n, 4));
  std::memcpy(host.data(), x.data(), n * 2);
  for (size_t i = 0; i < tail; ++i) {
    const uint32_t v = 0x3F800000u | 0x7F81u | uint32_t(i);  // low half: a bf16 signalling NaN
    std::memcpy(host.data() + n * 2 + i * 4, &v, 4);
  }
  bf->upload(mem.data(), host.data(), host.size());
  const Ptr p(mem.data(), DType::BF16);
  bf->scale(p, 3.0f, n);  // in place: one shadow read and written
  std::vector<unsigned char> after(host.size());
  bf->download(after.data(), mem.data(), after.size());
  std::vector<float> want = widen(x);
  for (auto& v : want) v *= 3.0f;
  std::vector<uint16_t> got(n);
  std::memcpy(got.data(), after.data(), n * 2);
  EXPECT_EQ(got, to_bits(want));
  EXPECT_EQ(0, std::memcmp(after.data() + n * 2, host.data() + n * 2, tail * 4)) << "the fp32 tail changed";

  // Two outputs of one op in one allocation, the first shadow reaching over
  // the second: both written (swiglu_bwd's dg and du).
  const size_t m = 16;
  Buffer<float, unsigned char> two(*bf, m * 4);
  const auto g = to_bits(randn(m, 5)), u = to_bits(randn(m, 6)), dh = to_bits(randn(m, 7));
  Bf16Buf G(*bf, m), U(*bf, m), DH(*bf, m);
  G.set(*bf, g), U.set(*bf, u), DH.set(*bf, dh);
  const Ptr dg(two.data(), DType::BF16), du = dg + m;
  bf->swiglu_bwd(G.ptr(), U.ptr(), DH.ptr(), m, dg, du);
  auto cpu = make_backend<float>("cpu");
  std::vector<float> wg(m), wu(m);
  const auto fg = widen(g), fu = widen(u), fdh = widen(dh);
  cpu->swiglu_bwd(fg.data(), fu.data(), fdh.data(), m, wg.data(), wu.data());
  std::vector<uint16_t> both(2 * m);
  bf->download(both.data(), two.data(), 4 * m);
  EXPECT_EQ(std::vector<uint16_t>(both.begin(), both.begin() + long(m)), to_bits(wg));
  EXPECT_EQ(std::vector<uint16_t>(both.begin() + long(m), both.end()), to_bits(wu));
}

// The fused ops round what their unfused forms stored in between, as the
// GPU's kernels do: blend_gate_* are the bits of blend, gate and their
// backward one after the other; a norm's bf16 operand copy and AdamW's bf16
// weight copy are the bits convert would write.
TEST(Bf16StorageOps, FusedOpsRoundAsTheUnfusedOps) {
  auto bf = make_backend<float>("cpu-bf16");
  const size_t n = 301;
  std::vector<Bf16Buf> b;
  for (int i = 0; i < 14; ++i) b.emplace_back(*bf, n);
  for (int i = 0; i < 4; ++i) b[size_t(i)].set(*bf, to_bits(randn(n, 40 + uint64_t(i))));  // os, oc, pre, dog
  Buffer<float> phi(*bf, 1);
  const float ph = -0.7f;
  bf->upload(phi.data(), &ph, sizeof ph);
  Buffer<float, double> dphi(*bf, 2);
  auto P = [&](int i) { return b[size_t(i)].ptr(); };
  bf->blend_fwd(P(0), P(1), phi.data(), n, P(4));
  bf->sigmoid_gate_fwd(P(2), P(4), n, P(5));
  bf->sigmoid_gate_bwd(P(2), P(4), P(3), n, P(6), P(7));
  bf->blend_bwd(P(0), P(1), phi.data(), P(7), n, P(8), P(9), dphi.data());
  bf->blend_gate_fwd(P(0), P(1), phi.data(), P(2), n, P(10), P(11));
  bf->blend_gate_bwd(P(0), P(1), phi.data(), P(2), P(10), P(3), n, P(12), P(13), P(7), dphi.data() + 1);
  EXPECT_EQ(b[10].get(*bf), b[4].get(*bf));  // o
  EXPECT_EQ(b[11].get(*bf), b[5].get(*bf));  // og
  EXPECT_EQ(b[12].get(*bf), b[6].get(*bf));  // dpre
  EXPECT_EQ(b[13].get(*bf), b[8].get(*bf));  // d_self
  EXPECT_EQ(b[7].get(*bf), b[9].get(*bf));   // d_ctx
  double h[2];
  bf->download(h, dphi.data(), sizeof h);
  EXPECT_EQ(h[1], h[0]);

  // The norm's operand copy and AdamW's weight copy.
  const int N = 7, d = 43;
  const auto x = randn(size_t(N) * d, 50), gam = randn(size_t(d), 51), p0 = randn(n, 52), g0 = randn(n, 53);
  std::vector<float> del(size_t(d), 0.05f), y(x.size()), rs(N), y2(x.size()), rs2(N), m(n, 0.f), v(n, 0.f);
  Bf16Buf c(*bf, x.size()), c2(*bf, x.size()), w(*bf, n), w2(*bf, n);
  bf->rmsnorm_fwd(x.data(), gam.data(), del.data(), N, d, 1e-6, y.data(), rs.data(), nullptr);
  bf->convert(y.data(), c.ptr(), x.size());
  bf->rmsnorm_fwd(x.data(), gam.data(), del.data(), N, d, 1e-6, y2.data(), rs2.data(), c2.ptr());
  EXPECT_EQ(y2, y);
  EXPECT_EQ(c2.get(*bf), c.get(*bf));
  std::vector<float> p = p0, g = g0, p2 = p0, g2 = g0, m2 = m, v2 = v;
  bf->adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, nullptr, false);
  bf->convert(p.data(), w.ptr(), n);
  bf->adamw(p2.data(), g2.data(), m2.data(), v2.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05, w2.ptr(), true);
  EXPECT_EQ(p2, p);
  EXPECT_EQ(w2.get(*bf), w.get(*bf));
  EXPECT_EQ(g2, std::vector<float>(n, 0.f));
}

// SRPE fused with the Q|K|V|gate split rounds q and k once, as srpe_apply
// after copy_block does (the GPU's bits), and moves v and the gate
// unchanged; its backward rounds the joined dq and dk once, as srpe_apply
// (inverse) before copy_block does, and leaves dq and dk as they are. The
// four parts lie back to back in one allocation, as in the layer's arena, so
// their shadows overlap.
TEST(Bf16StorageOps, SrpeSplitRoundsAsCopyThenRotate) {
  auto bf = make_backend<float>("cpu-bf16");
  const int B = 2, Tn = 5, H = 3, Hkv = 1, dh = 8, N = B * Tn, hd = H * dh, kvd = Hkv * dh;
  const int width = 2 * hd + 2 * kvd, widths[4] = {hd, kvd, kvd, hd};
  const size_t nw = size_t(N) * width, at[4] = {0, size_t(N) * hd, size_t(N) * (hd + kvd), size_t(N) * (hd + 2 * kvd)};
  const auto tab = randn(size_t(Tn) * dh, 60);
  Buffer<float> table(*bf, tab.size());
  bf->upload(table.data(), tab.data(), tab.size() * sizeof(float));
  Bf16Buf proj(*bf, nw), one(*bf, nw), two(*bf, nw);
  proj.set(*bf, to_bits(randn(nw, 61)));
  one.set(*bf, to_bits(std::vector<float>(nw, 2.f)));
  two.set(*bf, to_bits(std::vector<float>(nw, -2.f)));
  size_t col = 0;
  for (int i = 0; i < 4; ++i) {
    bf->copy_block(one.ptr() + at[i], widths[i], proj.ptr() + col, width, N, widths[i]);
    col += size_t(widths[i]);
  }
  bf->srpe_apply(one.ptr() + at[0], B, Tn, H, dh, table.data(), false);
  bf->srpe_apply(one.ptr() + at[1], B, Tn, Hkv, dh, table.data(), false);
  bf->srpe_split_fwd(proj.ptr(), B, Tn, H, Hkv, dh, table.data(), nullptr, two.ptr() + at[0], two.ptr() + at[1],
                     two.ptr() + at[2], two.ptr() + at[3]);
  EXPECT_EQ(two.get(*bf), one.get(*bf));

  Bf16Buf grads(*bf, nw), rotated(*bf, nw), dproj1(*bf, nw), dproj2(*bf, nw);
  const auto g = to_bits(randn(nw, 62));
  grads.set(*bf, g);
  rotated.set(*bf, g);
  dproj1.set(*bf, to_bits(std::vector<float>(nw, 1.f)));
  dproj2.set(*bf, to_bits(std::vector<float>(nw, -1.f)));
  bf->srpe_split_bwd(grads.ptr() + at[0], grads.ptr() + at[1], grads.ptr() + at[2], grads.ptr() + at[3], B, Tn, H, Hkv,
                     dh, table.data(), nullptr, dproj2.ptr());
  EXPECT_EQ(grads.get(*bf), g);
  bf->srpe_apply(rotated.ptr() + at[0], B, Tn, H, dh, table.data(), true);
  bf->srpe_apply(rotated.ptr() + at[1], B, Tn, Hkv, dh, table.data(), true);
  col = 0;
  for (int i = 0; i < 4; ++i) {
    bf->copy_block(dproj1.ptr() + col, width, rotated.ptr() + at[i], widths[i], N, widths[i]);
    col += size_t(widths[i]);
  }
  EXPECT_EQ(dproj2.get(*bf), dproj1.get(*bf));
  EXPECT_NE(rotated.get(*bf), g);  // the rotation changed dq and dk
}

TEST(Bf16StorageOps, ForeignBf16PointerIsAnError) {
  auto bf = make_backend<float>("cpu-bf16");
  std::vector<uint16_t> host(8, 0);
  try {
    bf->scale(Ptr(host.data(), DType::BF16), 2.0f, host.size());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside this backend's allocations"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wiola
