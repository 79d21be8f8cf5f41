// The CUDA backend's choice of algorithm per GEMM (the backend option gemm,
// kernels/backend_options.h; docs/gpu.md "GEMMs tuned per shape"):
//   cublas    cublasGemmEx with its default algorithm, every GEMM;
//   cublaslt  cuBLASLt with its heuristic's first candidate (gemm_lt.cuh);
//   auto      the choice of the tuning table in use (kernels/gemm_tuning.h:
//             the committed one for this device at first, then the one
//             adopted), checked against cublasGemmEx the first time it runs
//             (a choice whose product differs beyond the tolerance is
//             dropped, with a message). A GEMM the table has no choice for
//             is swept the first time it comes: cublasGemmEx and cuBLASLt's
//             candidates (kCandidates, and split-K forms for GEMMs with few
//             output tiles) each checked against cublasGemmEx, then timed
//             (CUDA events, kReps calls after one), the fastest that passed
//             recorded as measured; the GEMM itself runs cublasGemmEx until
//             a table with its choice is adopted (adopt(): the trainer
//             adopts rank 0's after the first step, so that every rank
//             computes with the same algorithms).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>

#include "kernels/backend_options.h"
#include "kernels/cuda/gemm_lt.cuh"
#include "kernels/gemm_tuning.h"

namespace wiola::cuda {

class GemmTuner {
 public:
  static constexpr int kCandidates = 8, kReps = 5;
  GemmTuner(CachingAllocator& mem, cudaStream_t stream, cublasHandle_t blas, int device);
  ~GemmTuner();

  // The backend option train.cuda_gemm: cublas, cublaslt or auto.
  void set_mode(GemmMode mode);
  // Runs g the way the mode says; key: g as Ops::gemm was called.
  void gemm(const BlasGemm& g, GemmKey key);

  // The table in use with the measured choices added (a tuning file's text);
  // "" unless the mode is auto.
  std::string table() const;
  // Takes the choices of a tuning file's table for this device; a table for
  // another device or library version is ignored with a message.
  void adopt(const std::string& text, const std::string& origin);
  const std::string& device() const { return device_; }

 private:
  cublasStatus_t run(const BlasGemm& g, const GemmChoice& c);
  void run_default(const BlasGemm& g);
  GemmLt& lt();
  GemmChoice sweep(const BlasGemm& g, const GemmKey& key);
  // Runs c into a scratch copy of C and compares it with cublasGemmEx's
  // product (ref, on the host); "" when it passes, else why not.
  std::string verify(const BlasGemm& g, const GemmChoice& c, const std::vector<float>& ref);
  std::vector<float> reference(const BlasGemm& g);
  double time_us(const BlasGemm& g, const GemmChoice& c);

  CachingAllocator& mem_;
  cudaStream_t stream_;
  cublasHandle_t blas_;
  int sms_ = 0;
  GemmMode mode_ = GemmMode::Cublas;
  std::string device_;
  std::unique_ptr<GemmLt> lt_;
  GemmTable in_use_, measured_;
  std::map<std::string, bool> checked_;      // auto: choices in use that passed their check
  std::map<std::string, LtAlgo> heuristic_;  // cublaslt: the first candidate per GEMM
};

}  // namespace wiola::cuda
