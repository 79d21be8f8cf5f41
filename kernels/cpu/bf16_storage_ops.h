// The debug backend "cpu-bf16": the CPU kernels behind the storage types of
// the GPU's bf16 mode (precision() as the cuda backend's: bf16 activations
// and weight copies; fp32 residual stream, master weights, gradients and
// statistics). It runs the model's bf16 plumbing (buffer types and sizes,
// conversions, weight refresh, copies, KV cache, checkpoints, TP and
// pipeline messages) on any machine, in CI, without a GPU (docs/gpu.md).
//
// Each op sees its bf16 buffers as fp32 shadows (widening is exact), and
// after the op every shadow element it changed is rounded to nearest even
// into the bf16 buffer. So an op computes in fp32 and rounds its bf16
// outputs once, as the GPU kernels do; the numerics inside an op are the CPU
// kernel's, not the GPU's (attention here keeps P in fp32, for instance).
// A shadow runs from its pointer to the end of the allocation holding it (an
// op's arguments carry no sizes): slow, meant for small models in tests.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace wiola {

std::unique_ptr<Ops<float>> make_cpu_bf16_ops();

}  // namespace wiola
