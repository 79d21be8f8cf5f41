#include "train/accounting.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "kernels/backend.h"
#include "kernels/cpu_info.h"
#include "model/flops.h"
#include "perf/hardware.h"
#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/rank_optimizer.h"
#include "train/run_settings.h"
#include "train/stragglers.h"
#include "util/files.h"
#include "util/trace.h"

namespace wiola {

void StepTimes::add(const StepTimes& o) {
  compute += o.compute;
  comm += o.comm;
  comm_hidden += o.comm_hidden;
  bubble += o.bubble;
  data += o.data;
  optimizer += o.optimizer;
  checkpoint += o.checkpoint;
  other += o.other;
  total += o.total;
}

WaitClock WaitClock::read(dist::Grid& grid) {
  using dist::GroupKind;
  WaitClock w;
  for (auto k : {GroupKind::Tp, GroupKind::Pp, GroupKind::Dp, GroupKind::Embed, GroupKind::Mp, GroupKind::World}) {
    const dist::CommTraffic t = grid.traffic(k);
    (k == GroupKind::Pp ? w.pp : w.other) += t.wait_s;
    w.busy += t.busy_s;
  }
  return w;
}

DevicePeak device_peak(const Ops<float>& ops, const RunConfig& rc) {
  DevicePeak p;
  char buf[256];
  if (rc.train.peak_tflops > 0) {
    p.flops = rc.train.peak_tflops * 1e12;
    p.source = "train.peak_tflops";
    return p;
  }
  const std::string dev = ops.device_name();
  if (!dev.empty()) {
    if (const perf::Accelerator* a = perf::find_accelerator(dev)) {
      const bool bf16 = ops.precision().act == DType::BF16;
      p.flops = (bf16 ? a->bf16_tflops : a->fp32_tflops) * 1e12;
      std::snprintf(buf, sizeof buf, "%s dense %s datasheet peak (%s)", a->name.c_str(), bf16 ? "BF16" : "FP32",
                    dev.c_str());
      p.source = buf;
      return p;
    }
    p.source = "no datasheet peak for '" + dev + "': set train.peak_tflops (MFU not reported)";
    return p;
  }
  return cpu_peak();
}

DevicePeak cpu_peak() {
  DevicePeak p;
  char buf[320];
  const int cores = std::min(cpu_threads(), int(std::max(1u, std::thread::hardware_concurrency())));
  const CpuFmaPeak fma = cpu_fma_peak(cores);
  const double probe = openblas_sgemm_gflops(1024, 5) * 1e9;
  if (fma.flops >= probe) {
    p.flops = fma.flops;
    std::snprintf(buf, sizeof buf,
                  "FMA peak of %d core%s x %.2f GHz (%s) x %d FMA units x %d fp32 lanes x 2; an OpenBLAS sgemm "
                  "1024^3 probe at start: %.1f GFLOP/s",
                  cores, cores == 1 ? "" : "s", fma.ghz, fma.clock_source.c_str(), fma.fma_units, fma.lanes,
                  probe / 1e9);
  } else {  // the host names a clock below the one it runs at
    p.flops = probe;
    std::snprintf(buf, sizeof buf,
                  "OpenBLAS sgemm 1024^3 on %d thread%s, measured at start (above the FMA peak %.1f GFLOP/s of the "
                  "clock the host names, %.2f GHz)",
                  cpu_threads(), cpu_threads() == 1 ? "" : "s", fma.flops / 1e9, fma.ghz);
  }
  p.source = buf;
  return p;
}

AtmSaving atm_saving(const std::vector<Model<float>::AtmStats>& stats, const ModelConfig& c, int micro_batch,
                     int micro_batches) {
  AtmSaving s;
  const double per_layer = attention_step_flops(c, micro_batch) / c.L * micro_batches;
  for (const auto& a : stats) {
    s.mu_sum += a.mu;
    s.layers += 1;
    s.saved_flops += (1.0 - a.visible_fraction) * per_layer;
  }
  return s;
}

// ---- Accounting ------------------------------------------------------------------
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::map<std::string, dist::CommTraffic> traffic_snapshot(dist::Grid& grid) {
  using dist::GroupKind;
  std::map<std::string, dist::CommTraffic> s;
  for (auto k : {GroupKind::Tp, GroupKind::Pp, GroupKind::Dp, GroupKind::Embed, GroupKind::Mp})
    s[dist::group_name(k)] = grid.traffic(k);
  return s;
}

// Phases that read the communicators' wait clocks.
bool waits(Phase p) { return p == Phase::Schedule || p == Phase::Optimizer; }

}  // namespace

// Each phase is also a span of the timeline (util/trace.h: recorded on the
// traced steps, an NVTX range on a GPU) with the accounting's own times.
Accounting::Scope::Scope(Accounting& a, Phase p, std::string name) : a_(a), p_(p) {
  if (p == Phase::Schedule) a.busy_ = 0;
  if (waits(p)) w0_ = WaitClock::read(*a.comms_.grid);
  if (trace::wanted()) {
    name_ = name.empty() ? phase_name(p) : std::move(name);
    trace::push_range(name_.c_str());
  }
  t0_ = Clock::now();
}

Accounting::Scope::~Scope() {
  if ((p_ == Phase::Compute || p_ == Phase::Optimizer) && a_.sync_phases_) a_.run_.ops.synchronize();
  const Clock::time_point t1 = Clock::now();
  a_.close(p_, std::chrono::duration<double>(t1 - t0_).count(), w0_);
  if (name_.empty()) return;
  trace::record(p_ == Phase::Compute ? "compute" : "phase", std::move(name_), t0_, t1);
  trace::pop_range();
}

const char* Accounting::phase_name(Phase p) {
  switch (p) {
    case Phase::Data: return "data";
    case Phase::Schedule: return "schedule";
    case Phase::Compute: return "compute";
    case Phase::Comm: return "embedding sum and loss";
    case Phase::Optimizer: return "optimizer";
    case Phase::Checkpoint: return "checkpoint";
  }
  return "?";
}

Accounting::Accounting(const RunSettings& run, RankComms& comms, const RankModel& model, const RankOptimizer& optimizer)
    : run_(run),
      comms_(comms),
      model_(model),
      optimizer_(optimizer),
      stragglers_(std::make_unique<StragglerWatch>(run.rc, run.world)) {}

Accounting::~Accounting() = default;

// On the timeline an action is named as dist::to_string writes it (F3.1:
// forward of micro-batch 3 on chunk 1; B, I (input) and W (weight) backward).
void Accounting::compute_begins(const dist::Action& a) {
  compute_.emplace(*this, Phase::Compute, trace::wanted() ? dist::to_string(a) : std::string());
}
void Accounting::compute_ends(const dist::Action&) { compute_.reset(); }

void Accounting::measure_peak() {
  Ops<float>& ops = run_.ops;
  dist::Comm& world = run_.world;
  sync_phases_ = run_.rc.train.accounting && !ops.host_accessible();
  step_flops_ = train_step_flops(run_.rc.model, int(run_.GB));
  if (world.size() > 1) world.barrier();
  peak_ = device_peak(ops, run_.rc);
  job_peak_ = world.size() > 1 ? world.all_reduce_value(peak_.flops, dist::ReduceOp::Sum) : peak_.flops;
}

bool Accounting::breakdown() const { return run_.rc.train.accounting; }

void Accounting::begin_step(bool measured) {
  t0_ = Clock::now();
  cur_ = StepTimes{};
  measured_ = measured;
  traffic0_ = traffic_snapshot(*comms_.grid);
}

void Accounting::close(Phase p, double seconds, const WaitClock& w0) {
  switch (p) {
    case Phase::Data: cur_.data += seconds; break;
    case Phase::Compute: busy_ += seconds; break;
    case Phase::Comm: cur_.comm += seconds; break;
    case Phase::Checkpoint:
      cur_.checkpoint = seconds;
      cur_.total += seconds;
      break;
    case Phase::Schedule: {
      if (measured_) {
        measure_.busy_s += busy_;
        measure_.sched_s += seconds;
      }
      // Waits outside the pipeline group happen inside forward/backward (TP).
      const WaitClock waited = WaitClock::read(*comms_.grid) - w0;
      cur_.compute = busy_ - waited.other;
      cur_.comm = waited.other;
      cur_.comm_hidden = waited.hidden();
      cur_.bubble = seconds - busy_;
      // ATM's figures of this step (before any evaluation, which runs with
      // ATM off); TP ranks share the decisions, so tp rank 0 speaks for them.
      SelfTimer self(self_s_);
      step_atm_ = run_.me.tp == 0 ? atm_saving(model_.atm_stats(), run_.rc.model, run_.B, run_.m) : AtmSaving{};
      break;
    }
    case Phase::Optimizer: {
      const WaitClock w = WaitClock::read(*comms_.grid) - w0;
      cur_.optimizer = seconds - (w.pp + w.other);
      cur_.comm += w.pp + w.other;
      cur_.comm_hidden += w.hidden();
      break;
    }
  }
}

double Accounting::end_step() {
  if (measured_) {  // what each group moved in this step
    for (const auto& [k, v] : traffic_snapshot(*comms_.grid)) {
      auto& acc = measure_.traffic[k];
      acc.ops += v.ops - traffic0_.at(k).ops;
      acc.payload_bytes += v.payload_bytes - traffic0_.at(k).payload_bytes;
      acc.wire_bytes += v.wire_bytes - traffic0_.at(k).wire_bytes;
    }
    ++measure_.steps;
  }
  cur_.total = seconds_since(t0_);
  return cur_.total;
}

void Accounting::close_step(int64_t t, bool accounted, int64_t last_step) {
  {
    SelfTimer self(self_s_);
    cur_.set_other();
    if (accounted) {
      acc_times_.add(cur_);
      acc_step_s_ += cur_.total - cur_.checkpoint;
      ++acc_steps_;
    }
  }
  stragglers_->after_step(t, cur_, accounted, last_step);
}

void Accounting::count_run_step(int64_t t, double seconds) {
  train_s_ += seconds;
  ema_step_s_ = t == 1 ? seconds : 0.9 * ema_step_s_ + 0.1 * seconds;
}

void Accounting::keep_atm_stats() { atm_stats_ = model_.atm_stats(); }

MemoryUse Accounting::memory_use() const {
  const auto mm = model_.memory();
  MemoryUse u;
  u.params = double(mm.master + mm.weights);
  u.grads = double(mm.grads);
  u.optimizer = double(optimizer_.adam->state_bytes_this_rank());
  u.activations = double(mm.activations + mm.workspace);
  u.peak = run_.ops.host_accessible() ? peak_rss_mib() * 1048576.0 : double(run_.ops.peak_bytes());
  return u;
}

}  // namespace wiola
