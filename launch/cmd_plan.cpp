// wiola plan: the cluster planner (perf/planner.h, docs/performance.md).
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
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "data/text_input.h"
#include "dist/grid.h"
#include "dist/mpi_comm.h"
#include "kernels/ops.h"
#include "launch/cli.h"
#include "perf/calibrate.h"
#include "perf/device_profile.h"
#include "perf/link_calibration.h"
#include "perf/planner.h"
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

std::string human_time(double s) {
  char buf[64];
  if (s >= 86400) std::snprintf(buf, sizeof buf, "%.1f days", s / 86400);
  else if (s >= 3600) std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

nlohmann::json schedule_options_json(const Prediction& p) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& o : p.schedule_options)
    a.push_back({{"schedule", o.name}, {"runnable", o.runnable}, {"fits", o.fits}, {"step_s", o.step_s},
                 {"bubble_sim", o.bubble_sim}, {"activation_bytes", o.activation_bytes}, {"pp_bytes", o.pp_bytes}});
  return a;
}

nlohmann::json to_json(const Prediction& p) {
  const auto gib = [](double b) { return b / 1073741824.0; };
  return {{"layout", p.layout.name()},
          {"tp", p.layout.tp}, {"pp", p.layout.pp}, {"dp", p.layout.dp},
          {"micro_batch", p.layout.micro_batch}, {"micro_batches", p.layout.micro_batches},
          {"zero", p.layout.zero_active()}, {"recompute", p.layout.recompute},
          {"schedule", to_string(p.layout.schedule)}, {"virtual_stages", p.layout.virtual_stages},
          {"schedule_why", p.schedule_why},
          {"fits", p.fits}, {"why_not", p.why_not},
          {"step_s", p.step_s}, {"tokens_per_s", p.tokens_per_s}, {"mfu", p.mfu},
          {"pipeline_s", p.pipeline_s}, {"compute_s", p.compute_s}, {"tp_s", p.tp_s}, {"pp_s", p.pp_s},
          {"dp_exposed_s", p.dp_exposed_s}, {"embed_s", p.embed_s}, {"optimizer_s", p.optimizer_s},
          {"bubble_analytic", p.bubble_analytic}, {"bubble_sim", p.bubble_sim},
          {"bubble_fill_drain", p.bubble_fill_drain}, {"bubble_imbalance", p.bubble_imbalance},
          {"stage_fwd_s", p.stage_fwd_s}, {"stage_bwd_s", p.stage_bwd_s},
          {"traffic_bytes", {{"tp", p.traffic.tp}, {"pp", p.traffic.pp}, {"dp", p.traffic.dp},
                             {"embed", p.traffic.embed}}},
          {"memory_gib", {{"params", gib(p.memory.params)}, {"grads", gib(p.memory.grads)},
                          {"optimizer", gib(p.memory.optimizer)}, {"activations", gib(p.memory.activations)},
                          {"total", gib(p.memory.total())}}},
          {"schedule_options", schedule_options_json(p)}};
}

void print_table(const std::vector<Prediction>& ps, int top) {
  std::printf("  %-4s %-22s %9s %12s %6s %9s %8s %8s %7s  %s\n", "#", "layout (tp pp dp, mb x m)", "step", "tokens/s",
              "MFU", "mem GiB", "comm", "bubble", "opt", "");
  int shown = 0;
  for (size_t i = 0; i < ps.size() && shown < top; ++i, ++shown) {
    const Prediction& p = ps[i];
    const Layout& l = p.layout;
    char lay[64];
    const std::string sched = l.schedule == dist::Schedule::OneFOneB ? "" : l.schedule == dist::Schedule::ZbH1 ? " zb"
                              : l.schedule == dist::Schedule::ZbV ? " zv"
                              : l.schedule == dist::Schedule::Interleaved ? " i" + std::to_string(l.virtual_stages)
                                                                          : " " + std::string(to_string(l.schedule));
    std::snprintf(lay, sizeof lay, "%d %d %d, %dx%d%s%s%s", l.tp, l.pp, l.dp, l.micro_batch, l.micro_batches,
                  l.zero_active() ? " z" : "", l.recompute ? " rc" : "", sched.c_str());
    std::printf("  %-4zu %-22s %8.3fs %12.0f %5.1f%% %9.2f %7.1f%% %7.1f%% %6.1f%%  %s\n", i + 1, lay, p.step_s,
                p.tokens_per_s, 100 * p.mfu, p.memory.total() / 1073741824.0,
                100 * (p.tp_s + p.dp_exposed_s + p.embed_s + p.pp_s) / p.step_s, 100 * p.bubble_sim,
                100 * p.optimizer_s / p.step_s, p.fits ? "" : ("does not fit: " + p.why_not).c_str());
  }
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
      std::printf("plan --calibrate-link: %d ranks: %.1f us per ring step, %.2f GB/s on the wire -> %s\n",
                  j.at("ranks").get<int>(), j.at("latency_s").get<double>() * 1e6, j.at("gbs").get<double>(),
                  out.c_str());
    }
    return 0;
  });
}

}  // namespace

namespace {

// --fit-profile: the profile of the kit's benchmarks, written where asked and
// used for this plan.
std::unique_ptr<ComputeModel> fit_and_write_profile(const std::string& key, const std::string& bench,
                                                    const std::string& kernels, const std::string& build,
                                                    std::string date, const std::string& out) {
  if (date.empty()) {
    const std::time_t now = std::time(nullptr);
    char buf[16];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
    date = buf;
  }
  const DeviceProfile p = fit_device_profile_files(bench, kernels, key, build, date);
  const std::string text = device_profile_to_json(p).dump(2) + "\n";
  if (!out.empty()) wiola::write_text_atomic(out, text);
  std::printf("device profile%s%s:\n%s", out.empty() ? "" : " written to ", out.c_str(), text.c_str());
  return profile_compute_model(p);
}

}  // namespace

int wiola_cmd_plan(int argc, char** argv) {
  CLI::App app{"Predict step time, throughput, MFU and memory per device for a layout, or search the best "
               "layout that fits, and the wall clock and GPU-hours of the model's Chinchilla run",
               "wiola plan"};
  std::string model = "wiola-360m", gpt, gpu = "h100", inter, layout, json_out, config;
  std::vector<std::string> sets;
  int gpus = 8, global_batch = 0, seq_len = 0, top = 10, ranks = 1, threads = 0, reps = 7;
  double efficiency = kGpuGemmEfficiency, tokens = 0, ckpt_minutes = 30;
  bool cpu = false, blocking_ckpt = false;
  app.add_option("--model", model, "Wiola preset")->capture_default_str();
  app.add_option("--gpt", gpt, "a GPT instead: d=..,L=..,H=..,V=..,T=.. (Megatron-LM's dense GPT)");
  app.add_option("--gpus", gpus, "devices in the job")->capture_default_str();
  app.add_option("--gpu", gpu, "h100, h200 or a100")->capture_default_str();
  app.add_option("--inter", inter, "inter-node link: ib-ndr (default for H100/H200) or ib-hdr");
  app.add_option("--global-batch", global_batch, "sequences per optimizer step (default: ~0.5M tokens)");
  app.add_option("--seq-len", seq_len, "override the model's T");
  app.add_option("--layout", layout, "predict this layout only: tp=,pp=,dp=,mb=,m=,zero=on|off,recompute=on|off,"
                 "schedule=1f1b|gpipe|zb-h1|zb-v|interleaved,v= (interleaved chunks per rank)");
  app.add_option("--top", top, "layouts listed")->capture_default_str();
  app.add_option("--efficiency", efficiency, "GPU: share of the dense BF16 peak the GEMMs reach (implies --datasheet)")
      ->capture_default_str();
  GpuComputeChoice gpu_model;
  std::string fit_bench, fit_kernels, fit_build = "unknown", fit_date, fit_out;
  app.add_option("--profile", gpu_model.profile_file, "GPU: time stages with this device profile (JSON)");
  app.add_flag("--datasheet", gpu_model.datasheet,
               "GPU: datasheet peak x --efficiency, not the card's committed device profile (perf/profiles)");
  app.add_option("--fit-profile", fit_bench, "GPU: fit a device profile to wiola_gpu_bench's JSON and use it");
  app.add_option("--fit-kernels", fit_kernels, "--fit-profile: wiola_kernel_bench's kernels.jsonl (attention rates)");
  app.add_option("--fit-build", fit_build, "--fit-profile: the wiola commit measured")->capture_default_str();
  app.add_option("--fit-date", fit_date, "--fit-profile: the date measured (default: today)");
  app.add_option("--fit-out", fit_out, "--fit-profile: write the profile here (e.g. perf/profiles/h100.json)");
  app.add_option("--tokens", tokens, "training tokens of the run estimate (default: Chinchilla, 20 x params)");
  app.add_option("--ckpt-minutes", ckpt_minutes, "checkpoint interval of the run estimate")->capture_default_str();
  app.add_flag("--blocking-ckpt", blocking_ckpt, "checkpoints write in the loop (default: background)");
  app.add_flag("--cpu", cpu, "this CPU instead of GPUs: stage work timed here, one rank at a time");
  app.add_option("--ranks", ranks, "--cpu: processes on this machine")->capture_default_str();
  app.add_option("--threads", threads, "--cpu: threads per rank (default: cores / ranks)");
  app.add_option("--reps", reps, "--cpu: timed repeats per stage (median)")->capture_default_str();
  std::string link_json, calibrate_out;
  app.add_option("--link", link_json, "--cpu: the transport measured by --calibrate-link (default: memcpy-based guess)");
  app.add_option("--calibrate-link", calibrate_out, "under mpirun: measure the CPU transport into this JSON file");
  app.add_option("--json", json_out, "also write the predictions as JSON here");
  app.add_option("--config", config, "take the model and layout of this run config (as wiola train)");
  app.add_option("--set", sets, "run config overrides (section.key=value), as wiola train; implies the run's layout");
  if (const int rc = cli::parse(app, argc, argv, "plan"); rc >= 0) return rc;
  if (!calibrate_out.empty()) return calibrate_link(argc, argv, calibrate_out);
  WIOLA_CHECK(gpus >= 1 && ranks >= 1 && top >= 1 && reps >= 1, "plan: --gpus, --ranks, --top and --reps must be positive");
  WIOLA_CHECK(efficiency > 0 && efficiency <= 1, "plan: --efficiency must be in (0, 1]");
  WIOLA_CHECK(!(cpu && !gpt.empty()), "plan: --cpu times Wiola stages; it cannot take --gpt");

  const bool is_gpt = !gpt.empty();
  GptConfig g;
  ModelConfig c;
  std::optional<Layout> given;  // --layout, or the run config's
  if (is_gpt) {
    g = parse_gpt(gpt);
    if (seq_len > 0) g.T = seq_len;
  } else if (!config.empty() || !sets.empty()) {
    WIOLA_CHECK(layout.empty(), "plan: --config/--set give the layout; drop --layout");
    const RunConfig rc = load_run_config(config, sets);
    c = rc.model;
    const Layout l = rc.layout();
    given = l;
    global_batch = l.global_batch();
    if (cpu) ranks = l.world();
    else gpus = l.world();
    if (cpu && threads <= 0 && rc.train.threads > 0) threads = rc.train.threads;
  } else {
    c = model_preset(model);
    if (seq_len > 0) c.T = seq_len;
    c.validate();
  }
  const int T = is_gpt ? g.T : c.T;
  const double params = is_gpt ? g.params() : double(c.param_count());
  if (global_batch == 0) global_batch = std::max(1, int(std::lround(524288.0 / T)));
  const int devices = cpu ? ranks : gpus;

  Cluster cl;
  std::unique_ptr<ComputeModel> cm;
  Precision prec{DType::BF16, DType::F32, DType::BF16, true};  // the CUDA backend's bf16 mode
  if (cpu) {
    const int hw = std::max(1, int(std::thread::hardware_concurrency()));
    if (threads <= 0) threads = std::max(1, hw / ranks);
    auto cc = std::make_unique<CpuCompute>(c, threads, reps, ranks);
    cl = cpu_cluster(cc->calibration(), ranks);
    if (!link_json.empty()) {
      const auto lj = nlohmann::json::parse(wiola::read_file(link_json));
      cl.intra_gbs = cl.inter_gbs = lj.at("gbs").get<double>();
      cl.latency_s = cl.inter_latency_s = lj.at("latency_s").get<double>();
    }
    cm = std::move(cc);
    prec = Precision{DType::F32, DType::F32, DType::F32, false};
  } else {
    cl = Cluster::gpu(gpu, gpus, inter);
    gpu_model.efficiency = efficiency;
    gpu_model.datasheet = gpu_model.datasheet || app.count("--efficiency") > 0;
    cm = fit_bench.empty() ? gpu_compute_model(cl, gpu_model) : fit_and_write_profile(cl.device, fit_bench, fit_kernels,
                                                                                      fit_build, fit_date, fit_out);
  }
  std::printf("wiola plan: %s (%.3gB parameters, T=%d) on %d %s%s, global batch %d sequences (%d tokens)\n",
              is_gpt ? g.name.c_str() : c.name.c_str(), params / 1e9, T, devices, cpu ? "CPU rank" : cl.device.c_str(),
              devices > 1 ? "s" : "", global_batch, global_batch * T);
  std::printf("  compute: %s\n", cm->describe().c_str());
  if (!cpu)
    std::printf("  links: %.0f GB/s inside a node of %d, %.0f GB/s between nodes (per GPU per direction, x%.2f "
                "achievable); peak %.0f TFLOP/s dense BF16 per GPU\n",
                cl.intra_gbs, cl.per_node, cl.inter_gbs, kLinkEfficiency, cl.peak_flops / 1e12);
  else if (link_json.empty())
    std::printf("  link: shared memory at %.1f GB/s (half the memcpy rate), 5 us per collective step (assumed; "
                "--link for a measured one)\n", cl.intra_gbs);
  else
    std::printf("  link: %s: %.2f GB/s on the wire, %.1f us per ring step (measured)\n", link_json.c_str(),
                cl.intra_gbs, cl.latency_s * 1e6);

  std::vector<Prediction> ps;
  if (!layout.empty()) given = parse_layout(layout, global_batch, devices);
  if (given) {
    const Layout& l = *given;
    // The same rules as wiola train (and the search).
    if (is_gpt) {
      WIOLA_CHECK(g.H % l.tp == 0 && g.V % l.tp == 0, "--layout: tp ", l.tp, " must divide the GPT's H (", g.H,
                  ") and V (", g.V, ")");
      WIOLA_CHECK(l.pp <= g.L, "--layout: pp ", l.pp, " exceeds the GPT's ", g.L, " layers");
    } else {
      dist::validate_layout(dist::GridConfig{l.tp, l.pp, l.dp}, l.world(), c.L, c.Hkv, c.H, c.dA, c.dB, c.V,
                            l.global_batch(), l.micro_batch, l.micro_batches);
    }
    ps.push_back(predict(is_gpt ? gpt_workload(g, l) : wiola_workload(c, l, prec), cl, *cm));
  } else {
    WIOLA_CHECK(!cpu || ranks <= 4, "plan: a --cpu search times every stage shape here; give --layout for > 4 ranks");
    SearchSpace sp;
    sp.global_batch = global_batch;
    sp.try_interleaved = !cpu;  // on the CPU every chunk shape would be timed here
    ps = is_gpt ? search_gpt(g, cl, *cm, sp) : search_wiola(c, cl, *cm, sp, prec);
    WIOLA_CHECK(!ps.empty(), "plan: no layout of ", devices, " devices divides the global batch of ", global_batch,
                " sequences (try --global-batch)");
  }
  print_table(ps, top);
  const Prediction& best = ps.front();
  const Workload w = is_gpt ? gpt_workload(g, best.layout) : wiola_workload(c, best.layout, prec);
  const double run_tokens = tokens > 0 ? tokens : 20.0 * params;
  const RunEstimate est = estimate_run(best, w, cl, run_tokens, ckpt_minutes, !blocking_ckpt);
  std::printf("\n  best: %s%s\n", best.layout.name().c_str(), best.fits ? "" : " (NOTHING FITS)");
  std::printf("    step %.3f s = pipeline %.3f (compute %.3f, TP %.3f, transfers %.3f; bubble %.1f%% simulated = "
              "%.1f%% fill/drain + %.1f%% imbalance, %.1f%% for (p-1)/(m+p-1)) + embedding %.3f + DP exposed %.3f "
              "+ AdamW %.3f\n",
              best.step_s, best.pipeline_s, best.compute_s, best.tp_s, best.pp_s, 100 * best.bubble_sim,
              100 * best.bubble_fill_drain, 100 * best.bubble_imbalance,
              100 * best.bubble_analytic, best.embed_s, best.dp_exposed_s, best.optimizer_s);
  const bool predicted_only = std::any_of(best.schedule_options.begin(), best.schedule_options.end(),
                                          [](const Prediction::ScheduleOption& o) { return !o.runnable; });
  if (!best.schedule_why.empty())
    std::printf("    schedule: %s, the fastest that fits of those wiola train runs%s\n      %s\n",
                to_string(best.layout.schedule).data(),
                predicted_only ? " (interleaved, zb-v: not picked on GPUs, where their pipeline messages go through "
                                 "host memory; their chunks cut by the chunk balancer)" : "",
                best.schedule_why.c_str());
  else if (best.layout.pp > 1)
    std::printf("    schedule: %s%s (given)%s\n", to_string(best.layout.schedule).data(),
                best.layout.schedule == dist::Schedule::Interleaved
                    ? (" v" + std::to_string(best.layout.virtual_stages)).c_str()
                    : "",
                dist::chunked(best.layout.schedule) && cl.device != "cpu"
                    ? ": on GPUs wiola train sends its pipeline messages through host memory (not in this prediction)"
                    : "");
  std::printf("    memory per device %.2f GiB: params %.2f, grads %.2f, optimizer %.2f, activations %.2f\n",
              best.memory.total() / 1073741824.0, best.memory.params / 1073741824.0,
              best.memory.grads / 1073741824.0, best.memory.optimizer / 1073741824.0,
              best.memory.activations / 1073741824.0);
  std::printf("    traffic per device per step: TP %.1f MiB, PP %.1f MiB, DP %.1f MiB, embedding %.1f MiB\n",
              best.traffic.tp / 1048576, best.traffic.pp / 1048576, best.traffic.dp / 1048576,
              best.traffic.embed / 1048576);
  std::printf("  run: %.3g tokens (%s) = %.0f steps: %s wall clock, %.0f %s-hours; %d checkpoints every %.0f min "
              "cost %s (%s)\n",
              run_tokens, tokens > 0 ? "--tokens" : "Chinchilla 20 x params", est.steps, human_time(est.wall_s).c_str(),
              est.device_hours, cpu ? "rank" : "GPU", est.checkpoints, ckpt_minutes,
              human_time(est.checkpoint_s).c_str(), blocking_ckpt ? "blocking writes" : "background writes");
  if (!json_out.empty()) {
    nlohmann::json j = {{"model", is_gpt ? g.name : c.name}, {"params", params}, {"T", T},
                        {"devices", devices}, {"device", cl.device}, {"global_batch", global_batch},
                        {"compute_model", cm->describe()}, {"peak_flops_per_device", cl.peak_flops},
                        {"run", {{"tokens", run_tokens}, {"steps", est.steps}, {"wall_s", est.wall_s},
                                 {"device_hours", est.device_hours}, {"checkpoints", est.checkpoints},
                                 {"checkpoint_s", est.checkpoint_s}}}};
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& p : ps) arr.push_back(to_json(p));
    j["predictions"] = arr;
    write_text_atomic(json_out, j.dump(2) + "\n");
  }
  return 0;
}
