// Saving and resuming a run (docs/checkpoints.md): the collective protocol
// around the format of ckpt/format.h.
//
// Save at step t (every rank, at the same step):
//   snapshot   this rank's share copied to host memory: its TP/PP slice of
//              the fp32 parameters and its ZeRO slice of the AdamW moments,
//              minus what a lower rank writes (DP replicas without ZeRO,
//              TP-replicated vectors on tp > 0, the tied embedding's copy on
//              the last stage)
//   write      in a background thread: DIR/.tmp-step-N/rank-R.h5, fsynced,
//              renamed
//   commit     once every rank's write is done (agreed by the trainer's
//              per-step control all-reduce): rank 0 collects every rank's
//              outcome; when all wrote, it writes manifest.json, renames the
//              folder to DIR/step-N, moves `latest`, prunes.
// A save that fails anywhere (one rank's write, or the commit) fails on
// every rank: rank 0 removes the temporary folder (complete checkpoints and
// `latest` stay as they were) and the run goes on, saving again at the next
// checkpoint; the final save, or saves failing for checkpoint.
// max_failed_minutes, end the run with the error.
// Resume: rank 0 proposes the newest checkpoint; the ranks verify its files
// between them (size, XXH3, header); a damaged one is skipped with a warning.
// Every rank then reads exactly its new share (resharding: any layout from
// any other, through global-coordinate slices).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/format.h"
#include "ckpt/manifest.h"
#include "config/run_config.h"
#include "data/loader.h"
#include "dist/grid.h"
#include "dist/optimizer.h"
#include "model/model.h"

namespace wiola {

// What a checkpoint restores besides the tensors.
struct ResumeState {
  int64_t step = 0, tokens = 0, skipped = 0;
  long applied_steps = 0;
  LoaderState loader;
  std::string run_id;
  // The loss-spike policy's state (manifest "spike", written when `spike`;
  // absent in older checkpoints: all empty): the data windows skipped so far
  // (train.skip_batches plus the rewinds'), the rewinds made, the losses of
  // the detection window (oldest first) and the current run of consecutive
  // skipped steps.
  bool spike = false;
  std::vector<StepWindow> skip_batches;
  int64_t rewinds = 0, consecutive_skipped = 0;
  std::vector<double> recent_losses;
  // The GEMM choices the checkpoint's run computed with (manifest "gemm",
  // train/gemm_record.h; null in older checkpoints).
  nlohmann::json gemm;
  // The CPU kernels it computed with: the SIMD target and the BLAS kernels
  // (manifest "simd", "blas"; null where absent: older checkpoints, GPU runs).
  nlohmann::json simd, blas;
  // The learning-rate schedule it ran (manifest "schedule", LrSchedule::to_json)
  // and its data stages ("data_stages"; null in older checkpoints: none).
  nlohmann::json schedule, data_stages;
};

class Checkpointer {
 public:
  // Collective over grid.world(). `identity`: run_identity(); `info`: what
  // the manifest records about the run (config, layout, backend...).
  Checkpointer(const RunConfig& rc, dist::Grid& grid, Ops<float>& ops, Model<float>& model, dist::DistAdamW& adam,
               nlohmann::json identity, nlohmann::json info);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Rank 0 only, before any collective of the run (part of the agreed
  // setup): the directory exists and is writable; leftovers of interrupted
  // saves are removed.
  static void prepare_dir(const std::string& dir);

  // Collective. The newest sound checkpoint of checkpoint.dir ("" when the
  // directory holds none; throws when it holds some but none is sound).
  std::string find_resume();
  // Collective. Loads `folder` into the model, optimizer and returns the
  // state to restore; refuses a checkpoint whose identity differs.
  ResumeState resume(const std::string& folder);
  // Collective. Weights-only start (checkpoint.init_from): parameters only;
  // the model must match.
  void load_weights(const std::string& checkpoint);

  // Collective: snapshot now, write in the background (or now when
  // checkpoint.async is off). At most one save in flight: call finish()
  // first.
  void save(const ResumeState& state);
  bool in_flight() const { return writer_.joinable() || pending_; }
  // This rank's write is done (or failed: commit() tells).
  bool written();
  // This rank's background write is still running.
  bool still_writing() { return !written(); }
  // Collective, when every rank's write is done: the manifest and the
  // rename. Returns whether the checkpoint was saved (the same on every
  // rank). A failure is one warning on rank 0 and the run goes on; it ends
  // the run (wiola::Error on rank 0, dist::SetupFailed elsewhere) when the
  // save was the `final` one, or when saves have failed for
  // checkpoint.max_failed_minutes.
  bool commit(bool final = false);
  // Collective: wait for this rank's write, then commit.
  bool finish(bool final = false);

  // Rank 0: the tokenizer (tokenizer.json text) every later checkpoint
  // carries, so generation and export need nothing but the checkpoint.
  void set_tokenizer(std::string json_text, std::string sha256);

  const std::string& run_id() const { return run_id_; }
  void set_run_id(const std::string& id) { run_id_ = id; }
  double last_save_seconds() const { return last_save_s_; }  // snapshot + write + commit of the last save

 private:
  struct Share;                               // which local flat ranges this rank writes
  std::vector<ckpt::TensorPiece> snapshot();  // collective over TP (replica check)
  void check_tp_replicas(const std::vector<float>& params);
  std::vector<dist::DistAdamW::Range> owned() const;
  std::string agree_string(const std::string& mine);  // rank 0's string on every rank
  void verify_everywhere(ckpt::Reader& r, std::vector<std::string>& problems);
  void check_identity(const ckpt::Reader& r, bool weights_only) const;
  void read_params(ckpt::Reader& r);
  // Rank 0's part of commit(): the verdict on the save every rank agrees
  // on, as JSON {"error": "" (saved) or the message, "fatal": bool}.
  nlohmann::json judge_on_root(const std::vector<std::string>& reports, bool final);
  std::string failure_message(const std::string& cause, bool final, bool fatal, double minutes) const;
  nlohmann::json manifest(nlohmann::json files) const;
  void publish(const nlohmann::json& files);
  void prune() const;

  const RunConfig& rc_;
  dist::Grid& grid_;
  Ops<float>& ops_;
  Model<float>& model_;
  dist::DistAdamW& adam_;
  nlohmann::json identity_, info_;
  std::string tokenizer_json_, tokenizer_sha_;  // empty: checkpoints carry none
  std::string dir_, run_id_;
  // The save in flight.
  ResumeState saving_;
  std::thread writer_;
  bool pending_ = false;   // saved, not yet committed
  bool has_file_ = false;  // this rank writes a file
  ckpt::FileRecord record_;
  std::string write_error_;       // this rank's write failed: why
  std::atomic<bool> done_{true};  // the writer thread finished
  std::chrono::steady_clock::time_point save_t0_;
  double last_save_s_ = 0;
  // Rank 0: the newest complete checkpoint (0: none), and since when saves
  // have been failing (failing_step_ 0: the last one succeeded).
  int64_t saved_step_ = 0, failing_step_ = 0;
  std::chrono::steady_clock::time_point failing_since_;
};

}  // namespace wiola
