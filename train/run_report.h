// The run report: throughput, pipeline bubble (predicted and measured),
// communication per rank per step by group (measured and analytic) and peak
// memory of every rank; printed by world rank 0 and written to
// RUN_DIR/report.json.
#pragma once

#include <filesystem>

#include "train/trainer.h"

namespace wiola {

struct RunSettings;
struct RankComms;
struct RankOptimizer;
struct RankModel;
class Accounting;

// Collective over the world: the run's figures from the Trainer's parts,
// this rank's place (`run`: layout, backend; `comms`: the data plane;
// `optimizer` and `model`: ZeRO, overlap, the flat length DP reduces) and its
// accounting (`acct`: times, traffic, MFU, memory, ATM, step times per rank).
void write_run_report(const RunSettings& run, const RankComms& comms, const RankOptimizer& optimizer,
                      const RankModel& model, const Accounting& acct, const TrainSummary& sum,
                      const std::filesystem::path& run_dir);

}  // namespace wiola
