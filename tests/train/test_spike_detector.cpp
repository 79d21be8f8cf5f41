// The loss-spike detector (train/spike_detector.h) on loss sequences: the
// k-sigma limit from both sides, a window not yet full, runs of skipped
// steps, non-finite losses, and its state through the manifest's fields.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "train/spike_detector.h"

namespace wiola {
namespace {

// A window of 4 losses 1, 2, 3, 4: mean 2.5, population std sqrt(1.25).
constexpr double kMean = 2.5;
const double kStd = std::sqrt(1.25);

SpikeDetector filled(double sigma, int skipped = 0) {
  SpikeDetector d({sigma, 4, skipped});
  for (double x : {1.0, 2.0, 3.0, 4.0}) EXPECT_FALSE(d.step(x, false).rewind) << x;
  return d;
}

TEST(SpikeDetector, LossAboveKSigmaRewindsBelowDoesNot) {
  const double limit = kMean + 3 * kStd;  // 5.854...
  SpikeDetector below = filled(3);
  EXPECT_FALSE(below.check(std::nextafter(limit, 0.0), false).rewind);
  EXPECT_FALSE(below.check(limit, false).rewind) << "the limit itself is not above it";
  SpikeDetector above = filled(3);
  const SpikeVerdict v = above.check(std::nextafter(limit, 10.0), false);
  EXPECT_TRUE(v.rewind);
  EXPECT_EQ(v.reason, "loss spike: 5.8541 > mean 2.5 + 3 x std 1.118 of the last 4 steps");
  // A spike is not accepted into the window: the same loss is a spike again.
  EXPECT_TRUE(above.step(7.0, false).rewind);
  EXPECT_EQ(above.state().recent_losses, (std::vector<double>{1, 2, 3, 4}));
  // Low losses never rewind.
  EXPECT_FALSE(filled(3).check(-100.0, false).rewind);
  // k scales the limit: 1 sigma.
  EXPECT_TRUE(filled(1).check(kMean + kStd + 1e-9, false).rewind);
  EXPECT_FALSE(filled(1).check(kMean + kStd - 1e-9, false).rewind);
}

TEST(SpikeDetector, SlidingWindowKeepsTheLastLosses) {
  SpikeDetector d = filled(3);
  EXPECT_FALSE(d.step(5.0, false).rewind);  // mean 2.5 + 3 x 1.118 = 5.85 > 5
  EXPECT_EQ(d.state().recent_losses, (std::vector<double>{2, 3, 4, 5}));
  // Now mean 3.5, std 1.118: limit 6.854.
  EXPECT_FALSE(d.check(6.85, false).rewind);
  EXPECT_TRUE(d.check(6.86, false).rewind);
}

TEST(SpikeDetector, NoLossCheckUntilTheWindowIsFull) {
  SpikeDetector d({3, 4, 0});
  EXPECT_FALSE(d.step(1.0, false).rewind);
  EXPECT_FALSE(d.step(1.0, false).rewind);
  EXPECT_FALSE(d.step(1.0, false).rewind);
  EXPECT_FALSE(d.step(1000.0, false).rewind) << "3 losses in a window of 4: no check yet";
  // Full now (1, 1, 1, 1000): the next is judged.
  EXPECT_TRUE(d.check(1e6, false).rewind);
  // sigma = 0: no loss check at all, however full the window.
  SpikeDetector off = filled(0);
  EXPECT_FALSE(off.check(1e30, false).rewind);
  EXPECT_EQ(off.state().recent_losses.size(), 4u);
}

TEST(SpikeDetector, ConsecutiveSkippedStepsRewind) {
  SpikeDetector d({0, 4, 3});
  EXPECT_FALSE(d.step(NAN, true).rewind);
  EXPECT_FALSE(d.step(NAN, true).rewind);
  EXPECT_EQ(d.state().consecutive_skipped, 2);
  EXPECT_FALSE(d.step(2.0, false).rewind) << "a trained step ends the run";
  EXPECT_EQ(d.state().consecutive_skipped, 0);
  EXPECT_FALSE(d.step(NAN, true).rewind);
  EXPECT_FALSE(d.step(INFINITY, true).rewind);
  const SpikeVerdict v = d.step(NAN, true);
  EXPECT_TRUE(v.rewind);
  EXPECT_EQ(v.reason, "3 consecutive skipped steps (train.spike_skipped = 3)");
  // Still skipping: rewinds again (the run is the trainer's to restore).
  EXPECT_TRUE(d.step(NAN, true).rewind);
  EXPECT_EQ(d.state().consecutive_skipped, 4);
  // Skipped steps never join the window, whatever their loss.
  EXPECT_EQ(d.state().recent_losses, std::vector<double>{2.0});
  SpikeDetector f({0, 4, 0});  // spike_skipped = 0: off
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(f.step(NAN, true).rewind);
}

TEST(SpikeDetector, SkippedStepsTakePrecedenceAndAreNotLossChecked) {
  // A skipped step's finite loss far above the limit is not a loss spike...
  SpikeDetector d = filled(3, 2);
  EXPECT_FALSE(d.check(1e9, true).rewind);
  // ...but the second skipped step in a row is a rewind, named as such.
  const SpikeVerdict v = d.check(1e9, true);
  EXPECT_TRUE(v.rewind);
  EXPECT_EQ(v.reason.rfind("2 consecutive skipped steps", 0), 0u) << v.reason;
}

TEST(SpikeDetector, NonFiniteLossesAreNeitherJudgedNorKept) {
  SpikeDetector d = filled(3);
  for (double x : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()})
    EXPECT_FALSE(d.step(x, false).rewind) << x;
  EXPECT_EQ(d.state().recent_losses, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(d.state().consecutive_skipped, 0);
  // A window without spread: std 0, any higher loss is a spike, the same is not.
  SpikeDetector flat({2, 3, 0});
  for (int i = 0; i < 3; ++i) flat.step(2.0, false);
  EXPECT_FALSE(flat.check(2.0, false).rewind);
  EXPECT_TRUE(flat.check(std::nextafter(2.0, 3.0), false).rewind);
}

TEST(SpikeDetector, StateRoundTripsThroughTheManifestFields) {
  // Odd values (not short decimals) to prove the JSON text keeps every bit.
  SpikeDetector a({2.5, 5, 3});
  const std::vector<double> losses = {10.123456789012345, 9.87654321, 9.5 + 1e-13, 9.25, 9.1, 9.05};
  for (double x : losses) a.step(x, false);
  a.step(NAN, true);
  a.step(NAN, true);
  nlohmann::json spike = {{"skip_batches", nlohmann::json::array()}, {"rewinds", 0}};
  spike_state_to_json(a.state(), spike);
  EXPECT_EQ(spike.at("consecutive_skipped"), 2);
  EXPECT_EQ(spike.at("recent_losses").size(), 5u);
  const nlohmann::json back = nlohmann::json::parse(spike.dump());
  SpikeDetector b({2.5, 5, 3}, spike_state_from_json(back, "manifest.json: "));
  EXPECT_EQ(b.state().recent_losses, a.state().recent_losses);
  EXPECT_EQ(b.state().consecutive_skipped, 2);
  // The same future verdicts, reasons included: a third skipped step...
  const SpikeVerdict va = a.check(NAN, true), vb = b.check(NAN, true);
  EXPECT_TRUE(va.rewind);
  EXPECT_EQ(va.reason, vb.reason);
  // ...and from the restored state of before it, a loss spike.
  SpikeDetector c({2.5, 5, 3}, spike_state_from_json(back, "manifest.json: "));
  c.restore({c.state().recent_losses, 0});
  const SpikeVerdict vc = c.check(20.0, false);
  EXPECT_TRUE(vc.rewind);
  EXPECT_NE(vc.reason.find("of the last 5 steps"), std::string::npos) << vc.reason;
  // A mistyped field is named.
  nlohmann::json bad = back;
  bad["consecutive_skipped"] = "two";
  try {
    spike_state_from_json(bad, "m.json: ");
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("m.json: spike.consecutive_skipped"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wiola
