// The GPU training-step benchmark (bench/gpu_step_run.h).
#include "bench/gpu_step_run.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/step_loop.h"
#include "bench/torch_baseline.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/profiled_ops.h"
#include "model/flops.h"
#include "util/env.h"
#include "util/error.h"

namespace {

using Clock = std::chrono::steady_clock;

size_t device_used_bytes() {
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  return total_b - free_b;
}

struct Result {
  double setup_s = 0;  // model init, upload and the optimizer's state
  double step_ms = 0, tokens_per_s = 0, tflops = 0, mfu = 0, loss = 0, peak_gib = 0;
  wiola::OpProfile profile;  // one more step, each op between two events
  double profiled_step_s = 0;
  nlohmann::json gemm_tuning;    // gemm = auto: the choices used
  wiola::CudaGraphStats graphs;  // cuda_graphs = layers: what was recorded and replayed
};

Result bench(wiola::CudaPrecision p, const wiola::ModelConfig& cfg, const wiola::BackendOptions& backend, int batch,
             bool recompute, int warmup, int steps, double peak_tflops) {
  const auto t_setup = Clock::now();
  auto cuda = wiola::make_cuda_ops(p, 0, backend);
  wiola::ProfiledOps<float> prof(*cuda);
  wiola::StepBench step(prof, cfg, batch, recompute);
  Result r;
  r.setup_s = std::chrono::duration<double>(Clock::now() - t_setup).count();
  std::printf("    set up in %.1f s; %d warm-up and %d timed steps\n", r.setup_s, warmup, steps);
  size_t peak = 0;
  const wiola::StepTimes t = wiola::time_steps(step, warmup, steps, [&](int s) {
    peak = std::max(peak, device_used_bytes());
    // gemm = auto: the first step swept the GEMMs it met; the others use the
    // choices (as the trainer has its ranks adopt rank 0's after step 1).
    if (s == 0) cuda->adopt_gemm_tuning(cuda->gemm_tuning());
  });
  if (const std::string g = cuda->gemm_tuning(); !g.empty()) r.gemm_tuning = nlohmann::json::parse(g);
  r.graphs = wiola::cuda_graph_stats(*cuda);
  r.loss = t.loss;
  r.profile = t.profile;
  r.profiled_step_s = t.profiled_step_s;
  const double step_s = t.median();
  r.step_ms = step_s * 1e3;
  r.tokens_per_s = double(batch) * cfg.T / step_s;
  r.tflops = wiola::train_step_flops(cfg, batch) / step_s / 1e12;
  r.mfu = r.tflops / peak_tflops;
  r.peak_gib = double(peak) / double(1u << 30);
  return r;
}

}  // namespace

nlohmann::json wiola::run_gpu_step_bench(const GpuStepOptions& o) {
  if (cuda_device_count() == 0) {
    std::printf("GPU step benchmark: skipped: %s\n", cuda_status());
    return {{"skipped", cuda_status()}};
  }
  WIOLA_CHECK(o.precision == "bf16" || o.precision == "fp32" || o.precision == "both",
              "GPU step benchmark: precision must be bf16, fp32 or both (got '", o.precision, "')");
  WIOLA_CHECK(o.batch >= 1 && o.steps >= 1 && o.warmup >= 0, "GPU step benchmark: batch and steps must be positive");
  ModelConfig cfg = model_preset(o.preset);
  if (o.seq_len > 0) cfg.T = o.seq_len;
  if (!o.atm) cfg.atm = false;
  cfg.validate();
  std::printf("GPU step benchmark: %s (%lld parameters, T=%d), batch %d, %s%s%s, attention %s/%s, gemm %s\n  %s\n",
              o.preset.c_str(), (long long)cfg.param_count(), cfg.T, o.batch, o.precision.c_str(),
              o.recompute ? ", recompute" : "", cfg.atm ? "" : ", ATM off", to_string(o.backend.attention).data(),
              to_string(o.backend.attention_bwd).data(), to_string(o.backend.gemm).data(), cuda_status());
  nlohmann::json out = {{"preset", o.preset},
                        {"T", cfg.T},
                        {"batch", o.batch},
                        {"recompute", o.recompute},
                        {"atm", cfg.atm},
                        {"device", cuda_status()},
                        {"peak_tflops", o.peak_tflops},
                        {"flops_per_step", train_step_flops(cfg, o.batch)}};
  out["backend_options"] = backend_option_fields(o.backend);
  std::fflush(stdout);
  for (auto [name, p] : {std::pair{"bf16", CudaPrecision::BF16}, std::pair{"fp32", CudaPrecision::FP32}}) {
    if (o.precision != "both" && o.precision != name) continue;
    std::printf("  %s:\n", name);
    const Result r = bench(p, cfg, o.backend, o.batch, o.recompute, o.warmup, o.steps, o.peak_tflops);
    std::printf("  %s  step %.1f ms | %.0f tokens/s | %.1f TFLOP/s | MFU %.1f %% | peak memory %.2f GiB | loss %.4f\n",
                name, r.step_ms, r.tokens_per_s, r.tflops, 100 * r.mfu, r.peak_gib, r.loss);
    std::printf("    time per op class in one profiled step (%.1f ms; %% of it):\n%s", 1e3 * r.profiled_step_s,
                format_op_profile(r.profile, r.profiled_step_s, 1, "      ").c_str());
    nlohmann::json classes = nlohmann::json::object(), top = nlohmann::json::array();
    for (const auto& c : r.profile.classes) classes[c.name] = 1e3 * c.seconds;
    for (size_t i = 0; i < std::min<size_t>(r.profile.ops.size(), 12); ++i)
      top.push_back(
          {{"op", r.profile.ops[i].name}, {"ms", 1e3 * r.profile.ops[i].seconds}, {"calls", r.profile.ops[i].calls}});
    out[name] = {{"step_ms", r.step_ms},   {"tokens_per_s", r.tokens_per_s},
                 {"tflops", r.tflops},     {"mfu", r.mfu},
                 {"setup_s", r.setup_s},   {"peak_gib", r.peak_gib},
                 {"loss", r.loss},         {"profiled_step_ms", 1e3 * r.profiled_step_s},
                 {"op_class_ms", classes}, {"top_ops", top}};
    if (!r.gemm_tuning.is_null()) out[name]["gemm_tuning"] = r.gemm_tuning;
    if (o.backend.cuda_graphs != CudaGraphs::Off) {
      // The first step runs op by op, the second records; the profiled step
      // after the timed ones runs op by op again (kernels/profiled_ops.h).
      std::printf("    CUDA Graphs: %ld recorded (%ld nodes), %ld graph launches\n", r.graphs.captures, r.graphs.nodes,
                  r.graphs.launches);
      out[name]["cuda_graphs"] = {
          {"recorded", r.graphs.captures}, {"nodes", r.graphs.nodes}, {"launches", r.graphs.launches}};
    }
  }
  return out;
}

nlohmann::json wiola::run_gpu_step_bench_vs_torch(const GpuStepOptions& o, bool torch, bool torch_compile) {
  WIOLA_CHECK(cuda_device_count() > 0, "bench step --device cuda: ", cuda_status());
  nlohmann::json out = run_gpu_step_bench(o);
  if (!torch) return out;
  ModelConfig cfg = model_preset(o.preset);
  if (o.seq_len > 0) cfg.T = o.seq_len;
  if (!o.atm) cfg.atm = false;
  const std::string py = env_text("WIOLA_PYTHON");
  const std::string python = py.empty() ? "python3" : py;
  const std::string args = "--device cuda --dtype bf16 " + torch_model_args(cfg, o.batch, o.steps, o.warmup);
  const double w = out.contains("bf16") ? out["bf16"]["tokens_per_s"].get<double>() : 0.0;
  for (bool compile : {false, true}) {
    if (compile && !torch_compile) continue;
    const char* key = compile ? "torch_compile" : "torch_eager";
    const nlohmann::json t = run_torch_baseline(python, "torch_gpu_step.py", args + (compile ? " --compile" : ""));
    if (t.is_null()) continue;
    const double tps = t.at("tokens_per_s").get<double>();
    std::printf("  PyTorch %-8s %.0f tokens/s (%.1f ms/step, torch %s)", compile ? "compile" : "eager", tps,
                t.at("step_ms").get<double>(), t.at("torch").get<std::string>().c_str());
    if (w > 0) std::printf("  -> wiola bf16 / PyTorch = %.2fx", w / tps);
    std::printf("\n");
    out[key] = t;
    if (w > 0) out[std::string("ratio_vs_") + key] = w / tps;
  }
  return out;
}
