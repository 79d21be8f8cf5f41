// wiola bench step (wiola bench scale: launch/cmd_bench_scale.cpp): forward + backward + AdamW of one training step on a
// backend (--backend; cpu by default), against the measured OpenBLAS sgemm rate and the PyTorch
// reference (bench/torch_step.py) on the same configuration and threads.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/optimizer.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"
#include "kernels/profiled_ops.h"
#ifdef WIOLA_HAVE_CUDA
#include "bench/gpu_step_run.h"
#include "kernels/cuda/cuda_ops.h"
#endif
#include "model/flops.h"
#include "model/model.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/files.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Tokens with runs of repeats (as bench/torch_step.py) so ATM merges some pairs.
std::vector<int32_t> bench_tokens(int B, int T, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tok(size_t(B) * (T + 1));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t <= T; ++t) {
      const size_t i = size_t(b) * (T + 1) + t;
      const bool rep = t > 0 && (rng() % 5 == 0);
      tok[i] = rep ? tok[i - 1] : int32_t(rng() % uint64_t(V));
    }
  return tok;
}

// The BLAS rate on one step's own matrix products: every distinct shape the
// step asked the backend for, timed through the same gemm (same threading
// split), weighted by how often the step calls it. Attention's internal
// products are not backend gemm calls and are timed with attention.
struct ShapeRate {
  wiola::GemmShape shape;
  int calls = 0;
  double seconds = 0;  // per call, best of the repeats
  double flops() const { return 2.0 * shape.m * double(shape.n) * shape.k; }
};

void print_op_profile(const wiola::OpProfile& p, double wall_s, int steps) {
  std::printf("  time per op class, per step (%% of the step):\n%s",
              wiola::format_op_profile(p, wall_s, steps, "    ").c_str());
}

nlohmann::json op_classes_json(const wiola::OpProfile& p, int steps) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& c : p.classes) j[c.name] = 1e3 * c.seconds / steps;
  return j;
}

std::vector<ShapeRate> time_gemm_shapes(wiola::Ops<float>& ops, const std::vector<wiola::GemmShape>& log) {
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
    wiola::Buffer<float> a(ops, na), b(ops, nb), c(ops, nc);
    std::vector<float> host(std::max({na, nb, nc}));
    for (size_t i = 0; i < host.size(); ++i) host[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    ops.upload(a.data(), host.data(), na * sizeof(float));
    ops.upload(b.data(), host.data(), nb * sizeof(float));
    ops.upload(c.data(), host.data(), nc * sizeof(float));
    const int lda = g.ta == wiola::Trans::N ? g.k : g.m, ldb = g.tb == wiola::Trans::N ? g.n : g.k;
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

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

// Runs a PyTorch baseline script (bench/torch_step.py, bench/torch_gpu_step.py)
// and returns the JSON of its last {...} line; null (with its output
// printed) when it failed.
nlohmann::json run_torch_baseline(const std::string& python, const std::string& script, const std::string& args) {
  const std::string path = std::string(WIOLA_SOURCE_DIR) + "/bench/" + script;
  const std::string cmd = python + " " + shell_quote(path) + " " + args + " 2>&1";
  std::printf("  running the PyTorch baseline (bench/%s) ...\n", script.c_str());
  std::fflush(stdout);
  FILE* p = popen(cmd.c_str(), "r");
  WIOLA_CHECK(p, "cannot run ", cmd);
  std::string text, last_json;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    text += buf;
    if (buf[0] == '{') last_json = buf;
  }
  const int rc = pclose(p);
  if (rc != 0 || last_json.empty()) {
    std::printf("  PyTorch baseline failed (exit %d):\n%s\n", rc, text.c_str());
    return nullptr;
  }
  return nlohmann::json::parse(last_json);
}

// The model's shape as both baseline scripts take it.
std::string torch_model_args(const wiola::ModelConfig& cfg, int batch, int steps, int warmup) {
  char a[512];
  std::snprintf(a, sizeof a, "--d %d --L %d --H %d --Hkv %d --dA %d --dB %d --V %d --T %d --B %d --tau %.17g "
                "--steps %d --warmup %d%s", cfg.d, cfg.L, cfg.H, cfg.Hkv, cfg.dA, cfg.dB, cfg.V, cfg.T, batch,
                cfg.tau, steps, warmup, cfg.atm ? "" : " --no-atm");
  return a;
}

void write_json(const std::string& path, const nlohmann::json& out) {
  if (!path.empty()) wiola::write_text_atomic(path, out.dump(2) + "\n");
}

// wiola bench step --device cuda: the GPU step benchmark (bench/gpu_step_run.h,
// as wiola_gpu_bench runs it), then PyTorch's bf16 step of the same model on
// the same GPU (bench/torch_gpu_step.py; eager, and torch.compile on request)
// with the python in $WIOLA_PYTHON or on the PATH.
int bench_step_cuda(const std::string& preset, int batch, int seq_len, int steps, int warmup, bool recompute,
                    bool no_atm, const std::string& precision, double peak_tflops, bool no_torch, bool torch_compile,
                    const std::string& json_out) {
#ifdef WIOLA_HAVE_CUDA
  WIOLA_CHECK(wiola::cuda_device_count() > 0, "bench step --device cuda: ", wiola::cuda_status());
  wiola::GpuStepOptions o;
  o.preset = preset; o.batch = batch; o.seq_len = seq_len; o.steps = steps; o.warmup = warmup;
  o.recompute = recompute; o.atm = !no_atm; o.precision = precision; o.peak_tflops = peak_tflops;
  nlohmann::json out = wiola::run_gpu_step_bench(o);
  if (!no_torch) {
    wiola::ModelConfig cfg = wiola::model_preset(preset);
    if (seq_len > 0) cfg.T = seq_len;
    if (no_atm) cfg.atm = false;
    const char* py = std::getenv("WIOLA_PYTHON");
    const std::string python = py && *py ? py : "python3";
    const std::string args = "--device cuda --dtype bf16 " + torch_model_args(cfg, batch, steps, warmup);
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
  }
  write_json(json_out, out);
  return 0;
#else
  (void)preset, (void)batch, (void)seq_len, (void)steps, (void)warmup, (void)recompute, (void)no_atm, (void)precision;
  (void)peak_tflops, (void)no_torch, (void)torch_compile, (void)json_out;
  wiola::fail("bench step --device cuda: this wiola was built without the CUDA backend "
              "(configure with -DWIOLA_CUDA=ON; scripts/build.sh does when nvcc is present)");
#endif
}

}  // namespace

int wiola_bench_scale(int argc, char** argv);  // launch/cmd_bench_scale.cpp

int wiola_cmd_bench(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "scale") return wiola_bench_scale(argc - 1, argv + 1);
  CLI::App app{"Benchmarks", "wiola bench"};
  app.require_subcommand(1);
  app.add_subcommand("scale", "scaling sweep over layouts, micro-batches, ZeRO, recompute and models "
                              "(wiola bench scale --help)");
  auto* step = app.add_subcommand("step", "time forward+backward+AdamW of one training step");
  std::string preset = "wiola-bench";
  int batch = 8, threads = 2, steps = 5, warmup = 2, seq_len = 0;
  bool no_torch = false, recompute = false, no_atm = false;
  std::string json_out, backend = "cpu";
  step->add_option("--preset", preset, "model preset")->capture_default_str();
  step->add_option("--batch", batch, "sequences per step")->capture_default_str();
  step->add_option("--seq-len", seq_len, "override the preset's T");
  step->add_option("--threads", threads, "CPU threads (both sides)")->capture_default_str();
  step->add_option("--steps", steps, "timed steps (median reported)")->capture_default_str();
  step->add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  step->add_option("--backend", backend, "op backend on the CPU (cpu, cpu-opaque, cpu-bf16); for a GPU, --device cuda")->capture_default_str();
  std::string device = "cpu", precision = "both";
  double peak_tflops = 989.0;
  bool torch_compile = false;
  step->add_option("--device", device, "cpu, or cuda: the GPU step benchmark (wiola-360m at T=2048, batch 4 "
                   "by default there)")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  step->add_option("--precision", precision, "cuda: bf16, fp32 or both")->check(CLI::IsMember({"bf16", "fp32", "both"}))
      ->capture_default_str();
  step->add_option("--peak-tflops", peak_tflops, "cuda: bf16 dense peak for MFU (H100/H200 SXM: 989)")
      ->capture_default_str();
  step->add_flag("--torch-compile", torch_compile, "cuda: also time PyTorch with torch.compile");
  step->add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  step->add_flag("--recompute", recompute, "activation recompute");
  step->add_flag("--no-atm", no_atm, "ATM off");
  step->add_option("--json", json_out, "also write the figures as JSON here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  WIOLA_CHECK(batch >= 1 && steps >= 1 && warmup >= 0 && threads >= 1, "bench: batch, steps, threads must be positive");
  if (device == "cuda") {
    // The GPU defaults (docs/gpu.md) where the CPU ones were left as they are.
    if (step->count("--preset") == 0) preset = "wiola-360m";
    if (step->count("--batch") == 0) batch = 4;
    if (step->count("--steps") == 0) steps = 10;
    if (step->count("--warmup") == 0) warmup = 3;
    return bench_step_cuda(preset, batch, seq_len, steps, warmup, recompute, no_atm, precision, peak_tflops, no_torch,
                           torch_compile, json_out);
  }
  wiola::ModelConfig cfg = wiola::model_preset(preset);
  if (seq_len > 0) cfg.T = seq_len;
  if (no_atm) cfg.atm = false;
  cfg.validate();
  wiola::set_cpu_threads(threads);
  auto backend_ops = wiola::make_backend<float>(backend);
  wiola::ProfiledOps<float> ops(*backend_ops);  // op times over the timed steps

  std::printf("wiola bench step: %s (d=%d L=%d H=%d H_kv=%d d_A=%d d_B=%d V=%d T=%d), %d sequences, "
              "%d threads, ATM %s%s, backend %s\n  CPU %s, SIMD %s\n", preset.c_str(), cfg.d, cfg.L, cfg.H,
              cfg.Hkv, cfg.dA, cfg.dB, cfg.V, cfg.T, batch, threads, cfg.atm ? "on" : "off",
              recompute ? ", recompute" : "", ops.name(), wiola::cpu::cpu_model_name().c_str(),
              wiola::cpu::simd_target_name());
  double sgemm = wiola::openblas_sgemm_gflops(1024, 10);

  wiola::ModelOptions mo;
  mo.micro_batch = batch;
  mo.recompute = recompute;
  wiola::Model<float> model(ops, cfg, wiola::ModelShard{}, nullptr, mo);
  model.init(1);
  wiola::dist::AdamWConfig ac;
  ac.zero = false;
  wiola::dist::DistAdamW adam(ops, model.params(), model.grads(), model.n_params(),
                                 wiola::optimizer_segments(model.layout()), ac, nullptr, nullptr);
  const auto tokens = bench_tokens(batch, cfg.T, cfg.V, 7);
  const double scale = 1.0 / (double(batch) * cfg.T);
  std::vector<double> times;
  double loss = 0;
  auto* cpu_ops = dynamic_cast<wiola::CpuOps<float>*>(backend_ops.get());
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) ops.enable(true);
    const auto t0 = Clock::now();
    model.zero_grads();
    loss = model.train_micro_step(tokens.data(), scale) * scale;
    if (!adam.step(1e-4, adam.applied_steps() + 1).skipped) model.refresh_weights();
    if (s >= warmup) times.push_back(since(t0));
  }
  ops.enable(false);
  const wiola::OpProfile profile = ops.profile();
  std::sort(times.begin(), times.end());
  sgemm = std::max(sgemm, wiola::openblas_sgemm_gflops(1024, 10));  // warm machine too

  const double rss = wiola::peak_rss_mib();  // before the replay's buffers

  // One more step with the backend recording its gemm shapes, then those
  // shapes timed alone.
  std::vector<ShapeRate> shapes;
  double shape_gflops = 0, gemm_flops = 0, gemm_s = 0;
  if (auto* cpu = cpu_ops) {
    std::vector<wiola::GemmShape> log;
    cpu->record_gemm_shapes(&log);
    model.zero_grads();
    model.train_micro_step(tokens.data(), scale);
    cpu->record_gemm_shapes(nullptr);
    shapes = time_gemm_shapes(*backend_ops, log);
    for (const auto& r : shapes) {
      gemm_flops += r.calls * r.flops();
      gemm_s += r.calls * r.seconds;
    }
    shape_gflops = gemm_s > 0 ? gemm_flops / gemm_s / 1e9 : 0;
  }
  const double step_s = times[times.size() / 2];
  const double tps = double(batch) * cfg.T / step_s;
  const double gflops = wiola::train_step_flops(cfg, batch) / step_s / 1e9;

  std::printf("  step            %.1f ms (median of %d; best %.1f ms), loss %.4f\n", step_s * 1e3, steps,
              times.front() * 1e3, loss);
  std::printf("  tokens/s        %.0f\n", tps);
  std::printf("  achieved        %.1f GFLOP/s (analytic %.2f GFLOP per step)\n", gflops,
              wiola::train_step_flops(cfg, batch) / 1e9);
  std::printf("  sgemm 1024^3    %.1f GFLOP/s  -> %.1f %% of sgemm\n", sgemm, 100.0 * gflops / sgemm);
  if (shape_gflops > 0) {
    std::printf("  sgemm on the step's shapes %.1f GFLOP/s (%zu shapes, %.1f %% of the step's FLOPs, %.0f ms "
                "of its time)  -> step at %.1f %% of it\n",
                shape_gflops, shapes.size(), 100.0 * gemm_flops / wiola::train_step_flops(cfg, batch),
                gemm_s * 1e3, 100.0 * gflops / shape_gflops);
    for (size_t i = 0; i < std::min<size_t>(shapes.size(), 6); ++i) {
      const auto& r = shapes[i];
      std::printf("    %c%c m=%-6d n=%-6d k=%-6d x%-3d %6.1f GFLOP/s %7.1f ms\n", r.shape.ta == wiola::Trans::N ? 'N' : 'T',
                  r.shape.tb == wiola::Trans::N ? 'N' : 'T', r.shape.m, r.shape.n, r.shape.k, r.calls,
                  r.flops() / r.seconds / 1e9, r.calls * r.seconds * 1e3);
    }
  }
  double total = 0;
  for (double t : times) total += t;
  print_op_profile(profile, total, steps);
  const double attn_share = profile.class_seconds("attention") / total;
  const double attn_flop_share = wiola::attention_step_flops(cfg, batch) / wiola::train_step_flops(cfg, batch);
  std::printf("  attention       %.1f ms per step = %.1f %% of the step time for %.1f %% of its FLOPs (%.2fx)\n",
              1e3 * profile.class_seconds("attention") / steps, 100.0 * attn_share, 100.0 * attn_flop_share,
              attn_share / attn_flop_share);
  std::printf("  activations     %.1f MiB, params+grads %.1f MiB, peak RSS %.1f MiB\n",
              double(model.activation_bytes()) / 1048576.0, double(model.param_bytes()) / 1048576.0, rss);
  for (const auto& st : model.atm_stats())
    std::printf("  ATM layer %d     mu = %.4f, visible pairs %.2f %% of causal\n", st.layer, st.mu,
                100.0 * st.visible_fraction);
  nlohmann::json out = {{"preset", preset}, {"T", cfg.T}, {"batch", batch}, {"threads", threads},
                        {"step_ms", step_s * 1e3}, {"tokens_per_s", tps}, {"gflops", gflops},
                        {"sgemm_gflops", sgemm}, {"sgemm_fraction", gflops / sgemm},
                        {"sgemm_step_shapes_gflops", shape_gflops},
                        {"attention_time_share", attn_share}, {"attention_flop_share", attn_flop_share},
                        {"step_shapes_fraction", shape_gflops > 0 ? gflops / shape_gflops : 0.0},
                        {"peak_rss_mib", rss}, {"activation_mib", double(model.activation_bytes()) / 1048576.0},
                        {"cpu", wiola::cpu::cpu_model_name()}, {"simd", wiola::cpu::simd_target_name()},
                        {"op_class_ms_per_step", op_classes_json(profile, steps)}};

  if (!no_torch) {
    const nlohmann::json tj = run_torch_baseline(
        "/usr/bin/python3", "torch_step.py",
        "--threads " + std::to_string(threads) + " " + torch_model_args(cfg, batch, steps, warmup));
    if (!tj.is_null()) {
      const double ttps = tj.at("tokens_per_s").get<double>();
      std::printf("  PyTorch         %.0f tokens/s (%.1f ms/step, torch %s, %d threads)\n", ttps,
                  tj.at("step_ms").get<double>(), tj.at("torch").get<std::string>().c_str(),
                  tj.at("threads").get<int>());
      std::printf("  ratio           wiola / PyTorch = %.2fx\n", tps / ttps);
      out["torch_tokens_per_s"] = ttps;
      out["ratio_vs_torch"] = tps / ttps;
    }
  }
  write_json(json_out, out);
  return 0;
}
