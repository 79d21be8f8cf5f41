// `wiola bench scale`: the command line of the scaling sweep
// (bench/scale_sweep.h runs it).
#include <CLI/CLI.hpp>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench/scale_sweep.h"
#include "launch/cli.h"
#include "util/error.h"

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ','))
    if (!x.empty()) out.push_back(x);
  return out;
}

std::vector<bool> on_off_list(const std::string& s, const char* opt) {
  std::vector<bool> out;
  for (const std::string& v : split_list(s)) {
    if (v == "on" || v == "1" || v == "true") out.push_back(true);
    else if (v == "off" || v == "0" || v == "false") out.push_back(false);
    else wiola::fail(opt, ": '", v, "' is not on/off");
  }
  return out;
}

std::vector<int> int_list(const std::string& s, const char* opt) {
  std::vector<int> out;
  for (const std::string& v : split_list(s)) {
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    WIOLA_CHECK(used == v.size() && n >= 1, opt, ": '", v, "' is not a positive whole number");
    out.push_back(n);
  }
  return out;
}

}  // namespace

int wiola_bench_scale(int argc, char** argv) {
  CLI::App app{"Scaling sweep: one wiola train per configuration; report.md, scale.csv and plots", "wiola bench scale"};
  std::string out = "runs/scale", models = "wiola-small", layouts = "single,dp2,tp2,pp2", mbs = "4", zero = "on",
              recompute = "off";
  wiola::bench::ScaleSweep s;
  app.add_option("--out", out, "output directory")->capture_default_str();
  app.add_option("--models", models, "model presets, comma-separated")->capture_default_str();
  app.add_option("--layouts", layouts, "single, or tpN/ppN/dpN joined by x (tp2xpp2), comma-separated")
      ->capture_default_str();
  app.add_option("--micro-batches", mbs, "micro-batches per step per DP replica, comma-separated")
      ->capture_default_str();
  app.add_option("--zero", zero, "ZeRO for dp > 1: on, off or on,off")->capture_default_str();
  app.add_option("--recompute", recompute, "activation recompute: off, on or off,on")->capture_default_str();
  app.add_option("--global-batch", s.global_batch, "sequences per optimizer step, every configuration")
      ->capture_default_str();
  app.add_option("--steps", s.steps, "steps per run (figures from steps 2..)")->capture_default_str();
  app.add_option("--threads", s.threads, "threads per rank (default: cores / ranks, at least 1)");
  app.add_option("--data", s.data, "token shards (manifest.json); default: the bundled Brown corpus, prepared once");
  app.add_option("--set", s.sets, "more `wiola train` overrides (section.key=value)");
  app.add_option("--hostfile", s.hostfile,
                 "several nodes: start multi-rank runs with launch/mpirun.sh --hostfile FILE");
  app.add_option("--link", s.link,
                 "wiola plan --calibrate-link's file: predict each configuration's step beside its measure");
  app.add_option("--placement", s.placement,
                 "with --hostfile: block (mpirun --map-by slot) or round-robin (--map-by node)")
      ->check(CLI::IsMember({"block", "round-robin"}))
      ->capture_default_str();
  if (const int rc = wiola::cli::parse(app, argc, argv, "bench scale"); rc >= 0) return rc;
  s.out = out;
  s.models = split_list(models);
  s.layouts = split_list(layouts);
  s.micro_batches = int_list(mbs, "--micro-batches");
  s.zero = on_off_list(zero, "--zero");
  s.recompute = on_off_list(recompute, "--recompute");
  wiola::bench::run_scale_sweep(s, std::filesystem::canonical("/proc/self/exe").string(), WIOLA_SOURCE_DIR);
  return 0;
}
