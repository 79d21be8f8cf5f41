#include "train/accounting.h"

#include <cstdio>

#include "kernels/backend.h"
#include "model/flops.h"
#include "perf/hardware.h"
#include "util/files.h"

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
      std::snprintf(buf, sizeof buf, "%s dense %s datasheet peak (%s)", a->name.c_str(),
                    bf16 ? "BF16" : "FP32", dev.c_str());
      p.source = buf;
      return p;
    }
    p.source = "no datasheet peak for '" + dev + "': set train.peak_tflops (MFU not reported)";
    return p;
  }
  p.flops = openblas_sgemm_gflops(1024, 5) * 1e9;
  std::snprintf(buf, sizeof buf, "OpenBLAS sgemm 1024^3 on %d thread%s, measured at start", cpu_threads(),
                cpu_threads() == 1 ? "" : "s");
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

}  // namespace wiola
