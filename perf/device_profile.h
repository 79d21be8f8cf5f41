// A GPU's measured rates for the planner (docs/performance.md, "The device
// profile"): what wiola's own kernels reach on one card, fitted from the
// kit's step benchmark (wiola_gpu_bench's per-op-class times) and, where the
// kit has them, its kernel benchmark's attention rates per head dimension.
// The planner's GPU compute model times a stage as GEMM FLOPs over the GEMM
// rate, attention FLOPs over the attention rates and the memory-bound rest
// (elementwise, norms, ATM, copies, cross-entropy) per token, width and
// layer, instead of FLOPs over a guessed share of the datasheet peak.
// Profiles are committed in perf/profiles/ (one JSON file a card, with its
// date, card, build and source) and built into the program.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "perf/planner.h"

namespace wiola::perf {

struct DeviceProfile {
  std::string key;      // the accelerator key it stands for ("h100")
  std::string card;     // the device name the benchmark printed
  std::string date;     // when it was measured
  std::string build;    // the wiola commit measured
  std::string source;   // which benchmark and configuration it was fitted from
  double gemm_tflops = 0;  // the step's GEMMs (and context attention): their FLOPs over their time
  // Causal self-attention by head dimension, FLOPs as FlashAttention counts
  // them (forward 4 B H T^2 d_h / 2, backward 2.5 x forward).
  std::map<int, double> attention_fwd_tflops, attention_bwd_tflops;
  double memory_bound_ns = 0;  // the rest of the step, ns per (token x d x layer), forward + backward
  double optimizer_ns = 0;     // AdamW (and the gradient norm) per parameter
  // The attention rates at head dimension dh: the measured one, else the
  // nearest measured one (the larger on a tie).
  double attention_fwd_at(int dh) const;
  double attention_bwd_at(int dh) const;
};

DeviceProfile device_profile_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json device_profile_to_json(const DeviceProfile& p);
// The committed profile for an accelerator key, or nullptr.
const DeviceProfile* find_device_profile(const std::string& key);
// The committed profiles' files and texts (generated from perf/profiles/*.json).
const std::vector<std::pair<std::string, std::string>>& committed_profile_texts();

// What the fit reads: one configuration of wiola_gpu_bench's JSON (its
// "op_class_ms" and "top_ops"), the model and batch it ran, and optionally
// the kernel benchmark's lines (kernels.jsonl), whose attention rates of
// the variant the step used replace the step's own at their head dimension.
struct ProfileFit {
  std::string key, card, date, build, source;
  nlohmann::json step;  // {"op_class_ms": {...}, "top_ops": [...]}
  ModelConfig model;
  int batch = 0;
  bool recompute = false;
  std::vector<nlohmann::json> kernel_lines;
  std::string attention_variant = "tc";  // the kernel benchmark's variant the step runs
};
DeviceProfile fit_device_profile(const ProfileFit& f);

// The fit from the kit's files: wiola_gpu_bench's JSON (its bf16 entry; the
// preset, T, batch and recompute it ran are in it) and optionally the kernel
// benchmark's kernels.jsonl ("" for none); the card name is the one the step
// benchmark printed.
DeviceProfile fit_device_profile_files(const std::string& bench_json, const std::string& kernels_jsonl,
                                       const std::string& key, const std::string& build, const std::string& date);

// The planner's compute model on a profile (AdamW included).
std::unique_ptr<ComputeModel> profile_compute_model(const DeviceProfile& p);

// The GPU compute model `wiola plan` uses: a profile from a file when one is
// given (its key must be the cluster's device), the datasheet peak x an
// efficiency when asked, else the committed profile of the cluster's device,
// else the datasheet peak x the efficiency.
struct GpuComputeChoice {
  std::string profile_file;
  bool datasheet = false;
  double efficiency = kGpuGemmEfficiency;
};
std::unique_ptr<ComputeModel> gpu_compute_model(const Cluster& cl, const GpuComputeChoice& ch);

}  // namespace wiola::perf
