// Per-step accounting (docs/performance.md): where a step's wall time went
// on each rank, model FLOP utilisation against the device peak, memory by
// class, and what ATM saved. The trainer feeds it phase times and
// communicator wait clocks; it writes the per-step fields of metrics.jsonl,
// the log line's summary, and the run report's averages.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "dist/grid.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace wiola {

// Where one step's wall time went on this rank, seconds. The parts add up
// to `total` (other: what no part claims: loss bookkeeping, dumps, timers).
struct StepTimes {
  double compute = 0;     // forward/backward on this rank (its waits inside TP collectives taken out)
  double comm = 0;        // exposed communication: blocked in TP, DP, embedding, norm and loss collectives
  double comm_hidden = 0; // transfers that progressed behind compute: NCCL's stream time that no
                          // wait exposed; 0 over MPI (Open MPI on the CPU only progresses inside
                          // MPI calls)
  double bubble = 0;      // pipeline schedule time outside forward/backward: waiting for a
                          // neighbour's message (the transfer included) and draining sends
  double data = 0;        // waiting for the loader's next batch
  double optimizer = 0;   // AdamW (its DP and norm collectives taken out)
  double checkpoint = 0;  // the loop's part of checkpoint work after the step
  double other = 0;
  double total = 0;
  static constexpr std::array<const char*, 8> kNames = {"compute", "comm", "comm_hidden", "bubble",
                                                        "data", "optimizer", "checkpoint", "other"};
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
// FP32 with TF32 off) from perf/hardware.h; else the OpenBLAS sgemm 1024^3
// rate on this rank's threads, measured now (all ranks at once, so ranks
// that share cores see each other).
DevicePeak device_peak(const Ops<float>& ops, const RunConfig& rc);

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

}  // namespace wiola
