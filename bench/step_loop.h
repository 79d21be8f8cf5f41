// The training step every step benchmark times: `wiola bench step` on the
// CPU (bench/cpu_step_run.h), the GPU step benchmark (bench/gpu_step_run.h,
// wiola_gpu_bench and the kit). One model on one backend, AdamW as the
// trainer runs it (the gradients zeroed and the weight copy refreshed in its
// own pass), and one micro-batch of tokens with runs of repeats (as
// bench/torch_step.py and bench/torch_gpu_step.py) so that ATM merges some
// pairs. No MPI, no HDF5: it travels to a GPU machine in the kit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dist/optimizer.h"
#include "kernels/profiled_ops.h"
#include "model/model.h"

namespace wiola {

// B sequences of T + 1 tokens below V: each token repeats the one before it
// with probability 1/5, else is uniform.
std::vector<int32_t> bench_tokens(int B, int T, int V, uint64_t seed);

class StepBench {
 public:
  // `ops`: the backend, wrapped so that one step can be profiled.
  StepBench(ProfiledOps<float>& ops, const ModelConfig& cfg, int batch, bool recompute, int init_seed = 1,
            uint64_t token_seed = 7);
  // One step (forward + backward + AdamW), finished on the device; the mean
  // loss per token.
  double step();
  Model<float>& model() { return model_; }
  ProfiledOps<float>& ops() { return ops_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  ProfiledOps<float>& ops_;
  Model<float> model_;
  std::unique_ptr<dist::DistAdamW> adam_;
  std::vector<int32_t> tokens_;
  double scale_;
};

struct StepTimes {
  std::vector<double> seconds;  // the timed steps, sorted
  double loss = 0;              // of the last timed step
  OpProfile profile;            // one more step, each op timed
  double profiled_step_s = 0;   // that step's wall time
  double median() const { return seconds[seconds.size() / 2]; }
};

// `warmup` untimed steps, `steps` timed ones, then one profiled step.
// after_step(s) runs after step s (0-based, all of them): the GPU benchmark
// reads the device's memory there and adopts its GEMM choices after step 0.
StepTimes time_steps(StepBench& bench, int warmup, int steps, const std::function<void(int)>& after_step = {});

}  // namespace wiola
