// The CPU's MFU denominator (train/accounting.h cpu_peak): a peak no step
// exceeds, so MFU stays at or below 100 %. Checked against the rates of the
// matrix products at a run's own shapes (wiola-tiny's, micro-batch 8) on the
// test's thread count: the best of a few repeats of each must not beat it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "kernels/backend.h"
#include "kernels/cpu_info.h"
#include "train/accounting.h"

namespace wiola {
namespace {

double best_gemm_rate(Ops<float>& ops, int m, int n, int k) {
  Buffer<float> a(ops, size_t(m) * k), b(ops, size_t(n) * k), c(ops, size_t(m) * n);
  std::vector<float> host(std::max({a.size(), b.size(), c.size()}));
  for (size_t i = 0; i < host.size(); ++i) host[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  ops.upload(a.data(), host.data(), a.bytes());
  ops.upload(b.data(), host.data(), b.bytes());
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ops.gemm(Trans::N, Trans::T, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
    ops.synchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * m * double(n) * k / best;
}

TEST(Accounting, CpuPeakBoundsTheRunsGemms) {
  const RunConfig rc = run_config_from_toml_text("[model]\npreset = \"wiola-tiny\"\n", "t.toml");
  auto ops = make_cpu_ops<float>();
  const DevicePeak peak = device_peak(*ops, rc);
  ASSERT_GT(peak.flops, 0);
  EXPECT_TRUE(peak.source.find("FMA peak of ") == 0 || peak.source.find("OpenBLAS sgemm 1024^3") == 0) << peak.source;
  const int tokens = rc.train.micro_batch * rc.model.T;
  const ModelConfig& c = rc.model;
  for (const auto& [n, k] : {std::pair{c.d, c.d}, {c.dB, c.d}, {c.d, c.dB}, {c.V, c.d}}) {
    const double rate = best_gemm_rate(*ops, tokens, n, k);
    EXPECT_LE(rate, peak.flops) << tokens << " x " << n << " x " << k << ": " << rate / 1e9
                                << " GFLOP/s above the peak, " << peak.source;
  }
}

TEST(Accounting, FmaPeakIsItsProduct) {
  const CpuFmaPeak p = cpu_fma_peak(3);
  ASSERT_GT(p.ghz, 0) << "no clock found";
  EXPECT_FALSE(p.clock_source.empty());
  EXPECT_TRUE(p.lanes == 4 || p.lanes == 8 || p.lanes == 16) << p.lanes;
  EXPECT_DOUBLE_EQ(p.flops, 3 * p.ghz * 1e9 * 2 * p.lanes * 2);
}

}  // namespace
}  // namespace wiola
