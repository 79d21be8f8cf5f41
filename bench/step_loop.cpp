// The training step every step benchmark times (bench/step_loop.h).
#include "bench/step_loop.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "util/error.h"

namespace wiola {

std::vector<int32_t> bench_tokens(int B, int T, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tok(size_t(B) * (T + 1));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t <= T; ++t) {
      const size_t i = size_t(b) * (T + 1) + t;
      const bool rep = t > 0 && (rng() % 5 == 0);
      tok[i] = rep ? tok[i - 1] : int32_t(rng() % uint64_t(V));
    }
  return tok;
}

namespace {

ModelOptions step_model_options(int batch, bool recompute) {
  ModelOptions mo;
  mo.micro_batch = batch;
  mo.recompute = recompute;
  return mo;
}

}  // namespace

StepBench::StepBench(ProfiledOps<float>& ops, const ModelConfig& cfg, int batch, bool recompute, int init_seed,
                     uint64_t token_seed)
    : ops_(ops), model_(ops, cfg, ModelShard{}, nullptr, step_model_options(batch, recompute)),
      tokens_(bench_tokens(batch, cfg.T, cfg.V, token_seed)), scale_(1.0 / (double(batch) * cfg.T)) {
  WIOLA_CHECK(batch >= 1, "step benchmark: the batch must be positive (got ", batch, ")");
  model_.init(init_seed);
  dist::AdamWConfig ac;
  ac.zero = false;
  ac.zero_grads = true;  // each step leaves them zero for the next, as the trainer does
  adam_ = std::make_unique<dist::DistAdamW>(ops, model_.params(), model_.grads(), model_.n_params(),
                                            dist::optimizer_segments(model_.layout().entries()), ac, nullptr,
                                            nullptr);
  adam_->set_weight_copy(model_.weight_copy());  // refreshed by AdamW's pass
  ops_.synchronize();
}

double StepBench::step() {
  const double loss = model_.train_micro_step(tokens_.data(), scale_) * scale_;
  adam_->step(1e-4, adam_->applied_steps() + 1);
  ops_.synchronize();
  return loss;
}

StepTimes time_steps(StepBench& bench, int warmup, int steps, const std::function<void(int)>& after_step) {
  WIOLA_CHECK(warmup >= 0 && steps >= 1, "step benchmark: steps must be positive and warm-up steps not negative");
  using Clock = std::chrono::steady_clock;
  // The timed steps run unprofiled (timing every op adds host work to a
  // launch-bound GPU step); one step after them is profiled.
  ProfiledOps<float>& prof = bench.ops();
  StepTimes r;
  for (int s = 0; s < warmup + steps + 1; ++s) {
    const bool profiled = s == warmup + steps;
    prof.enable(profiled);
    const auto t0 = Clock::now();
    const double loss = bench.step();
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    if (profiled) {
      r.profiled_step_s = took;
    } else if (s >= warmup) {
      r.seconds.push_back(took);
      r.loss = loss;
    }
    if (after_step) after_step(s);
  }
  prof.enable(false);
  r.profile = prof.profile();
  std::sort(r.seconds.begin(), r.seconds.end());
  return r;
}

}  // namespace wiola
