// The PyTorch baselines the step benchmarks compare against: runs
// bench/torch_step.py (CPU) or bench/torch_gpu_step.py (GPU) on the same
// model and returns the figures it prints.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace wiola {

// Runs `python` on the repository's bench/<script> with `args` and returns
// the JSON of its last {...} line; null (with its output printed) when it
// failed. `env` ("NAME=value ...", shell words) is set for the script alone.
nlohmann::json run_torch_baseline(const std::string& python, const std::string& script, const std::string& args,
                                  const std::string& env = "");

// The model's shape and the timing options as both baseline scripts take
// them.
std::string torch_model_args(const ModelConfig& cfg, int batch, int steps, int warmup);

}  // namespace wiola
