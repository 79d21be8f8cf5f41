// `wiola bench step` on the CPU: forward + backward + AdamW of one training
// step (bench/step_loop.h) on a CPU backend, against the measured OpenBLAS
// sgemm rate, the same rate on exactly the step's own GEMM shapes, and the
// PyTorch reference (bench/torch_step.py) on the same configuration and
// threads.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace wiola {

struct CpuStepOptions {
  std::string preset = "wiola-bench";
  int batch = 8, seq_len = 0, threads = 2, steps = 5, warmup = 2;
  std::string backend = "cpu";  // cpu, cpu-opaque, cpu-bf16
  bool recompute = false;
  bool atm = true;
  bool torch = true;  // also time the PyTorch reference
};

// Prints the figures as it goes and returns them (step_ms, tokens_per_s,
// sgemm_fraction, ratio_vs_torch, ...).
nlohmann::json run_cpu_step_bench(const CpuStepOptions& o);

}  // namespace wiola
