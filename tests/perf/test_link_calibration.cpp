// The CPU transport's fit (perf/link_calibration.h): exact on points made by
// the model it fits, refused on points that cannot separate its two terms.
#include <gtest/gtest.h>

#include "perf/link_calibration.h"
#include "util/error.h"

namespace wiola::perf {
namespace {

TEST(LinkCalibration, FitRecoversLatencyAndRate) {
  const double latency = 7.5e-6, rate = 3.2e9;
  std::vector<LinkPoint> pts;
  for (int p : {2, 4})
    for (double bytes = 4096; bytes <= 16.0 * 1048576; bytes *= 4)
      for (double steps : {2.0 * (p - 1), double(p - 1)}) {
        const double wire = steps / p * bytes;
        pts.push_back({steps, wire, latency * steps + wire / rate});
      }
  const LinkFit f = fit_link(pts);
  EXPECT_NEAR(f.latency_s, latency, 1e-12);
  EXPECT_NEAR(f.bytes_per_s / rate, 1.0, 1e-9);
}

TEST(LinkCalibration, FitHoldsBothTermsPositive) {
  // Times that fall with size would give a negative rate: held at 1 TB/s.
  const LinkFit f = fit_link({{2, 1e3, 2e-3}, {2, 1e6, 1e-3}, {2, 1e7, 5e-4}});
  EXPECT_GT(f.latency_s, 0);
  EXPECT_DOUBLE_EQ(f.bytes_per_s, 1e12);
}

TEST(LinkCalibration, FitRefusesPointsThatCannotSeparateTheTerms) {
  EXPECT_THROW(fit_link({{2, 1e3, 1e-5}}), Error);
  EXPECT_THROW(fit_link({{2, 1e3, 1e-5}, {4, 2e3, 2e-5}}), Error);  // proportional: one direction only
}

}  // namespace
}  // namespace wiola::perf
