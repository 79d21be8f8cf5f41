// One training step of a Wiola model on the CUDA backend (forward + backward
// + AdamW): median step time, tokens/s, TFLOP/s and MFU against the device's
// bf16 dense peak (model/flops.h: one FLOP count for the whole project), peak
// device memory, and the time per op class of one more, profiled step, for
// bf16 and fp32. Used by wiola_gpu_bench (the GPU kit's program: no MPI, no
// HDF5) and by `wiola bench step --device cuda`. The step itself is
// bench/step_loop.h, as on the CPU.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend_options.h"

namespace wiola {

struct GpuStepOptions {
  std::string preset = "wiola-360m";
  int batch = 4, seq_len = 0, steps = 10, warmup = 3;
  std::string precision = "both";  // bf16, fp32 or both
  double peak_tflops = 989.0;      // H100/H200 SXM dense bf16
  bool recompute = false;
  bool atm = true;                 // false: ATM off in every layer
  BackendOptions backend;          // --attention, --attention-bwd, --gemm (bench/backend_flags.h)
};

// Prints the figures as it goes and returns them (tokens_per_s etc. under
// "bf16" / "fp32"). Without a GPU it prints why and returns {"skipped": reason}.
nlohmann::json run_gpu_step_bench(const GpuStepOptions& o);

// `wiola bench step --device cuda`: the same (throwing without a usable
// GPU), then, with `torch`, PyTorch's bf16 step of the same model on the
// same GPU (bench/torch_gpu_step.py: eager, and torch.compile when asked)
// with the python in $WIOLA_PYTHON or on the PATH, and wiola's ratio to each.
nlohmann::json run_gpu_step_bench_vs_torch(const GpuStepOptions& o, bool torch, bool torch_compile);

}  // namespace wiola
