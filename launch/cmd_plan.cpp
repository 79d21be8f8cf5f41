// wiola plan: parses the command line into a perf::PlanRequest and runs it
// (perf/plan.h: the cluster planner of perf/planner.h, docs/performance.md).
//   wiola plan --model wiola-360m --gpus 64 --gpu h100          best layouts + Chinchilla run
//   wiola plan --gpt d=12288,L=96,H=96 --gpus 96 --gpu h100 --global-batch 1152
//   wiola plan --model wiola-small --cpu --ranks 2 --layout tp=2,mb=2,m=4 --json P.json
//   wiola plan --cpu --config run.toml --set parallel.tp=2   the model and layout of a run
//   mpirun -np 2 wiola plan --calibrate-link link.json        the CPU transport, measured
//   wiola plan --cpu --link link.json ...                      ... and used
// On the CPU (--cpu) the compute figures are single-rank timings of each
// stage's work measured now; on GPUs, FLOPs over the datasheet peak times an
// efficiency.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "data/text_input.h"
#include "dist/mpi_comm.h"
#include "launch/cli.h"
#include "perf/hardware.h"
#include "perf/link_calibration.h"
#include "perf/plan.h"
#include "util/error.h"
#include "util/files.h"

namespace {

using namespace wiola;
using namespace wiola::perf;

// "k=v,k=v" into a map; values are integers or on/off.
std::map<std::string, std::string> parse_pairs(const std::string& s, const char* what) {
  std::map<std::string, std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    WIOLA_CHECK(eq != std::string::npos && eq > 0, what, ": '", item, "' is not key=value (in '", s, "')");
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

int to_int(const std::string& v, const std::string& key, const char* what) {
  try {
    size_t used = 0;
    const long x = std::stol(v, &used);
    if (used == v.size() && x > 0 && x < (1L << 30)) return int(x);
  } catch (const std::exception&) {
  }
  fail(what, ": ", key, "=", v, " is not a positive integer");
}

bool to_bool(const std::string& v, const std::string& key, const char* what) {
  if (v == "1" || v == "on" || v == "true") return true;
  if (v == "0" || v == "off" || v == "false") return false;
  fail(what, ": ", key, "=", v, " is not on/off");
}

template <class E>
E layout_enum(const std::string& v, const std::string& key) {
  if (const auto e = parse_enum<E>(v)) return *e;
  fail("--layout: ", key, "=", v, " is not ", enum_choices<E>());
}

Layout parse_layout(const std::string& s, int global_batch, int devices) {
  Layout l;
  int m = 0;
  for (const auto& [k, v] : parse_pairs(s, "--layout")) {
    if (k == "tp") l.tp = to_int(v, k, "--layout");
    else if (k == "pp") l.pp = to_int(v, k, "--layout");
    else if (k == "dp") l.dp = to_int(v, k, "--layout");
    else if (k == "mb") l.micro_batch = to_int(v, k, "--layout");
    else if (k == "m") m = to_int(v, k, "--layout");
    else if (k == "zero") l.zero = to_bool(v, k, "--layout");
    else if (k == "recompute") l.recompute = to_bool(v, k, "--layout");
    else if (k == "schedule") l.schedule = layout_enum<dist::Schedule>(v, k);
    else if (k == "v") l.virtual_stages = to_int(v, k, "--layout");
    else if (k == "balance") l.stage_balance = layout_enum<StageBalance>(v, k);
    else fail("--layout: unknown key '", k, "' (tp, pp, dp, mb, m, zero, recompute, schedule, v, balance)");
  }
  if (!s.empty() && s.find("dp=") == std::string::npos) l.dp = std::max(1, devices / (l.tp * l.pp));
  WIOLA_CHECK(l.world() == devices, "--layout: tp x pp x dp = ", l.world(), " but there are ", devices,
              " devices (--gpus / --ranks)");
  if (m > 0) {
    l.micro_batches = m;
  } else {
    WIOLA_CHECK(global_batch % (l.dp * l.micro_batch) == 0, "--layout: the global batch ", global_batch,
                " is not a multiple of dp x mb = ", l.dp * l.micro_batch);
    l.micro_batches = global_batch / (l.dp * l.micro_batch);
  }
  return l;
}

GptConfig parse_gpt(const std::string& s) {
  GptConfig g;
  for (const auto& [k, v] : parse_pairs(s, "--gpt")) {
    if (k == "d") g.d = to_int(v, k, "--gpt");
    else if (k == "L") g.L = to_int(v, k, "--gpt");
    else if (k == "H") g.H = to_int(v, k, "--gpt");
    else if (k == "V") g.V = to_int(v, k, "--gpt");
    else if (k == "T") g.T = to_int(v, k, "--gpt");
    else fail("--gpt: unknown key '", k, "' (d, L, H, V, T)");
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "GPT d=%d L=%d H=%d (%.2fB)", g.d, g.L, g.H, g.params() / 1e9);
  g.name = buf;
  return g;
}

// --calibrate-link (under mpirun): the CPU transport (perf/link_calibration.h)
// into `out`, written by rank 0.
int calibrate_link(int argc, char** argv, const std::string& out) {
  dist::MpiRuntime mpi(&argc, &argv);
  auto world = dist::mpi_world_comm();
  return dist::run_or_abort([&] {
    const nlohmann::json j = perf::calibrate_link(*world);
    if (world->rank() == 0) {
      write_text_atomic(out, j.dump(2) + "\n");
      std::printf("plan --calibrate-link: %d ranks: %.1f us per ring step, %.2f GB/s on the wire",
                  j.at("ranks").get<int>(), j.at("latency_s").get<double>() * 1e6, j.at("gbs").get<double>());
      if (j.contains("inter"))
        std::printf("; %d nodes (%s), between them %.1f us, %.2f GB/s", j.at("nodes").get<int>(),
                    j.at("placement").get<std::string>().c_str(), j["inter"]["latency_s"].get<double>() * 1e6,
                    j["inter"]["gbs"].get<double>());
      std::printf(" -> %s\n", out.c_str());
    }
    return 0;
  });
}

// The command line: what becomes the plan's request, and what says where the
// model, its layout and the devices come from.
struct PlanArgs {
  PlanRequest req;
  std::string model = "wiola-360m", gpt, layout, config, calibrate_out, link;
  std::vector<std::string> sets;
  int gpus = 8, ranks = 1, seq_len = 0, global_batch = 0;  // 0: ~0.5M tokens
  double efficiency = kGpuGemmEfficiency;
};

void add_plan_options(CLI::App& app, PlanArgs& a) {
  PlanRequest& r = a.req;
  app.add_option("--model", a.model, "Wiola preset")->capture_default_str();
  app.add_option("--gpt", a.gpt, "a GPT instead: d=..,L=..,H=..,V=..,T=.. (Megatron-LM's dense GPT)");
  app.add_option("--gpus", a.gpus, "devices in the job")->capture_default_str();
  app.add_option("--gpu", r.gpu, "h100, h200 or a100")->capture_default_str();
  app.add_option("--inter", r.inter, "inter-node link: ib-ndr (default for H100/H200) or ib-hdr");
  app.add_option("--global-batch", a.global_batch, "sequences per optimizer step (default: ~0.5M tokens)");
  app.add_option("--seq-len", a.seq_len, "override the model's T");
  app.add_option("--layout", a.layout,
                 "predict this layout only: tp=,pp=,dp=,mb=,m=,zero=on|off,recompute=on|off,"
                 "schedule=1f1b|gpipe|zb-h1|zb-v|interleaved,v= (interleaved chunks per rank)");
  app.add_option("--top", r.top, "layouts listed")->capture_default_str();
  app.add_option("--efficiency", a.efficiency,
                 "GPU: share of the dense BF16 peak the GEMMs reach (implies --datasheet)")
      ->capture_default_str();
  app.add_option("--profile", r.gpu_model.profile_file, "GPU: time stages with this device profile (JSON)");
  app.add_flag("--datasheet", r.gpu_model.datasheet,
               "GPU: datasheet peak x --efficiency, not the card's committed device profile (perf/profiles)");
  app.add_option("--fit-profile", r.fit.bench, "GPU: fit a device profile to wiola_gpu_bench's JSON and use it");
  app.add_option("--fit-kernels", r.fit.kernels, "--fit-profile: wiola_kernel_bench's kernels.jsonl (attention rates)");
  app.add_option("--fit-build", r.fit.build, "--fit-profile: the wiola commit measured")->capture_default_str();
  app.add_option("--fit-date", r.fit.date, "--fit-profile: the date measured (default: today)");
  app.add_option("--fit-out", r.fit.out, "--fit-profile: write the profile here (e.g. perf/profiles/h100.json)");
  app.add_option("--tokens", r.tokens, "training tokens of the run estimate (default: Chinchilla, 20 x params)");
  app.add_option("--ckpt-minutes", r.ckpt_minutes, "checkpoint interval of the run estimate")->capture_default_str();
  app.add_flag("--blocking-ckpt", r.blocking_ckpt, "checkpoints write in the loop (default: background)");
  app.add_flag("--cpu", r.cpu, "this CPU instead of GPUs: stage work timed here, one rank at a time");
  app.add_option("--ranks", a.ranks, "--cpu: processes on this machine")->capture_default_str();
  app.add_option("--threads", r.threads, "--cpu: threads per rank (default: cores / ranks)");
  app.add_option("--reps", r.reps, "--cpu: timed repeats per stage (median)")->capture_default_str();
  app.add_option("--link", a.link, "--cpu: the transport measured by --calibrate-link (default: memcpy-based guess)");
  app.add_option("--placement", a.req.placement,
                 "--cpu with a link measured on several nodes: block (rank r on node r / ranks per node) or "
                 "round-robin (r % nodes)")
      ->check(CLI::IsMember({"block", "round-robin"}))
      ->capture_default_str();
  app.add_option("--calibrate-link", a.calibrate_out, "under mpirun: measure the CPU transport into this JSON file");
  app.add_option("--json", r.json_out, "also write the predictions as JSON here");
  app.add_option("--config", a.config, "take the model and layout of this run config (as wiola train)");
  app.add_option("--set", a.sets, "run config overrides (section.key=value), as wiola train; implies the run's layout");
}

// The model (a GPT, a run config's or a preset), the devices, the global
// batch and the layout (--layout, or the run config's).
void resolve_model_and_layout(PlanArgs& a) {
  PlanRequest& r = a.req;
  r.is_gpt = !a.gpt.empty();
  if (r.is_gpt) {
    r.gpt = parse_gpt(a.gpt);
    if (a.seq_len > 0) r.gpt.T = a.seq_len;
  } else if (!a.config.empty() || !a.sets.empty()) {
    WIOLA_CHECK(a.layout.empty(), "plan: --config/--set give the layout; drop --layout");
    const RunConfig rc = load_run_config(a.config, a.sets);
    r.model = rc.model;
    const Layout l = rc.layout();
    r.layout = l;
    a.global_batch = l.global_batch();
    if (r.cpu) a.ranks = l.world();
    else a.gpus = l.world();
    if (r.cpu && r.threads <= 0 && rc.train.threads > 0) r.threads = rc.train.threads;
  } else {
    r.model = model_preset(a.model);
    if (a.seq_len > 0) r.model.T = a.seq_len;
    r.model.validate();
  }
  const int T = r.is_gpt ? r.gpt.T : r.model.T;
  r.global_batch = a.global_batch != 0 ? a.global_batch : std::max(1, int(std::lround(524288.0 / T)));
  r.devices = r.cpu ? a.ranks : a.gpus;
  if (!a.layout.empty()) r.layout = parse_layout(a.layout, r.global_batch, r.devices);
}

// --link: the CPU transport --calibrate-link measured.
MeasuredLink read_link(const std::string& file) {
  const auto lj = nlohmann::json::parse(wiola::read_file(file));
  MeasuredLink l{file, lj.at("gbs").get<double>(), lj.at("latency_s").get<double>()};
  if (lj.value("nodes", 1) > 1) {
    l.nodes = lj.at("nodes").get<int>();
    l.per_node = lj.at("per_node").get<int>();
    l.inter_gbs = lj.at("inter").at("gbs").get<double>();
    l.inter_latency_s = lj.at("inter").at("latency_s").get<double>();
  }
  return l;
}

}  // namespace

int wiola_cmd_plan(int argc, char** argv) {
  CLI::App app{
      "Predict step time, throughput, MFU and memory per device for a layout, or search the best "
      "layout that fits, and the wall clock and GPU-hours of the model's Chinchilla run",
      "wiola plan"};
  PlanArgs a;
  add_plan_options(app, a);
  if (const int rc = cli::parse(app, argc, argv, "plan"); rc >= 0) return rc;
  if (!a.calibrate_out.empty()) return calibrate_link(argc, argv, a.calibrate_out);
  PlanRequest& r = a.req;
  WIOLA_CHECK(a.gpus >= 1 && a.ranks >= 1 && r.top >= 1 && r.reps >= 1,
              "plan: --gpus, --ranks, --top and --reps must be positive");
  WIOLA_CHECK(a.efficiency > 0 && a.efficiency <= 1, "plan: --efficiency must be in (0, 1]");
  WIOLA_CHECK(!(r.cpu && !a.gpt.empty()), "plan: --cpu times Wiola stages; it cannot take --gpt");
  r.gpu_model.efficiency = a.efficiency;
  r.gpu_model.datasheet = r.gpu_model.datasheet || app.count("--efficiency") > 0;
  resolve_model_and_layout(a);
  if (r.cpu && !a.link.empty()) r.link = read_link(a.link);
  run_plan(r);
  return 0;
}
