// Calibration of the planner on this CPU (docs/performance.md): single-rank
// timings only. A layout's stage work is timed by building that stage's
// model in this process — TP-local sizes, its layers, the head on the last
// stage — with TP collectives that do nothing, and running a micro-batch's
// forward and backward on the threads each rank of the layout would get,
// both alone and while the layout's other ranks' cores run copies of the
// same work (so the timing sees the caches and memory bandwidth the ranks
// share); a pipeline's stages run alone for its bubble share of the step.
// AdamW is timed per parameter, and a memcpy gives the shared-memory link's
// bandwidth. Nothing here runs more than one rank, so the measured runs the
// planner is checked against were never fitted.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "model/config.h"
#include "perf/planner.h"

namespace wiola::perf {

struct CpuCalibration {
  int threads = 1;            // per rank
  int ranks = 1;              // concurrent copies while timing
  int reps = 7;               // timed repeats (median) after two warm-ups
  double copy_gbs = 0;        // single-thread memcpy of 64 MiB
  double adam_s_per_elem = 0; // DistAdamW step, one rank, per parameter
  double sgemm_flops = 0;     // OpenBLAS sgemm 1024^3 on `threads` (the MFU peak)
};

// Stage timings measured on demand and cached by stage shape.
class CpuCompute final : public ComputeModel {
 public:
  CpuCompute(const ModelConfig& c, int threads, int reps, int ranks = 1);
  double fwd(const Workload& w, int stage) override;
  double bwd(const Workload& w, int stage) override;
  double optimizer(double elems) override { return elems * cal_.adam_s_per_elem; }
  std::string describe() const override;
  bool shares_cores() const override { return cal_.ranks > 1; }
  const CpuCalibration& calibration() const { return cal_; }

 private:
  using Key = std::tuple<int, int, int, int, bool>;  // tp, first layer, end layer, micro-batch, recompute
  // (forward, backward) seconds alone and with the other ranks' copies.
  struct Timing {
    std::pair<double, double> solo, together;
  };
  const Timing& timed(const Layout& lay, int stage);
  double blend(const Workload& w, int stage, double solo, double together) const;
  ModelConfig cfg_;
  CpuCalibration cal_;
  std::map<Key, Timing> cache_;
};

// One node of `ranks` processes sharing this machine: the link is shared
// memory (an MPI transfer copies in and out: half the memcpy rate), with an
// assumed 5 µs per collective step; the peak is the measured sgemm rate.
Cluster cpu_cluster(const CpuCalibration& cal, int ranks);

}  // namespace wiola::perf
