// Step budget and learning-rate schedule (docs/model.md §4).
#pragma once

#include <cstdint>

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

}  // namespace wiola
