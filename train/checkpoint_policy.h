// The Trainer's checkpoint part (docs/checkpoints.md): the setup's checks of
// checkpoint.dir, the resume (or a weights-only start from
// checkpoint.init_from) and the tokenizer every checkpoint carries; after
// each step the control all-reduce (stop requests, a save due by the clock,
// writes still running), commits of finished background writes and new
// saves; the way back to the newest checkpoint for a loss-spike rewind. The
// collective save/resume protocol itself is train/checkpointer.h's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "train/checkpointer.h"

namespace wiola {

struct RunSettings;
struct TrainData;
struct RankComms;
struct RankModel;
struct RankOptimizer;
struct StageLayers;

class CheckpointPolicy {
 public:
  // A save reads and a resume writes the model and the optimizer, with the
  // grid's collectives; the data's loader gives the run's identity, the
  // layers what a manifest records of the layout.
  CheckpointPolicy(const RunSettings& run, const TrainData& data, RankComms& comms, RankModel& model,
                   RankOptimizer& optimizer, const StageLayers& layers);
  ~CheckpointPolicy();

  // Part of the agreed setup (no collective): checkpoint.dir prepared (rank
  // 0) and not another run's; checkpoint.init_from names a checkpoint.
  static void check_setup(const RunConfig& rc, int world_rank);
  // Collective. Resumes from checkpoint.dir's newest sound checkpoint and
  // returns its state for the Trainer to restore (the model and optimizer
  // are loaded already), or starts from checkpoint.init_from's weights (a
  // resume wins: a preempted fine-tuning run continues from its own
  // checkpoints). Nothing without checkpoint.dir and init_from.
  std::optional<ResumeState> setup();

  // Saves are on (checkpoint.dir is set).
  bool on() const { return ckpt_ != nullptr; }
  // After step t (collective): the per-step control all-reduce, commits of
  // finished background writes, new saves of `state()`. `local_stop`: this
  // rank was asked to stop. Returns true when the run must stop (a stop
  // was requested and saved before the last step).
  bool after_step(int64_t t, bool local_stop, const std::function<ResumeState()>& state);
  // Collective: back to the newest checkpoint, which must be an earlier
  // one (before step t) of this run; `at` names the reason in errors.
  ResumeState rewind(int64_t t, const std::string& at, std::string& folder);

  int64_t resumed_from() const { return resumed_from_; }  // 0: a fresh start
  // The resumed checkpoint's GEMM record (train/gemm_record.h); null: none.
  const nlohmann::json& resumed_gemm() const { return resumed_gemm_; }

 private:
  void attach_tokenizer();
  void check_lr_schedule(const std::string& folder, const ResumeState& st) const;
  void check_data_stages(const std::string& folder, const ResumeState& st) const;

  const RunSettings& run_;
  const TrainData& data_;
  RankComms& comms_;
  RankModel& model_;
  RankOptimizer& optimizer_;
  const StageLayers& layers_;
  std::unique_ptr<Checkpointer> ckpt_;  // checkpoint.dir or init_from set
  std::chrono::steady_clock::time_point last_save_ = std::chrono::steady_clock::now();
  int64_t resumed_from_ = 0;
  int saves_ = 0;
  nlohmann::json resumed_gemm_;
};

}  // namespace wiola
