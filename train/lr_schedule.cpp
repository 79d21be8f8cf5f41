#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "util/error.h"
#include "util/json.h"

namespace wiola {

int64_t steps_for_tokens(int64_t tokens, int64_t global_batch, int64_t T) {
  WIOLA_CHECK(tokens > 0 && global_batch > 0 && T > 0, "token budget needs positive sizes");
  const int64_t per_step = global_batch * T;
  return (tokens + per_step - 1) / per_step;
}

int64_t chinchilla_steps(int64_t n_params, int64_t global_batch, int64_t T) {
  return steps_for_tokens(20 * n_params, global_batch, T);
}

int64_t default_warmup(int64_t t_max) { return (t_max + 10) / 20; }

double lr_at(int64_t t, int64_t t_max, int64_t warmup, double lr_max, double lr_min) {
  if (t <= warmup) return lr_max * double(t) / double(warmup);
  if (t_max <= warmup) return lr_max;
  const double progress = double(t - warmup) / double(t_max - warmup);
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + std::cos(std::numbers::pi * progress));
}

double decay_factor(DecayShape shape, double p) {
  switch (shape) {
    case DecayShape::Linear: return 1.0 - p;
    case DecayShape::Cosine: return 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    case DecayShape::OneMinusSqrt: return 1.0 - std::sqrt(p);
  }
  return 0.0;
}

LrSchedule LrSchedule::of(const TrainSection& tr, int64_t t_max, int64_t warmup) {
  LrSchedule s;
  s.kind = tr.lr_schedule;
  s.shape = tr.decay_shape;
  s.t_max = t_max;
  s.warmup = warmup;
  s.lr_max = tr.lr_max;
  s.lr_min = tr.lr_min;
  if (s.kind != LrScheduleKind::Wsd) return s;
  const int64_t room = std::max<int64_t>(0, t_max - warmup);
  WIOLA_CHECK(tr.decay_steps <= room, "train.decay_steps (", tr.decay_steps, ") must not exceed T_max - T_w = ", t_max,
              " - ", warmup, " = ", room, " (the decay starts after the warmup)");
  const int64_t shared = int64_t(std::floor(tr.decay_share * double(t_max) + 0.5));
  const int64_t decay = tr.decay_steps > 0 ? tr.decay_steps : std::min(shared, room);
  s.decay_start = t_max - decay;
  return s;
}

double LrSchedule::at(int64_t t) const {
  if (kind == LrScheduleKind::Cosine) return lr_at(t, t_max, warmup, lr_max, lr_min);
  if (t <= warmup) return lr_max * double(t) / double(warmup);
  if (t <= decay_start) return lr_max;
  if (t >= t_max) return lr_min;
  const double p = double(t - decay_start) / double(t_max - decay_start);
  return lr_min + (lr_max - lr_min) * decay_factor(shape, p);
}

nlohmann::json LrSchedule::to_json() const {
  nlohmann::json j = {{"t_max", t_max}, {"warmup", warmup}, {"lr_max", lr_max}, {"lr_min", lr_min}};
  if (kind == LrScheduleKind::Cosine) return j;  // as before the key
  j["lr_schedule"] = to_string(kind);
  j["decay_shape"] = to_string(shape);
  j["decay_start"] = decay_start;
  return j;
}

LrSchedule LrSchedule::from_json(const nlohmann::json& j, const std::string& where) {
  LrSchedule s;
  try {
    s.t_max = json_int<int64_t>(j.at("t_max"), where + ".t_max");
    s.warmup = json_int<int64_t>(j.at("warmup"), where + ".warmup");
    s.lr_max = j.at("lr_max").get<double>();
    s.lr_min = j.at("lr_min").get<double>();
    if (!j.contains("lr_schedule")) return s;
    const auto kind = parse_enum<LrScheduleKind>(j.at("lr_schedule").get<std::string>());
    const auto shape = parse_enum<DecayShape>(j.at("decay_shape").get<std::string>());
    WIOLA_CHECK(kind && shape, where, ": unknown lr_schedule or decay_shape");
    s.kind = *kind;
    s.shape = *shape;
    s.decay_start = json_int<int64_t>(j.at("decay_start"), where + ".decay_start");
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": ", e.what());
  }
  return s;
}

namespace {
// "train.steps 100 -> 200 (T_max), ..." for each part that differs.
std::string schedule_changes(const LrSchedule& a, const LrSchedule& b) {
  std::string out;
  const auto add = [&](bool differs, const std::string& what) {
    if (differs) out += (out.empty() ? "" : ", ") + what;
  };
  add(a.kind != b.kind, detail::concat("train.lr_schedule \"", to_string(a.kind), "\" -> \"", to_string(b.kind), "\""));
  add(a.t_max != b.t_max, detail::concat("T_max (train.steps / train.tokens) ", a.t_max, " -> ", b.t_max));
  add(a.warmup != b.warmup, detail::concat("train.warmup ", a.warmup, " -> ", b.warmup));
  add(a.lr_max != b.lr_max, detail::concat("train.lr_max ", a.lr_max, " -> ", b.lr_max));
  add(a.lr_min != b.lr_min, detail::concat("train.lr_min ", a.lr_min, " -> ", b.lr_min));
  add(a.kind == b.kind && a.kind == LrScheduleKind::Wsd && a.decay_start != b.decay_start,
      detail::concat("the decay's start (train.decay_steps / train.decay_share) step ", a.decay_start, " -> ",
                     b.decay_start));
  add(a.kind == b.kind && a.kind == LrScheduleKind::Wsd && a.shape != b.shape,
      detail::concat("train.decay_shape \"", to_string(a.shape), "\" -> \"", to_string(b.shape), "\""));
  return out;
}
}  // namespace

std::string lr_jump(const LrSchedule& then, const LrSchedule& now, int64_t step) {
  if (then.kind == LrScheduleKind::Cosine && now.kind == LrScheduleKind::Cosine) return "";
  const double a = then.at(step), b = now.at(step);
  if (std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b))) return "";
  return detail::concat("the learning rate at step ", step, " would jump from ", a, " to ", b, " (",
                        schedule_changes(then, now), ")");
}

}  // namespace wiola
