// The run report: throughput, pipeline bubble (predicted and measured),
// communication per rank per step by group (measured and analytic) and peak
// memory of every rank; printed by world rank 0 and written to
// RUN_DIR/report.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "dist/grid.h"
#include "model/model.h"
#include "train/accounting.h"
#include "train/stragglers.h"
#include "train/trainer.h"

namespace wiola {

// What the trainer measures over steps 2.. (step 1 warms caches and pages).
struct RunMeasure {
  double busy_s = 0;   // seconds this rank computed inside the schedule
  double sched_s = 0;  // wall seconds of the schedule
  int64_t steps = 0;
  std::map<std::string, dist::CommTraffic> traffic;  // per group, summed
};

// The accounting's view of the run on this rank (train/accounting.h).
struct RunAccounting {
  DevicePeak peak;              // this rank's
  double job_peak = 0;          // FLOP/s, sum over ranks
  double step_flops = 0;        // the job's model FLOPs per step
  bool breakdown = true;        // train.accounting
  StepTimes times;              // sum over the accounted steps (2.., no dump steps)
  int64_t steps = 0;            // accounted steps
  double step_s = 0;            // their seconds, checkpoint work excluded
  double self_s = 0;            // the accounting's own seconds over the whole run
  double run_s = 0;             // all steps' seconds (the share's denominator)
  MemoryUse memory;             // this rank, measured
  perf::Memory predicted;       // this rank, the cost model's figures
  AtmSaving atm;                // last step, job-wide
  nlohmann::json backend;       // rank 0's: name, options, GEMM choices (recorded as is)
  const StragglerWatch* stragglers = nullptr;  // per-rank step times (step_time_per_rank)
};

// Collective over the world. padded_params: the flat length DP reduces
// (ZeRO pads buckets to a multiple of DP).
// atm: the ATM statistics of the last training step (taken before any
// evaluation, which runs with ATM off).
void write_run_report(dist::Grid& grid, const RunConfig& rc, const Model<float>& model,
                      size_t padded_params, bool zero, bool overlap, const TrainSummary& sum,
                      const RunMeasure& meas, const std::vector<Model<float>::AtmStats>& atm,
                      const RunAccounting& acct, const std::filesystem::path& run_dir);

}  // namespace wiola
