#include "train/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "util/error.h"

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

}  // namespace wiola
