// The cpu-opaque debug backend: its memory is inaccessible to the host
// outside its own functions (a read or a write crashes), fresh allocations
// hold NaN bytes, and through upload/download and the ops it computes exactly
// what the host-memory backend computes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "util/error.h"

namespace wiola {
namespace {

class OpaqueDeath : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(OpaqueDeath, HostReadOfABackendBufferCrashes) {
  auto ops = make_backend<float>("cpu-opaque");
  Buffer<float> b(*ops, 16);
  ops->zero(b.data(), b.bytes());
  EXPECT_DEATH(
      {
        volatile float x = b.data()[3];
        (void)x;
      },
      "");
}

TEST_F(OpaqueDeath, HostWriteOfABackendBufferCrashes) {
  auto ops = make_backend<float>("cpu-opaque");
  Buffer<float> b(*ops, 16);
  EXPECT_DEATH({ b.data()[0] = 1.0f; }, "");
}

// The memory is mapped in 2 MiB pages (cheap protection switches): a buffer
// that ends inside a partly used huge page, and one after a freed block, are
// still out of the host's reach.
TEST_F(OpaqueDeath, EveryHugePageIsProtected) {
  auto ops = make_backend<float>("cpu-opaque");
  auto big = std::make_unique<Buffer<float>>(*ops, size_t(3) << 18);  // 3 MiB
  Buffer<float> small(*ops, 16);
  ops->zero(small.data(), small.bytes());
  EXPECT_DEATH({ big->data()[(size_t(3) << 18) - 1] = 1.0f; }, "");
  EXPECT_DEATH({ small.data()[15] = 1.0f; }, "");
  big.reset();
  Buffer<float> reused(*ops, size_t(3) << 18);
  EXPECT_DEATH({ reused.data()[0] = 1.0f; }, "");
  std::vector<float> h(16);
  ops->download(h.data(), reused.data(), h.size() * sizeof(float));
  for (float v : h) EXPECT_TRUE(std::isnan(v));  // a reused block is filled afresh
}

TEST(Opaque, FreshAllocationsAreNaNNotZero) {
  auto ops = make_backend<float>("cpu-opaque");
  Buffer<float> b(*ops, 1000);
  std::vector<float> h(1000, 0.0f);
  ops->download(h.data(), b.data(), b.bytes());
  for (float v : h) ASSERT_TRUE(std::isnan(v));
  ops->zero(b.data(), b.bytes());
  ops->download(h.data(), b.data(), b.bytes());
  for (float v : h) ASSERT_EQ(v, 0.0f);
}

TEST(Opaque, OpsMatchTheHostBackendExactly) {
  auto host = make_backend<float>("cpu");
  auto opq = make_backend<float>("cpu-opaque");
  EXPECT_TRUE(host->host_accessible());
  EXPECT_FALSE(opq->host_accessible());
  EXPECT_TRUE(opq->precision().separate_weights);  // GEMM weights in a refreshed copy
  const int m = 37, n = 29, k = 41;
  std::vector<float> a(size_t(m) * k), w(size_t(n) * k);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11f * float(i));
  auto run = [&](Ops<float>& ops) {
    Buffer<float> A(ops, a.size()), W(ops, w.size()), C(ops, size_t(m) * n), G(ops, size_t(m) * n);
    Buffer<float, double> acc(ops, 1);
    ops.upload(A.data(), a.data(), A.bytes());
    ops.upload(W.data(), w.data(), W.bytes());
    ops.gemm(Trans::N, Trans::T, m, n, k, 1.0f, A.data(), k, W.data(), k, 0.0f, C.data(), n);
    ops.gelu_fwd(C.data(), C.size(), G.data());
    ops.zero(acc.data(), acc.bytes());
    ops.sum_squares(G.data(), G.size(), acc.data());
    std::vector<float> out(C.size());
    ops.download(out.data(), G.data(), G.bytes());
    double s = 0;
    ops.download(&s, acc.data(), sizeof s);
    out.push_back(float(s));
    return out;
  };
  EXPECT_EQ(run(*host), run(*opq));
}

TEST(Opaque, ABufferOfAnotherDtypeIsRejected) {
  auto ops = make_backend<float>("cpu-opaque");
  DynBuffer<float> b(*ops, DType::BF16, 8);
  EXPECT_THROW(ops->scale(b.data(), 2.0f, 8), Error);
}

TEST(Opaque, UnknownBackendNamesTheKnownOnes) {
  try {
    make_backend<float>("gpu");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: cpu, cpu-opaque"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wiola
