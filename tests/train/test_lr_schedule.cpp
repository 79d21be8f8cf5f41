// The learning-rate schedules (train/lr_schedule.h): WSD against its formula
// at every step of every decay shape, cosine unchanged, and which resumes may
// change a schedule (lr_jump).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "config/run_config.h"
#include "tests/util/error_of.h"
#include "train/lr_schedule.h"

namespace wiola {
namespace {

TrainSection wsd(int64_t decay_steps, double decay_share, DecayShape shape) {
  TrainSection tr;
  tr.lr_schedule = LrScheduleKind::Wsd;
  tr.decay_steps = decay_steps;
  tr.decay_share = decay_share;
  tr.decay_shape = shape;
  tr.lr_max = 3e-4;
  tr.lr_min = 3e-5;
  return tr;
}

// docs/model.md §4's formula, written out independently of LrSchedule::at.
double formula(int64_t t, int64_t t_max, int64_t warmup, int64_t decay, DecayShape shape, double hi, double lo) {
  if (t <= warmup) return hi * double(t) / double(warmup);
  const int64_t start = t_max - decay;
  if (t <= start) return hi;
  const double p = double(t - start) / double(decay);
  const double f = shape == DecayShape::Linear   ? 1.0 - p
                   : shape == DecayShape::Cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * p))
                                                 : 1.0 - std::sqrt(p);
  return lo + (hi - lo) * f;
}

TEST(LrSchedule, WsdEqualsItsFormulaAtEveryStep) {
  for (const DecayShape shape : {DecayShape::Linear, DecayShape::Cosine, DecayShape::OneMinusSqrt})
    for (const auto& [t_max, warmup, decay_steps, share, decay] :
         std::initializer_list<std::tuple<int64_t, int64_t, int64_t, double, int64_t>>{
             {1000, 50, 0, 0.2, 200},    // a share of T_max
             {1000, 50, 123, 0.2, 123},  // decay_steps wins
             {97, 5, 0, 0.25, 24},       // 24.25 rounds to 24
             {10, 9, 0, 0.5, 1},         // the share clipped to T_max - T_w
             {40, 0, 40, 0.2, 40},       // no warmup, decay from the start
             {30, 3, 0, 0.0, 0}}) {      // no decay: lr_max to the end
      const TrainSection tr = wsd(decay_steps, share, shape);
      const LrSchedule s = LrSchedule::of(tr, t_max, warmup);
      ASSERT_EQ(s.decay_start, t_max - decay) << t_max << " " << share;
      for (int64_t t = 1; t <= t_max; ++t)
        ASSERT_NEAR(s.at(t), formula(t, t_max, warmup, decay, shape, tr.lr_max, tr.lr_min), 1e-18)
            << "step " << t << " of " << t_max << ", shape " << to_string(shape);
      EXPECT_EQ(s.at(t_max), decay > 0 ? tr.lr_min : tr.lr_max);
      for (int64_t t = warmup + 1; t < t_max; ++t) ASSERT_LE(s.at(t + 1), s.at(t)) << "step " << t;
    }
}

TEST(LrSchedule, CosineIsLrAtBitForBit) {
  TrainSection tr;
  tr.lr_min = 1e-5;
  const LrSchedule s = LrSchedule::of(tr, 1000, 50);
  for (int64_t t = 1; t <= 1000; ++t) ASSERT_EQ(s.at(t), lr_at(t, 1000, 50, tr.lr_max, tr.lr_min));
  // The manifest's "schedule" as before train.lr_schedule.
  EXPECT_EQ(s.to_json(), (nlohmann::json{{"t_max", 1000}, {"warmup", 50}, {"lr_max", 3e-4}, {"lr_min", 1e-5}}));
}

TEST(LrSchedule, DecayLongerThanTheRunIsRefused) {
  const std::string e = test::error_of([] { (void)LrSchedule::of(wsd(96, 0.2, DecayShape::Linear), 100, 5); });
  EXPECT_NE(e.find("train.decay_steps (96) must not exceed T_max - T_w = 100 - 5 = 95"), std::string::npos) << e;
}

TEST(LrSchedule, ManifestRoundTrip) {
  const LrSchedule s = LrSchedule::of(wsd(30, 0.2, DecayShape::Cosine), 100, 5);
  const LrSchedule r = LrSchedule::from_json(s.to_json(), "m");
  for (int64_t t = 1; t <= 100; ++t) ASSERT_EQ(r.at(t), s.at(t));
  EXPECT_EQ(r.to_json(), s.to_json());
}

// A stable-phase checkpoint may be extended (more steps) or branched into a
// decay that starts at or after its step; nothing may move the rate it has.
TEST(LrSchedule, ResumeMayExtendOrBranchButNotJump) {
  const TrainSection tr = wsd(0, 0.2, DecayShape::OneMinusSqrt);
  const LrSchedule run = LrSchedule::of(tr, 100, 10);            // stable to step 80
  EXPECT_EQ(lr_jump(run, LrSchedule::of(tr, 200, 10), 50), "");  // twice the steps: stable to 160
  TrainSection branch = tr;
  branch.decay_steps = 20;
  EXPECT_EQ(lr_jump(run, LrSchedule::of(branch, 70, 10), 50), "");             // the decay from step 50 on
  const std::string early = lr_jump(run, LrSchedule::of(branch, 60, 10), 50);  // it would have started at 40
  EXPECT_NE(early.find("the learning rate at step 50 would jump"), std::string::npos) << early;
  EXPECT_NE(early.find("T_max (train.steps / train.tokens) 100 -> 60"), std::string::npos) << early;
  EXPECT_NE(early.find("the decay's start (train.decay_steps / train.decay_share) step 80 -> 40"), std::string::npos);
  TrainSection hotter = tr;
  hotter.lr_max = 6e-4;
  EXPECT_NE(lr_jump(run, LrSchedule::of(hotter, 100, 10), 50).find("train.lr_max 0.0003 -> 0.0006"), std::string::npos);
  // In the decay already: a longer run would move the rate.
  EXPECT_NE(lr_jump(run, LrSchedule::of(tr, 200, 10), 90), "");
  // Cosine to WSD moves it; cosine to cosine is not checked (docs/checkpoints.md).
  const LrSchedule cosine = LrSchedule::of(TrainSection{}, 100, 10);
  EXPECT_NE(lr_jump(cosine, run, 50).find("train.lr_schedule \"cosine\" -> \"wsd\""), std::string::npos);
  EXPECT_EQ(lr_jump(cosine, LrSchedule::of(TrainSection{}, 300, 10), 50), "");
}

TEST(LrSchedule, ConfigKeys) {
  const RunConfig rc = run_config_from_toml_text(
      "[train]\nlr_schedule = \"wsd\"\ndecay_shape = \"linear\"\ndecay_steps = 7\n", "t.toml");
  EXPECT_EQ(rc.train.lr_schedule, LrScheduleKind::Wsd);
  EXPECT_EQ(rc.train.decay_shape, DecayShape::Linear);
  const std::string bad =
      test::error_of([] { (void)run_config_from_toml_text("[train]\ndecay_shape = \"sqrt\"\n", "t.toml"); });
  EXPECT_NE(bad.find("t.toml:2:15: train.decay_shape: must be \"linear\", \"cosine\" or \"1-sqrt\""), std::string::npos)
      << bad;
  const std::string share =
      test::error_of([] { (void)run_config_from_toml_text("[train]\ndecay_share = 1.5\n", "t.toml"); });
  EXPECT_NE(share.find("train.decay_share must be in [0, 1] (got 1.5)"), std::string::npos) << share;
}

}  // namespace
}  // namespace wiola
