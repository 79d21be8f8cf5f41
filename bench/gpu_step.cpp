// wiola_gpu_bench: one training step (forward + backward + AdamW) of a Wiola
// model on the CUDA backend: median step time, tokens/s, TFLOP/s and MFU
// against the device's bf16 dense peak (model/flops.h: one FLOP count for
// the whole project), and peak device memory, for bf16 and fp32. Needs
// neither MPI nor HDF5 (it travels in the GPU kit, tests/gpu/kit_bench.sh).
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/optimizer.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/profiled_ops.h"
#include "model/flops.h"
#include "model/model.h"
#include "util/error.h"

namespace {

using Clock = std::chrono::steady_clock;

size_t device_used_bytes() {
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  return total_b - free_b;
}

struct Result {
  double step_ms = 0, tokens_per_s = 0, tflops = 0, mfu = 0, loss = 0, peak_gib = 0;
  wiola::OpProfile profile;  // one more step, each op between two events
  double profiled_step_s = 0;
};

Result bench(wiola::CudaPrecision p, const wiola::ModelConfig& cfg, int batch, bool recompute, int warmup,
             int steps, double peak_tflops) {
  auto cuda = wiola::make_cuda_ops(p);
  // Timed steps run unprofiled (events around every op would add host
  // work to a launch-bound step); one step after them is profiled.
  wiola::ProfiledOps<float> prof(*cuda);
  wiola::Ops<float>* ops = &prof;
  wiola::ModelOptions mo;
  mo.micro_batch = batch;
  mo.recompute = recompute;
  wiola::Model<float> model(*ops, cfg, wiola::ModelShard{}, nullptr, mo);
  model.init(1);
  std::vector<wiola::dist::ParamSegment> segs;
  for (const auto& e : model.layout().entries()) segs.push_back({e.offset, e.size(), e.decay, true});
  wiola::dist::DistAdamW adam(*ops, model.params(), model.grads(), model.n_params(), segs,
                              wiola::dist::AdamWConfig{}, nullptr, nullptr);
  std::mt19937_64 rng(7);
  std::vector<int32_t> tok(size_t(batch) * (cfg.T + 1));
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = (i > 0 && rng() % 5 == 0) ? tok[i - 1] : int32_t(rng() % cfg.V);
  const double scale = 1.0 / (double(batch) * cfg.T);
  std::vector<double> times;
  Result r;
  size_t peak = 0;
  for (int s = 0; s < warmup + steps + 1; ++s) {
    const bool profiled = s == warmup + steps;
    prof.enable(profiled);
    ops->synchronize();
    const auto t0 = Clock::now();
    model.zero_grads();
    r.loss = model.train_micro_step(tok.data(), scale) * scale;
    if (!adam.step(1e-4, adam.applied_steps() + 1).skipped) model.refresh_weights();
    ops->synchronize();
    peak = std::max(peak, device_used_bytes());
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    if (profiled) r.profiled_step_s = took;
    else if (s >= warmup) times.push_back(took);
  }
  prof.enable(false);
  r.profile = prof.profile();
  std::sort(times.begin(), times.end());
  const double step_s = times[times.size() / 2];
  r.step_ms = step_s * 1e3;
  r.tokens_per_s = double(batch) * cfg.T / step_s;
  r.tflops = wiola::train_step_flops(cfg, batch) / step_s / 1e12;
  r.mfu = r.tflops / peak_tflops;
  r.peak_gib = double(peak) / double(1u << 30);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One training step of a Wiola model on the GPU (bf16 and fp32)", "wiola_gpu_bench"};
  std::string preset = "wiola-360m", precision = "both", json_out;
  int batch = 4, seq_len = 0, steps = 10, warmup = 3;
  double peak = 989.0;
  bool recompute = false;
  app.add_option("--preset", preset, "model preset")->capture_default_str();
  app.add_option("--batch", batch, "sequences per step")->capture_default_str();
  app.add_option("--seq-len", seq_len, "override the preset's T");
  app.add_option("--steps", steps, "timed steps (median reported)")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--precision", precision, "bf16, fp32 or both")->capture_default_str();
  app.add_option("--peak-tflops", peak, "bf16 dense peak for MFU (H100/H200 SXM: 989)")->capture_default_str();
  app.add_flag("--recompute", recompute, "activation recompute");
  app.add_option("--json", json_out, "write the figures as JSON here");
  CLI11_PARSE(app, argc, argv);
  try {
    if (wiola::cuda_device_count() == 0) {
      std::printf("wiola_gpu_bench: skipped: %s\n", wiola::cuda_status());
      return 0;
    }
    wiola::ModelConfig cfg = wiola::model_preset(preset);
    if (seq_len > 0) cfg.T = seq_len;
    std::printf("wiola_gpu_bench: %s (%lld parameters, T=%d), batch %d, %s%s\n  %s\n", preset.c_str(),
                (long long)cfg.param_count(), cfg.T, batch, precision.c_str(), recompute ? ", recompute" : "",
                wiola::cuda_status());
    nlohmann::json out = {{"preset", preset}, {"T", cfg.T}, {"batch", batch}, {"recompute", recompute},
                          {"device", wiola::cuda_status()}, {"peak_tflops", peak},
                          {"flops_per_step", wiola::train_step_flops(cfg, batch)}};
    for (auto [name, p] : {std::pair{"bf16", wiola::CudaPrecision::BF16}, std::pair{"fp32", wiola::CudaPrecision::FP32}}) {
      if (precision != "both" && precision != name) continue;
      const Result r = bench(p, cfg, batch, recompute, warmup, steps, peak);
      std::printf("  %s: step %.1f ms | %.0f tokens/s | %.1f TFLOP/s | MFU %.1f %% | peak memory %.2f GiB | loss %.4f\n",
                  name, r.step_ms, r.tokens_per_s, r.tflops, 100 * r.mfu, r.peak_gib, r.loss);
      std::printf("    time per op class in one profiled step (%.1f ms; %% of it):\n%s", 1e3 * r.profiled_step_s,
                  wiola::format_op_profile(r.profile, r.profiled_step_s, 1, "      ").c_str());
      nlohmann::json classes = nlohmann::json::object(), top = nlohmann::json::array();
      for (const auto& c : r.profile.classes) classes[c.name] = 1e3 * c.seconds;
      for (size_t i = 0; i < std::min<size_t>(r.profile.ops.size(), 12); ++i)
        top.push_back({{"op", r.profile.ops[i].name}, {"ms", 1e3 * r.profile.ops[i].seconds},
                       {"calls", r.profile.ops[i].calls}});
      out[name] = {{"step_ms", r.step_ms}, {"tokens_per_s", r.tokens_per_s}, {"tflops", r.tflops},
                   {"mfu", r.mfu},         {"peak_gib", r.peak_gib},         {"loss", r.loss},
                   {"profiled_step_ms", 1e3 * r.profiled_step_s}, {"op_class_ms", classes}, {"top_ops", top}};
    }
    if (!json_out.empty()) {
      FILE* f = std::fopen(json_out.c_str(), "w");
      WIOLA_CHECK(f, "cannot write '", json_out, "'");
      std::fprintf(f, "%s\n", out.dump(2).c_str());
      std::fclose(f);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wiola_gpu_bench: error: %s\n", e.what());
    return 1;
  }
}
