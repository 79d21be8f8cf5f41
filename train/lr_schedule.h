// Step budget and learning-rate schedules: cosine and warmup-stable-decay
// (docs/model.md §4).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "config/run_config.h"

namespace wiola {

// Chinchilla: D = 20 N tokens, T_max = ceil(D / (global_batch * T)).
int64_t chinchilla_steps(int64_t n_params, int64_t global_batch, int64_t T);
// Steps for a token budget: ceil(tokens / (global_batch * T)).
int64_t steps_for_tokens(int64_t tokens, int64_t global_batch, int64_t T);
// T_w = floor((T_max + 10) / 20) (0.05 T_max rounded half up).
int64_t default_warmup(int64_t t_max);
// eta(t), t = 1..T_max: linear warmup to lr_max over T_w steps, then cosine
// to lr_min at T_max.
double lr_at(int64_t t, int64_t t_max, int64_t warmup, double lr_max, double lr_min);
// A WSD decay's factor at progress p in (0, 1]: 1 at p = 0, 0 at p = 1.
double decay_factor(DecayShape shape, double p);

// A run's schedule, resolved: eta(t) for t = 1..T_max.
//   cosine: lr_at above.
//   wsd:    t <= T_w: lr_max t / T_w; T_w < t <= S: lr_max; S < t <= T_max:
//           lr_min + (lr_max - lr_min) decay_factor(shape, (t - S) / (T_max - S)),
//           with S = T_max - D the decay's start (its last step at lr_max) and
//           D = train.decay_steps, else round(train.decay_share T_max), at
//           most T_max - T_w.
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::Cosine;
  DecayShape shape = DecayShape::OneMinusSqrt;
  int64_t t_max = 0, warmup = 0;
  int64_t decay_start = 0;  // wsd: S
  double lr_max = 0, lr_min = 0;

  // Throws naming the keys when train.decay_steps does not fit T_max - T_w.
  static LrSchedule of(const TrainSection& tr, int64_t t_max, int64_t warmup);
  double at(int64_t t) const;

  // The checkpoint manifest's "schedule" (older manifests lack "lr_schedule":
  // cosine).
  nlohmann::json to_json() const;
  static LrSchedule from_json(const nlohmann::json& j, const std::string& where);
};

// A resume at checkpoint step `step` under `now` of a checkpoint written
// under `then`: "" when the rate at that step is the same (the schedule goes
// on from there without a jump), else what differs, naming the keys. Cosine
// on both sides is never refused (its keys may change on a resume,
// docs/checkpoints.md).
std::string lr_jump(const LrSchedule& then, const LrSchedule& now, int64_t step);

}  // namespace wiola
