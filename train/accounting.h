// Per-step accounting (docs/performance.md): where a step's wall time went
// on each rank, model FLOP utilisation against the device peak, memory by
// class, and what ATM saved. The Trainer's `Accounting` part times the step's
// phases as scopes (`auto p = acct.phase(Phase::Optimizer);`) with the
// communicator wait clocks; its figures feed the per-step fields of
// metrics.jsonl, the log line's summary, and the run report's averages.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "dist/grid.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "train/schedule_runner.h"

namespace wiola {

// Where one step's wall time went on this rank, seconds. The parts add up
// to `total` (other: what no part claims: loss bookkeeping, dumps, timers).
struct StepTimes {
  double compute = 0;      // forward/backward on this rank (its waits inside TP collectives taken out)
  double comm = 0;         // exposed communication: blocked in TP, DP, embedding, norm and loss collectives
  double comm_hidden = 0;  // transfers that progressed behind compute: NCCL's stream time that no
                           // wait exposed; 0 over MPI (Open MPI on the CPU only progresses inside
                           // MPI calls)
  double bubble = 0;       // pipeline schedule time outside forward/backward: waiting for a
                           // neighbour's message (the transfer included) and draining sends
  double data = 0;         // waiting for the loader's next batch
  double optimizer = 0;    // AdamW (its DP and norm collectives taken out)
  double checkpoint = 0;   // the loop's part of checkpoint work after the step
  double other = 0;
  double total = 0;
  static constexpr std::array<const char*, 8> kNames = {"compute", "comm",      "comm_hidden", "bubble",
                                                        "data",    "optimizer", "checkpoint",  "other"};
  std::array<double, 8> parts() const {
    return {compute, comm, comm_hidden, bubble, data, optimizer, checkpoint, other};
  }
  void add(const StepTimes& o);
  void set_other() { other = total - (compute + comm + bubble + data + optimizer + checkpoint); }
};

// Seconds this rank has spent blocked on communication so far: in the
// pipeline group (receives are waits for a neighbour) and everywhere else.
// busy: seconds transfers ran on a device stream (NCCL), exposed or not.
struct WaitClock {
  double pp = 0, other = 0, busy = 0;
  static WaitClock read(dist::Grid& grid);
  WaitClock operator-(const WaitClock& o) const { return {pp - o.pp, other - o.other, busy - o.busy}; }
  // Device transfer time that no wait exposed (0 over MPI).
  double hidden() const { return std::max(0.0, busy - pp - other); }
};

// The peak FLOP/s MFU is measured against, for this rank.
struct DevicePeak {
  double flops = 0;
  std::string source;  // how it was found, for the report
};
// train.peak_tflops if set; else a GPU's dense datasheet peak (BF16, or
// FP32 with TF32 off) from perf/hardware.h; else cpu_peak().
DevicePeak device_peak(const Ops<float>& ops, const RunConfig& rc);
// The CPU's: the FMA peak of this rank's cores (kernels/cpu_info.h: threads,
// at most the host's, x clock x FMA units x lanes x 2), which no step
// exceeds; where the OpenBLAS sgemm 1024^3 rate measured now (all ranks at
// once) is higher, the host named too low a clock, and that rate is the peak.
DevicePeak cpu_peak();

// This rank's memory by class, bytes, and its peak (resident set on the
// CPU, the allocator's peak on a device).
struct MemoryUse {
  double params = 0, grads = 0, optimizer = 0, activations = 0, peak = 0;
};

// ATM over this rank's layers in the last training forward: the summed mu
// (share of keys merged away) and the causal-attention FLOPs the merges
// skipped (forward + backward) for the step's micro-batches.
struct AtmSaving {
  double mu_sum = 0, layers = 0, saved_flops = 0;
};
AtmSaving atm_saving(const std::vector<Model<float>::AtmStats>& stats, const ModelConfig& c, int micro_batch,
                     int micro_batches);

// A scope's wall seconds added to a counter: the accounting times itself so
// its cost is a measured share of the step, not a guess.
class SelfTimer {
 public:
  explicit SelfTimer(double& acc) : acc_(acc), t0_(std::chrono::steady_clock::now()) {}
  ~SelfTimer() { acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  SelfTimer(const SelfTimer&) = delete;
  SelfTimer& operator=(const SelfTimer&) = delete;

 private:
  double& acc_;
  std::chrono::steady_clock::time_point t0_;
};

// What the trainer measures over steps 2.. (step 1 warms caches and pages).
struct RunMeasure {
  double busy_s = 0;   // seconds this rank computed inside the schedule
  double sched_s = 0;  // wall seconds of the schedule
  int64_t steps = 0;
  std::map<std::string, dist::CommTraffic> traffic;  // per group, summed
};

// The parts of a step that Accounting::phase times (into StepTimes).
enum class Phase {
  Data,        // the loader's next batch (test hooks' delays included)
  Schedule,    // the pipeline schedule: compute, exposed waits and bubble
  Compute,     // one forward or backward action inside the schedule (the runner's observer)
  Comm,        // communication outside schedule and optimizer (embedding sum, loss)
  Optimizer,   // AdamW (its DP and norm collectives taken out)
  Checkpoint,  // the loop's checkpoint work after the step
};

struct RunSettings;
struct RankComms;
struct RankModel;
struct RankOptimizer;
class StragglerWatch;

// The Trainer's accounting part: the step in progress, sums over the
// accounted steps (2.., not dump steps, not skipped data), the job-wide
// view of the last, the run's seconds and the MFU denominator. As the
// schedule runner's observer it times each action's compute (Phase::Compute).
class Accounting final : public ScheduleObserver {
 public:
  // A phase of the step in progress, closed when the scope ends. On a
  // device backend with train.accounting, compute and optimizer phases
  // synchronise at their end so that the time is the work's.
  class Scope {
   public:
    // name: the span's on the timeline (util/trace.h); empty: the phase's.
    Scope(Accounting& a, Phase p, std::string name = {});
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Accounting& a_;
    Phase p_;
    std::chrono::steady_clock::time_point t0_;
    WaitClock w0_;
    std::string name_;  // on the timeline (util/trace.h), when wanted
  };

  // Reads WIOLA_SLOW_RANK (the straggler watch); no collective. It reads
  // the groups' traffic and wait clocks of comms' grid, the model's memory
  // and ATM statistics, the optimizer's state size.
  Accounting(const RunSettings& run, RankComms& comms, const RankModel& model, const RankOptimizer& optimizer);
  ~Accounting() override;
  // The MFU denominator (collective): every rank finds its peak at the same
  // time (ranks that share cores measure their share), the job's is the sum.
  void measure_peak();

  [[nodiscard]] Scope phase(Phase p) { return Scope(*this, p); }
  // The name a phase has on the timeline (train.trace_steps).
  static const char* phase_name(Phase p);
  // The runner's actions: each compute a Phase::Compute.
  void compute_begins(const dist::Action&) override;
  void compute_ends(const dist::Action&) override;
  // A step starts (its times reset); `measured`: its schedule time and
  // traffic count into the run's measurements (steps 2.., no dump steps).
  void begin_step(bool measured);
  // The step's maths is done: its traffic counted, its wall seconds so far.
  double end_step();
  // After the step's checkpoint work: closes its times, adds them to the
  // run's when `accounted`, and feeds the straggler watch (collective at
  // log steps).
  void close_step(int64_t t, bool accounted, int64_t last_step);
  // Step t's seconds into the run's time and its moving mean (the ETA).
  void count_run_step(int64_t t, double seconds);
  // ATM's per-layer statistics of the last training step (before any
  // evaluation, which runs with ATM off), for the report.
  void keep_atm_stats();

  // For the Trainer's loss sum: ATM's figures ride along with it.
  const AtmSaving& step_atm() const { return step_atm_; }
  AtmSaving& job_atm() { return atm_; }

  bool breakdown() const;                               // train.accounting
  const StepTimes& step_times() const { return cur_; }  // this step, this rank
  const AtmSaving& atm() const { return atm_; }         // last step, job-wide
  const DevicePeak& peak() const { return peak_; }
  double job_peak() const { return job_peak_; }      // FLOP/s, sum over ranks
  double step_flops() const { return step_flops_; }  // the job's model FLOPs per step
  const StepTimes& accounted_times() const { return acc_times_; }
  int64_t accounted_steps() const { return acc_steps_; }
  double accounted_seconds() const { return acc_step_s_; }  // checkpoint work excluded
  double self_seconds() const { return self_s_; }           // the accounting's own, whole run
  double run_seconds() const { return train_s_; }           // all steps' seconds
  double ema_step_seconds() const { return ema_step_s_; }
  const RunMeasure& measure() const { return measure_; }
  const std::vector<Model<float>::AtmStats>& atm_stats() const { return atm_stats_; }
  const StragglerWatch& stragglers() const { return *stragglers_; }
  // This rank's memory by class, measured.
  MemoryUse memory_use() const;

 private:
  void close(Phase p, double seconds, const WaitClock& w0);

  const RunSettings& run_;
  RankComms& comms_;
  const RankModel& model_;
  const RankOptimizer& optimizer_;
  std::unique_ptr<StragglerWatch> stragglers_;
  bool sync_phases_ = false;  // a device backend: synchronise at phase ends
  DevicePeak peak_;           // this rank's MFU denominator
  double job_peak_ = 0, step_flops_ = 0;
  StepTimes cur_, acc_times_;  // this step, this rank; sum over accounted steps
  int64_t acc_steps_ = 0;
  double acc_step_s_ = 0, self_s_ = 0;                 // accounted steps' seconds; the accounting's own
  double busy_ = 0;                                    // compute seconds of the schedule in progress
  bool measured_ = false;                              // the step in progress counts into measure_
  std::chrono::steady_clock::time_point t0_;           // the step's start
  std::optional<Scope> compute_;                       // the runner's action in progress
  std::map<std::string, dist::CommTraffic> traffic0_;  // the groups' traffic at the step's start
  RunMeasure measure_;
  AtmSaving step_atm_, atm_;  // this rank's last step; job-wide (summed with the loss)
  double train_s_ = 0, ema_step_s_ = 0;
  std::vector<Model<float>::AtmStats> atm_stats_;  // of the last training step
};

}  // namespace wiola
