// Making a backend and setting up the process for it: the backends by their
// start-up names, the CPU backend's memory modes and threads, and the
// launcher's local rank a GPU backend picks its device by. The interface the
// backends implement is kernels/ops.h; `model/`, `dist/` and `train/` call
// ops through it and never need this header (the trainer, the commands,
// benchmarks and tests make the backend here).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend_options.h"
#include "kernels/ops.h"

namespace wiola {

// The CPU backend for a scalar type (float for training, double for checks).
// Memory::Opaque is the debug backend "cpu-opaque": the same kernels, but its
// buffers are inaccessible to the host (PROT_NONE) except while one of its
// ops or an upload/download runs, and fresh allocations hold NaN bytes. Any
// host access to a backend buffer outside the backend crashes there, and
// reliance on zero-filled allocation shows up as NaN.
enum class CpuMemory { Host, Opaque };
template <class T>
std::unique_ptr<Ops<T>> make_cpu_ops(CpuMemory memory = CpuMemory::Host);

// A backend by its start-up name: "cpu", "cpu-opaque", "cpu-bf16" (the CPU
// kernels behind the GPU's bf16 storage types, for tests:
// kernels/cpu/bf16_storage_ops.h), and in CUDA builds "cuda" (bf16) and
// "cuda-fp32". Throws wiola::Error naming the known backends. `options`
// (kernels/backend_options.h) are the CUDA backend's switches.
template <class T>
std::unique_ptr<Ops<T>> make_backend(const std::string& name, const BackendOptions& options = {});
std::vector<std::string> backend_names();

// This process's rank on its node as the launcher says (Open MPI, Slurm,
// MPICH, or torchrun-style LOCAL_RANK); -1 when none of them is set. A GPU
// backend drives the device at this index (modulo the visible devices).
int launcher_local_rank();

// Threads of the CPU backend (OpenMP loops and OpenBLAS); n <= 0 keeps the
// runtime default. cpu_threads() reports the current count.
void set_cpu_threads(int n);
int cpu_threads();
// Best-of-`reps` GFLOP/s of an n^3 OpenBLAS sgemm on cpu_threads() threads:
// the machine's matmul rate that benchmarks report against.
double openblas_sgemm_gflops(int n, int reps);

}  // namespace wiola
