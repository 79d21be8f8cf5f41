// GEMMs tuned per shape (docs/gpu.md, "GEMMs tuned per shape"): which
// algorithm computes each distinct matrix product a backend meets, chosen
// by timing candidates once on the device (kernels/cuda/gemm_tuner.cuh) and
// kept in a tuning table keyed by the device and its library versions.
// Tables live in tuning files (JSON), one table per device:
//   {"format": "wiola-gemm-tuning", "version": 1,
//    "tables": [{"device": "NVIDIA H100 80GB HBM3, sm_90, cuBLASLt 130100",
//                "choices": {"<GemmKey::str()>": {"algo": "cublaslt",
//                            "lt_algo": ["0x...", ...8], "config": "...",
//                            "us": 12.3}, ...}}]}
// A choice is "cublas" (cublasGemmEx with its default algorithm) or
// "cublaslt" with cublasLtMatmulAlgo_t's eight opaque words, valid for the
// device and library version of its table only. The committed file,
// kernels/cuda/gemm_tuning.json, is built into the program
// (committed_gemm_tuning()); wiola_kernel_bench --write-tuning writes one.
// Backend-neutral: no CUDA types here, so that train/ can move tables
// between ranks (rank 0 decides, the others take its choices).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace wiola {

// One distinct GEMM as Ops::gemm is called (row-major C[m, n] = alpha
// op(A)[m, k] op(B)[k, n] + beta C): what a choice is keyed by.
struct GemmKey {
  int m = 0, n = 0, k = 0;
  bool ta = false, tb = false;  // op = transpose
  int lda = 0, ldb = 0, ldc = 0;
  DType ab = DType::F32, c = DType::F32;  // A and B (one type), C
  bool beta_zero = true;                  // C is not read
  int align = 256;                        // bytes every operand's address is a multiple of (at most 256)
  std::string str() const;                // "NT 4096x1024x8192 ld 1024/1024/1024 bf16>f32 beta1 align256"
};

struct GemmChoice {
  std::string algo = "cublas";   // "cublas" or "cublaslt"
  std::vector<uint64_t> lt_algo;  // cublaslt: cublasLtMatmulAlgo_t's words
  std::string config;             // cublaslt: the algorithm's configuration in words (id, tile, split-K, ...)
  double us = 0;                  // its measured time per call (median), 0: not measured
  std::vector<std::string> tried;  // the sweep that chose it: each candidate, its time or why it lost
  bool operator==(const GemmChoice& o) const { return algo == o.algo && lt_algo == o.lt_algo; }
};

struct GemmTable {
  std::string device;                        // card, compute capability, library version
  std::map<std::string, GemmChoice> choices;  // GemmKey::str() -> choice
};

// A tuning file holding this one table.
std::string gemm_tuning_json(const GemmTable& t);

// The table for `device` in a tuning file's text; a table without choices
// where the text is empty or has none for it, and then *why (if given) says
// so, naming `origin` and the devices it has tables for. A text that is not
// a tuning file is a wiola::Error naming `origin`.
GemmTable gemm_table_for(const std::string& text, const std::string& device, const std::string& origin,
                         std::string* why = nullptr);

// `text` (a tuning file, or empty) with t's table put in, replacing the one
// for the same device.
std::string merge_gemm_tuning(const std::string& text, const GemmTable& t);

// The committed tuning file (kernels/cuda/gemm_tuning.json) as built in.
const char* committed_gemm_tuning();

}  // namespace wiola
