// cuDNN's fused attention (SDPA: the causal forward with its log-sum-exp
// statistics, and the backward) as a measured reference for
// wiola_kernel_bench's attention rows ("fwd cudnn", "bwd cudnn"): a
// reference, never a dependency of the step (only wiola_kernel_bench links
// it). Built with NVIDIA's header-only cuDNN frontend (pip
// nvidia-cudnn-frontend; CMake option WIOLA_CUDNN_FRONTEND) in its dynamic
// loading mode: libcudnn.so.9 is dlopen'ed by SONAME on first use, like
// cuBLAS (kernels/cuda/cublas_lib.cuh), so a host without cuDNN runs the
// bench and is told why the rows are skipped. No CUDA types in this header:
// streams and device buffers are plain pointers, so that the CUDA emulator's
// build of the bench can include it.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

namespace wiola::bench {

// A causal self-attention problem in wiola's layout (kernels/ops.h): q, o,
// dout, dq [B, T, H, dh] and k, v, dk, dv [B, T, Hkv, dh] in bf16; stats
// [B, H, T] in fp32, the natural log-sum-exp of the scaled scores (as
// Ops::attention_fwd's lse). Scale 1/sqrt(dh). GQA as cuDNN groups heads:
// query head h reads KV head h / (H / Hkv) (wiola's kernels read h % Hkv:
// the same work, another assignment; the bench's check permutes the heads).
struct SdpaShape {
  int B = 0, T = 0, H = 0, Hkv = 0, dh = 0;
};

struct SdpaTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* stats = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

// Thrown where this host cannot run the reference (no libcudnn.so.9, no
// cuDNN handle, the graph not supported): the bench records a skipped row
// with its message. Any other error is a failure.
struct CudnnUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Loads libcudnn.so.9 on the first call (thread-safe) and returns its
// version ("9.13.0"); throws CudnnUnavailable naming the loader's message.
// Needs no GPU.
std::string cudnn_version();

// The forward and backward graphs of one shape checked by the frontend for
// a card of compute capability sm_version (90: H100) without asking a
// device: their tensors, layout and options (GQA, causal, statistics)
// within cuDNN's SDPA support surface. Needs libcudnn.so.9, not a GPU;
// throws CudnnUnavailable naming what the frontend refused. (Whether the
// loaded cuDNN has an engine for them only a GPU can tell.)
void cudnn_sdpa_validate(const SdpaShape& s, int sm_version);

// The forward and backward graphs of one shape, built once (a cuDNN handle
// on `stream`, a cudaStream_t; validation, heuristics' plans), then executed
// as often as asked on that stream. Each call takes a workspace of
// workspace_bytes() device bytes.
class CudnnSdpa {
 public:
  CudnnSdpa(const SdpaShape& s, void* stream);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  size_t workspace_bytes() const;
  // o, stats from q, k, v.
  void fwd(const SdpaTensors& t, void* workspace);
  // dq, dk, dv (overwritten) from q, k, v, o, stats, dout.
  void bwd(const SdpaTensors& t, void* workspace);
  // What cuDNN chose, for the JSON: the plans' names (engine and knobs).
  std::string fwd_plan() const;
  std::string bwd_plan() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wiola::bench
