// One `wiola plan` (docs/performance.md), as launch/cmd_plan.cpp parsed it:
// the cluster and compute model asked for, the prediction of the given
// layout or the search for the best, the run estimate of the best, printed
// and, where asked, written as JSON.
#pragma once

#include <optional>
#include <string>

#include "model/config.h"
#include "perf/cost_model.h"
#include "perf/device_profile.h"
#include "perf/planner.h"

namespace wiola::perf {

// --fit-profile: a device profile fitted to the kit's benchmarks
// (fit_device_profile_files), written to `out` where given and used for the
// plan.
struct ProfileFitRequest {
  std::string bench;                    // wiola_gpu_bench's JSON (empty: no fit)
  std::string kernels;                  // wiola_kernel_bench's kernels.jsonl
  std::string build = "unknown", date;  // date empty: today (UTC)
  std::string out;
};

// The CPU transport measured by `wiola plan --calibrate-link`
// (perf/link_calibration.h), as read from its file.
struct MeasuredLink {
  std::string file;
  double gbs = 0;        // on the wire (several nodes: inside a node)
  double latency_s = 0;  // per ring step
  // Several nodes: how many, the ranks on each, and the link between them.
  int nodes = 1, per_node = 0;
  double inter_gbs = 0, inter_latency_s = 0;
};

struct PlanRequest {
  // The model: a GPT (Megatron-LM's dense one) or a Wiola configuration.
  bool is_gpt = false;
  GptConfig gpt;
  ModelConfig model;
  int global_batch = 1;          // sequences per optimizer step
  std::optional<Layout> layout;  // predict this one; none: search the best that fits
  // The devices: GPUs from the hardware table, or CPU ranks whose stage work
  // is timed here, one rank at a time.
  bool cpu = false;
  int devices = 8;
  std::string gpu = "h100", inter;  // GPU: the card and the inter-node link (empty: the card's)
  GpuComputeChoice gpu_model;
  ProfileFitRequest fit;
  int threads = 0, reps = 7;         // CPU: threads per rank (0: cores / ranks), timed repeats per stage
  std::optional<MeasuredLink> link;  // CPU: the transport measured (none: a memcpy-based guess)
  // CPU, several nodes: rank r on node r / per_node ("block": mpirun's
  // --map-by slot, Slurm's block distribution) or r % nodes ("round-robin":
  // --map-by node, cyclic).
  std::string placement = "block";
  // The run estimate and the report.
  double tokens = 0;  // training tokens (0: Chinchilla, 20 x params)
  double ckpt_minutes = 30;
  bool blocking_ckpt = false;
  int top = 10;          // layouts listed
  std::string json_out;  // also the predictions as JSON here (empty: none)
};

// Prints the plan to stdout and writes its JSON; fails (wiola::Error) on a
// given layout that wiola train would reject, or a search that finds none.
void run_plan(const PlanRequest& r);

}  // namespace wiola::perf
