// wiola bench step (wiola bench scale: launch/cmd_bench_scale.cpp): parses the
// options and runs the step benchmark of bench/: on the CPU
// (bench/cpu_step_run.h: a CPU backend against the OpenBLAS sgemm rate and
// bench/torch_step.py) or, with --device cuda, on the GPU
// (bench/gpu_step_run.h, against bench/torch_gpu_step.py).
#include <CLI/CLI.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "bench/cpu_step_run.h"
#include "launch/cli.h"
#ifdef WIOLA_HAVE_CUDA
#include "bench/gpu_step_run.h"
#endif
#include "util/error.h"
#include "util/files.h"

namespace {

void write_json(const std::string& path, const nlohmann::json& out) {
  if (!path.empty()) wiola::write_text_atomic(path, out.dump(2) + "\n");
}

// wiola bench step --device cuda: the GPU step benchmark (as wiola_gpu_bench
// runs it), then PyTorch's bf16 step of the same model on the same GPU.
int bench_step_cuda(const std::string& preset, int batch, int seq_len, int steps, int warmup, bool recompute,
                    bool no_atm, const std::string& precision, double peak_tflops, bool no_torch, bool torch_compile,
                    const std::string& json_out) {
#ifdef WIOLA_HAVE_CUDA
  wiola::GpuStepOptions o;
  o.preset = preset; o.batch = batch; o.seq_len = seq_len; o.steps = steps; o.warmup = warmup;
  o.recompute = recompute; o.atm = !no_atm; o.precision = precision; o.peak_tflops = peak_tflops;
  write_json(json_out, wiola::run_gpu_step_bench_vs_torch(o, !no_torch, torch_compile));
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
  if (const int rc = wiola::cli::parse(app, argc, argv, "bench"); rc >= 0) return rc;
  if (device == "cuda") {
    // The GPU defaults (docs/gpu.md) where the CPU ones were left as they are.
    if (step->count("--preset") == 0) preset = "wiola-360m";
    if (step->count("--batch") == 0) batch = 4;
    if (step->count("--steps") == 0) steps = 10;
    if (step->count("--warmup") == 0) warmup = 3;
    return bench_step_cuda(preset, batch, seq_len, steps, warmup, recompute, no_atm, precision, peak_tflops, no_torch,
                           torch_compile, json_out);
  }
  wiola::CpuStepOptions o;
  o.preset = preset; o.batch = batch; o.seq_len = seq_len; o.threads = threads; o.steps = steps; o.warmup = warmup;
  o.backend = backend; o.recompute = recompute; o.atm = !no_atm; o.torch = !no_torch;
  write_json(json_out, wiola::run_cpu_step_bench(o));
  return 0;
}
