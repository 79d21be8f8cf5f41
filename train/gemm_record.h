// What the run's matrix products computed with (issue 32; docs/gpu.md
// "GEMMs tuned per shape"): recorded in the run report (backend.gemm) and in
// every checkpoint's manifest ("gemm"), so that a resume computes with the
// same algorithms, and says so when it cannot. The record:
//   {"mode":    the backend option gemm ("cublas", "cublaslt", "auto"), or
//               "none" for a backend with no choice of GEMM (the CPU's),
//    "device":  the device's name (Ops::device_name; "" on the CPU),
//    "default": what a GEMM without a per-shape choice runs,
//    "table_device": auto: the tuning table's key (card, compute capability,
//               cuBLASLt version); else "",
//    "choices": auto: {GemmKey::str(): "cublas" or "cublaslt <config>"},
//               the algorithm of each GEMM shape of the table in use; else {},
//    "tuning":  auto: that table as a tuning file (kernels/gemm_tuning.h),
//               what a resume adopts; else null}
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend_options.h"
#include "kernels/ops.h"

namespace wiola {

nlohmann::json gemm_record(const Ops<float>& ops, const BackendOptions& options);

// How a checkpoint's record (`saved`) differs from this run's (`now`) in
// what decides a GEMM's bits: "" when they compute alike (or `saved` is
// null: a checkpoint from before records existed), else a sentence naming
// the difference (mode, device, table key, or the shapes whose choice
// differs, the first few of them).
std::string gemm_record_difference(const nlohmann::json& saved, const nlohmann::json& now);

}  // namespace wiola
