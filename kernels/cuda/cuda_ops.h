// The CUDA backend of the op interface (kernels/ops.h): cuBLAS for the
// matrix products, hand-written kernels for everything else (kernels/cuda/).
// Two precision modes (docs/gpu.md):
//   fp32  every buffer fp32, TF32 off: the exactness mode the GPU tests use
//         against the CPU backend;
//   bf16  the training default: fp32 master weights, gradients, AdamW state
//         and statistics; bf16 activations and weight copies feed GEMMs and
//         attention; the residual stream, X-tilde and the GCLA summaries
//         stay fp32; norms, softmax, loss and reductions accumulate in fp32
//         or double.
// Deterministic for a fixed configuration: no floating-point atomics;
// reductions run in a fixed order.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend_options.h"
#include "kernels/ops.h"

namespace wiola {

enum class CudaPrecision { FP32, BF16 };

// Usable CUDA devices: 0 without a driver or a GPU (never throws), so a CUDA
// build still starts and runs on the CPU on such a machine.
int cuda_device_count();
// What cuda_device_count() found, in words (for skip messages).
const char* cuda_status();

// Throws wiola::Error naming the reason when no device is usable, an option
// it does not know, or an environment variable an option replaced
// (kernels/backend_options.h).
std::unique_ptr<Ops<float>> make_cuda_ops(CudaPrecision precision, int device = 0,
                                          const BackendOptions& options = {});

// Changes a CUDA backend's options (also through a ProfiledOps around it)
// for the ops that follow: the benchmarks and tests that compare variants on
// one backend. A no-op on any other backend.
void set_cuda_backend_options(Ops<float>& ops, const BackendOptions& options);

// What a CUDA backend did with CUDA Graphs (the option cuda_graphs,
// Ops::graph): recordings made and alive, their nodes (kernels, copies,
// GEMMs), graph launches, and the bytes of the allocator's graph pool.
// Zero for any other backend.
struct CudaGraphStats {
  long captures = 0, recordings = 0, nodes = 0, launches = 0;
  size_t pool_bytes = 0;
};
CudaGraphStats cuda_graph_stats(Ops<float>& ops);

// The cudaStream_t every op of a CUDA backend runs on (the data plane orders
// its communication against it), also through a ProfiledOps around it;
// nullptr for any other backend. Code above kernels/ asks the backend-neutral
// Ops::device_stream() instead (the same handle).
void* cuda_stream_of(Ops<float>& ops);

// Which GPU a CUDA backend runs on, as "host/domain:bus:device" (its PCI
// address), so that ranks can tell whether they share one (NCCL needs one GPU
// per rank); empty for any other backend. Above kernels/: Ops::device_identity().
std::string cuda_device_identity(Ops<float>& ops);

}  // namespace wiola
