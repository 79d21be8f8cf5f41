// `wiola bench step` on the CPU (bench/cpu_step_run.h).
#include "bench/cpu_step_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/step_loop.h"
#include "bench/torch_baseline.h"
#include "kernels/backend.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu_info.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The BLAS rate on one step's own matrix products: every distinct shape the
// step asked the backend for, timed through the same gemm (same threading
// split), weighted by how often the step calls it. Attention's internal
// products are not backend gemm calls and are timed with attention.
struct ShapeRate {
  GemmShape shape;
  int calls = 0;
  double seconds = 0;  // per call, best of the repeats
  double flops() const { return 2.0 * shape.m * double(shape.n) * shape.k; }
};

std::vector<ShapeRate> time_gemm_shapes(Ops<float>& ops, const std::vector<GemmShape>& log) {
  std::vector<ShapeRate> rows;
  for (const auto& g : log) {
    auto it = std::find_if(rows.begin(), rows.end(), [&](const ShapeRate& r) {
      return r.shape.ta == g.ta && r.shape.tb == g.tb && r.shape.m == g.m && r.shape.n == g.n && r.shape.k == g.k;
    });
    if (it == rows.end()) rows.push_back({g, 1, 0});
    else ++it->calls;
  }
  for (auto& r : rows) {
    const auto& g = r.shape;
    const size_t na = size_t(g.m) * g.k, nb = size_t(g.k) * g.n, nc = size_t(g.m) * g.n;
    Buffer<float> a(ops, na), b(ops, nb), c(ops, nc);
    std::vector<float> host(std::max({na, nb, nc}));
    for (size_t i = 0; i < host.size(); ++i) host[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    ops.upload(a.data(), host.data(), na * sizeof(float));
    ops.upload(b.data(), host.data(), nb * sizeof(float));
    ops.upload(c.data(), host.data(), nc * sizeof(float));
    const int lda = g.ta == Trans::N ? g.k : g.m, ldb = g.tb == Trans::N ? g.n : g.k;
    // Repeat to ~50 ms of work per shape (at least 3 calls), best of 3 rounds.
    const int reps = std::clamp(int(5e-2 * 5e10 / std::max(r.flops(), 1.0)), 3, 200);
    r.seconds = 1e30;
    for (int round = 0; round < 3; ++round) {
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i)
        ops.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), g.n);
      ops.synchronize();
      r.seconds = std::min(r.seconds, since(t0) / reps);
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const ShapeRate& x, const ShapeRate& y) { return x.calls * x.seconds > y.calls * y.seconds; });
  return rows;
}

// One more step with the backend recording its GEMM shapes, then those
// shapes timed alone (CPU backends only; others: none).
std::vector<ShapeRate> step_gemm_rates(Ops<float>& backend, StepBench& step) {
  auto* cpu = dynamic_cast<CpuOps<float>*>(&backend);
  if (!cpu) return {};
  std::vector<GemmShape> log;
  cpu->record_gemm_shapes(&log);
  step.step();
  cpu->record_gemm_shapes(nullptr);
  return time_gemm_shapes(backend, log);
}

// The 1024^3 sgemm rate on other kernels of the same BLAS, beside the ones
// in use: the library's own choice where wiola replaced it, or the kernels
// wiola would select where generic ones run (OPENBLAS_CORETYPE, a refusal).
struct OtherKernels {
  std::string kernels, why;
  double gflops = 0;
};
std::optional<OtherKernels> other_kernels_rate() {
  const cpu::BlasState& b = cpu::blas_state();
  OtherKernels o;
  if (b.chosen_by == cpu::BlasChooser::Wiola) o = {b.library_choice, "the library's choice"};
  else if (b.below_cpu()) o = {b.cpu_kernels, "what this CPU runs"};
  else return std::nullopt;
  const auto rate = cpu::blas_sgemm_gflops_on(o.kernels, 1024, 10);
  if (!rate) return std::nullopt;
  o.gflops = *rate;
  return o;
}

nlohmann::json op_classes_json(const OpProfile& p) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& c : p.classes) j[c.name] = 1e3 * c.seconds;
  return j;
}

// The step's GEMM shapes together: their FLOPs, seconds and rate.
struct ShapeTotals {
  double flops = 0, seconds = 0;
  double gflops() const { return seconds > 0 ? flops / seconds / 1e9 : 0; }
};
ShapeTotals shape_totals(const std::vector<ShapeRate>& shapes) {
  ShapeTotals t;
  for (const auto& r : shapes) {
    t.flops += r.calls * r.flops();
    t.seconds += r.calls * r.seconds;
  }
  return t;
}

// The step against the sgemm rates: 1024^3 on the kernels in use and on
// the others, and on the step's own shapes (the six costliest listed).
void print_sgemm_rates(double gflops, double sgemm, const std::string& kernels,
                       const std::optional<OtherKernels>& other, const std::vector<ShapeRate>& shapes,
                       double step_flops) {
  std::printf("  sgemm 1024^3    %.1f GFLOP/s on the %s kernels  -> step at %.1f %% of sgemm\n", sgemm, kernels.c_str(),
              100.0 * gflops / sgemm);
  if (other)
    std::printf("  sgemm 1024^3    %.1f GFLOP/s on the %s kernels (%s)  -> %s / %s = %.2fx\n", other->gflops,
                other->kernels.c_str(), other->why.c_str(), kernels.c_str(), other->kernels.c_str(),
                sgemm / other->gflops);
  const ShapeTotals tot = shape_totals(shapes);
  if (tot.gflops() <= 0) return;
  std::printf(
      "  sgemm on the step's shapes %.1f GFLOP/s (%zu shapes, %.1f %% of the step's FLOPs, %.0f ms "
      "of its time)  -> step at %.1f %% of it\n",
      tot.gflops(), shapes.size(), 100.0 * tot.flops / step_flops, tot.seconds * 1e3, 100.0 * gflops / tot.gflops());
  for (size_t i = 0; i < std::min<size_t>(shapes.size(), 6); ++i) {
    const auto& r = shapes[i];
    std::printf("    %c%c m=%-6d n=%-6d k=%-6d x%-3d %6.1f GFLOP/s %7.1f ms\n", r.shape.ta == Trans::N ? 'N' : 'T',
                r.shape.tb == Trans::N ? 'N' : 'T', r.shape.m, r.shape.n, r.shape.k, r.calls,
                r.flops() / r.seconds / 1e9, r.calls * r.seconds * 1e3);
  }
}

// PyTorch (Debian's) on the same configuration, computing on the same
// OpenBLAS kernels wiola runs, so that the two are compared on equal matrix
// products; its rate and the ratio into `out` (nothing where it cannot run).
void compare_with_torch(const CpuStepOptions& o, const ModelConfig& cfg, const std::string& kernels, double tps,
                        nlohmann::json& out) {
  const nlohmann::json tj = run_torch_baseline(
      "/usr/bin/python3", "torch_step.py",
      "--threads " + std::to_string(o.threads) + " " + torch_model_args(cfg, o.batch, o.steps, o.warmup),
      "OPENBLAS_CORETYPE=" + kernels);
  if (tj.is_null()) return;
  const double ttps = tj.at("tokens_per_s").get<double>();
  std::printf("  PyTorch         %.0f tokens/s (%.1f ms/step, torch %s, %d threads, OpenBLAS's %s kernels)\n", ttps,
              tj.at("step_ms").get<double>(), tj.at("torch").get<std::string>().c_str(), tj.at("threads").get<int>(),
              kernels.c_str());
  std::printf("  ratio           wiola / PyTorch = %.2fx\n", tps / ttps);
  out["torch_tokens_per_s"] = ttps;
  out["ratio_vs_torch"] = tps / ttps;
}

}  // namespace

nlohmann::json run_cpu_step_bench(const CpuStepOptions& o) {
  WIOLA_CHECK(o.batch >= 1 && o.steps >= 1 && o.warmup >= 0 && o.threads >= 1,
              "bench: batch, steps, threads must be positive");
  ModelConfig cfg = model_preset(o.preset);
  if (o.seq_len > 0) cfg.T = o.seq_len;
  if (!o.atm) cfg.atm = false;
  cfg.validate();
  set_cpu_threads(o.threads);
  auto backend = make_backend<float>(o.backend);
  ProfiledOps<float> ops(*backend);

  std::printf(
      "wiola bench step: %s (d=%d L=%d H=%d H_kv=%d d_A=%d d_B=%d V=%d T=%d), %d sequences, "
      "%d threads, ATM %s%s, backend %s\n  CPU %s, SIMD %s\n  BLAS %s\n",
      o.preset.c_str(), cfg.d, cfg.L, cfg.H, cfg.Hkv, cfg.dA, cfg.dB, cfg.V, cfg.T, o.batch, o.threads,
      cfg.atm ? "on" : "off", o.recompute ? ", recompute" : "", ops.name(), cpu::cpu_model_name().c_str(),
      cpu::simd_target_name(), cpu::blas_state().summary().c_str());
  double sgemm = openblas_sgemm_gflops(1024, 10);

  StepBench step(ops, cfg, o.batch, o.recompute);
  const StepTimes t = time_steps(step, o.warmup, o.steps);
  sgemm = std::max(sgemm, openblas_sgemm_gflops(1024, 10));  // warm machine too
  const std::optional<OtherKernels> other = other_kernels_rate();
  const double rss = peak_rss_mib();  // before the replay's buffers

  const std::vector<ShapeRate> shapes = step_gemm_rates(*backend, step);
  const double shape_gflops = shape_totals(shapes).gflops();
  const double step_s = t.median();
  const double step_flops = train_step_flops(cfg, o.batch);
  const double tps = double(o.batch) * cfg.T / step_s;
  const double gflops = step_flops / step_s / 1e9;

  std::printf("  step            %.1f ms (median of %d; best %.1f ms), loss %.4f\n", step_s * 1e3, o.steps,
              t.seconds.front() * 1e3, t.loss);
  std::printf("  tokens/s        %.0f\n", tps);
  std::printf("  achieved        %.1f GFLOP/s (analytic %.2f GFLOP per step)\n", gflops, step_flops / 1e9);
  const std::string kernels = cpu::blas_state().kernels;
  print_sgemm_rates(gflops, sgemm, kernels, other, shapes, step_flops);
  std::printf("  time per op class in one profiled step (%.1f ms; %% of it):\n%s", 1e3 * t.profiled_step_s,
              format_op_profile(t.profile, t.profiled_step_s, 1, "    ").c_str());
  const double attn_share = t.profile.class_seconds("attention") / t.profiled_step_s;
  const double attn_flop_share = attention_step_flops(cfg, o.batch) / step_flops;
  std::printf("  attention       %.1f ms per step = %.1f %% of the step time for %.1f %% of its FLOPs (%.2fx)\n",
              1e3 * t.profile.class_seconds("attention"), 100.0 * attn_share, 100.0 * attn_flop_share,
              attn_share / attn_flop_share);
  std::printf("  activations     %.1f MiB, params+grads %.1f MiB, peak RSS %.1f MiB\n",
              double(step.model().activation_bytes()) / 1048576.0, double(step.model().param_bytes()) / 1048576.0, rss);
  for (const auto& st : step.model().atm_stats())
    std::printf("  ATM layer %d     mu = %.4f, visible pairs %.2f %% of causal\n", st.layer, st.mu,
                100.0 * st.visible_fraction);
  nlohmann::json out = {{"preset", o.preset},
                        {"T", cfg.T},
                        {"batch", o.batch},
                        {"threads", o.threads},
                        {"step_ms", step_s * 1e3},
                        {"tokens_per_s", tps},
                        {"gflops", gflops},
                        {"sgemm_gflops", sgemm},
                        {"sgemm_fraction", gflops / sgemm},
                        {"sgemm_step_shapes_gflops", shape_gflops},
                        {"attention_time_share", attn_share},
                        {"attention_flop_share", attn_flop_share},
                        {"step_shapes_fraction", shape_gflops > 0 ? gflops / shape_gflops : 0.0},
                        {"peak_rss_mib", rss},
                        {"activation_mib", double(step.model().activation_bytes()) / 1048576.0},
                        {"cpu", cpu::cpu_model_name()},
                        {"simd", cpu::simd_target_name()},
                        {"blas", cpu_blas_json()},
                        {"op_class_ms_per_step", op_classes_json(t.profile)}};
  if (other) out["sgemm_other"] = {{"kernels", other->kernels}, {"why", other->why}, {"gflops", other->gflops}};
  if (o.torch) compare_with_torch(o, cfg, kernels, tps, out);
  return out;
}

}  // namespace wiola
