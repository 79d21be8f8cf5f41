// wiola_gpu_bench: the GPU training-step benchmark (bench/gpu_step_run.h)
// as a program that needs neither MPI nor HDF5, so it travels in the GPU kit
// (tests/gpu/kit_bench.sh). `wiola bench step --device cuda` runs the same.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "bench/backend_flags.h"
#include "bench/gpu_step_run.h"
#include "util/files.h"

int main(int argc, char** argv) {
  CLI::App app{"One training step of a Wiola model on the GPU (bf16 and fp32)", "wiola_gpu_bench"};
  wiola::GpuStepOptions o;
  std::string json_out;
  app.add_option("--preset", o.preset, "model preset")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per step")->capture_default_str();
  app.add_option("--seq-len", o.seq_len, "override the preset's T");
  app.add_option("--steps", o.steps, "timed steps (median reported)")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--precision", o.precision, "bf16, fp32 or both")->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "bf16 dense peak for MFU (H100/H200 SXM: 989)")->capture_default_str();
  app.add_flag("--recompute", o.recompute, "activation recompute");
  bool no_atm = false;
  app.add_flag("--no-atm", no_atm, "ATM off");
  app.add_option("--json", json_out, "write the figures as JSON here");
  wiola::add_backend_flags(app, o.backend);
  CLI11_PARSE(app, argc, argv);
  o.atm = !no_atm;
  // Line by line even into a pipe: a run cut off by the kit's time limit
  // still shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    const nlohmann::json out = wiola::run_gpu_step_bench(o);
    if (!json_out.empty()) wiola::write_text_atomic(json_out, out.dump(2) + "\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wiola_gpu_bench: error: %s\n", e.what());
    return 1;
  }
}
