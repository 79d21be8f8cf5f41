// One `wiola plan` (perf/plan.h).
#include "perf/plan.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/grid.h"
#include "perf/calibrate.h"
#include "perf/hardware.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola::perf {
namespace {

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
    a.push_back({{"schedule", o.name},
                 {"runnable", o.runnable},
                 {"fits", o.fits},
                 {"step_s", o.step_s},
                 {"bubble_sim", o.bubble_sim},
                 {"activation_bytes", o.activation_bytes},
                 {"pp_bytes", o.pp_bytes}});
  return a;
}

nlohmann::json to_json(const Prediction& p) {
  const auto gib = [](double b) { return b / 1073741824.0; };
  return {
      {"layout", p.layout.name()},
      {"tp", p.layout.tp},
      {"pp", p.layout.pp},
      {"dp", p.layout.dp},
      {"micro_batch", p.layout.micro_batch},
      {"micro_batches", p.layout.micro_batches},
      {"zero", p.layout.zero_active()},
      {"recompute", p.layout.recompute},
      {"schedule", to_string(p.layout.schedule)},
      {"virtual_stages", p.layout.virtual_stages},
      {"schedule_why", p.schedule_why},
      {"fits", p.fits},
      {"why_not", p.why_not},
      {"step_s", p.step_s},
      {"tokens_per_s", p.tokens_per_s},
      {"mfu", p.mfu},
      {"pipeline_s", p.pipeline_s},
      {"compute_s", p.compute_s},
      {"tp_s", p.tp_s},
      {"pp_s", p.pp_s},
      {"dp_exposed_s", p.dp_exposed_s},
      {"embed_s", p.embed_s},
      {"optimizer_s", p.optimizer_s},
      {"bubble_analytic", p.bubble_analytic},
      {"bubble_sim", p.bubble_sim},
      {"bubble_fill_drain", p.bubble_fill_drain},
      {"bubble_imbalance", p.bubble_imbalance},
      {"stage_fwd_s", p.stage_fwd_s},
      {"stage_bwd_s", p.stage_bwd_s},
      {"traffic_bytes", {{"tp", p.traffic.tp}, {"pp", p.traffic.pp}, {"dp", p.traffic.dp}, {"embed", p.traffic.embed}}},
      {"memory_gib",
       {{"params", gib(p.memory.params)},
        {"grads", gib(p.memory.grads)},
        {"optimizer", gib(p.memory.optimizer)},
        {"activations", gib(p.memory.activations)},
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
    const std::string sched = l.schedule == dist::Schedule::OneFOneB      ? ""
                              : l.schedule == dist::Schedule::ZbH1        ? " zb"
                              : l.schedule == dist::Schedule::ZbV         ? " zv"
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

// --fit-profile: the profile of the kit's benchmarks, written where asked and
// used for this plan.
std::unique_ptr<ComputeModel> fit_and_write_profile(const std::string& key, const ProfileFitRequest& f) {
  std::string date = f.date;
  if (date.empty()) {
    const std::time_t now = std::time(nullptr);
    char buf[16];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
    date = buf;
  }
  const DeviceProfile p = fit_device_profile_files(f.bench, f.kernels, key, f.build, date);
  const std::string text = device_profile_to_json(p).dump(2) + "\n";
  if (!f.out.empty()) wiola::write_text_atomic(f.out, text);
  std::printf("device profile%s%s:\n%s", f.out.empty() ? "" : " written to ", f.out.c_str(), text.c_str());
  return profile_compute_model(p);
}

// What the plan runs on: the cluster, the compute model timing its stages
// and the precision of the Wiola workloads (the CUDA backend's bf16 mode on
// GPUs, fp32 on the CPU).
struct PlanMachine {
  Cluster cluster;
  std::unique_ptr<ComputeModel> compute;
  Precision prec{DType::BF16, DType::F32, DType::BF16, true};
};

// A measured cluster of several nodes: the inter-node link and where each
// rank runs (the ranks share this machine's cores however they are placed:
// the namespace nodes of scripts/local_cluster.sh).
void set_cpu_nodes(const MeasuredLink& l, const std::string& placement, Cluster& cl) {
  WIOLA_CHECK(placement == "block" || placement == "round-robin",
              "plan: --placement must be block or round-robin (got '", placement, "')");
  WIOLA_CHECK(cl.devices == l.nodes * l.per_node, "plan: --ranks ", cl.devices, " but the link file ", l.file,
              " was measured on ", l.nodes, " nodes x ", l.per_node, " ranks");
  cl.per_node = l.per_node;
  cl.inter_gbs = l.inter_gbs;
  cl.inter_latency_s = l.inter_latency_s;
  cl.rank_node.clear();
  for (int r = 0; r < cl.devices; ++r)
    cl.rank_node.push_back("node" + std::to_string(1 + (placement == "block" ? r / l.per_node : r % l.nodes)));
}

PlanMachine cpu_machine(const PlanRequest& r) {
  PlanMachine m;
  int threads = r.threads;
  const int hw = std::max(1, int(std::thread::hardware_concurrency()));
  if (threads <= 0) threads = std::max(1, hw / r.devices);
  auto cc = std::make_unique<CpuCompute>(r.model, threads, r.reps, r.devices);
  m.cluster = cpu_cluster(cc->calibration(), r.devices);
  if (r.link) {
    m.cluster.intra_gbs = m.cluster.inter_gbs = r.link->gbs;
    m.cluster.latency_s = m.cluster.inter_latency_s = r.link->latency_s;
    if (r.link->nodes > 1) set_cpu_nodes(*r.link, r.placement, m.cluster);
  }
  m.compute = std::move(cc);
  m.prec = Precision{DType::F32, DType::F32, DType::F32, false};
  return m;
}

PlanMachine gpu_machine(const PlanRequest& r) {
  PlanMachine m;
  m.cluster = Cluster::gpu(r.gpu, r.devices, r.inter);
  m.compute =
      r.fit.bench.empty() ? gpu_compute_model(m.cluster, r.gpu_model) : fit_and_write_profile(m.cluster.device, r.fit);
  return m;
}

int seq_len(const PlanRequest& r) { return r.is_gpt ? r.gpt.T : r.model.T; }
double param_count(const PlanRequest& r) { return r.is_gpt ? r.gpt.params() : double(r.model.param_count()); }
const std::string& model_name(const PlanRequest& r) { return r.is_gpt ? r.gpt.name : r.model.name; }

Workload workload(const PlanRequest& r, const Layout& l, const Precision& prec) {
  return r.is_gpt ? gpt_workload(r.gpt, l) : wiola_workload(r.model, l, prec);
}

void print_machine(const PlanRequest& r, const PlanMachine& m) {
  const Cluster& cl = m.cluster;
  const int T = seq_len(r);
  std::printf("wiola plan: %s (%.3gB parameters, T=%d) on %d %s%s, global batch %d sequences (%d tokens)\n",
              model_name(r).c_str(), param_count(r) / 1e9, T, r.devices, r.cpu ? "CPU rank" : cl.device.c_str(),
              r.devices > 1 ? "s" : "", r.global_batch, r.global_batch * T);
  std::printf("  compute: %s\n", m.compute->describe().c_str());
  if (!r.cpu)
    std::printf(
        "  links: %.0f GB/s inside a node of %d, %.0f GB/s between nodes (per GPU per direction, x%.2f "
        "achievable); peak %.0f TFLOP/s dense BF16 per GPU\n",
        cl.intra_gbs, cl.per_node, cl.inter_gbs, kLinkEfficiency, cl.peak_flops / 1e12);
  else if (!r.link)
    std::printf(
        "  link: shared memory at %.1f GB/s (half the memcpy rate), 5 us per collective step (assumed; "
        "--link for a measured one)\n",
        cl.intra_gbs);
  else if (r.link->nodes <= 1)
    std::printf("  link: %s: %.2f GB/s on the wire, %.1f us per ring step (measured)\n", r.link->file.c_str(),
                cl.intra_gbs, cl.latency_s * 1e6);
  else
    std::printf(
        "  links: %s: %d nodes x %d ranks (%s placement); inside a node %.2f GB/s, %.1f us per ring step; between "
        "nodes %.2f GB/s, %.1f us (measured)\n",
        r.link->file.c_str(), r.link->nodes, r.link->per_node, r.placement.c_str(), cl.intra_gbs, cl.latency_s * 1e6,
        cl.inter_gbs, cl.inter_latency_s * 1e6);
}

// The given layout's prediction (held to wiola train's rules), or the
// search's, fastest first.
std::vector<Prediction> predictions(const PlanRequest& r, PlanMachine& m) {
  if (r.layout) {
    const Layout& l = *r.layout;
    // The same rules as wiola train (and the search).
    if (r.is_gpt) {
      const GptConfig& g = r.gpt;
      WIOLA_CHECK(g.H % l.tp == 0 && g.V % l.tp == 0, "--layout: tp ", l.tp, " must divide the GPT's H (", g.H,
                  ") and V (", g.V, ")");
      WIOLA_CHECK(l.pp <= g.L, "--layout: pp ", l.pp, " exceeds the GPT's ", g.L, " layers");
    } else {
      const ModelConfig& c = r.model;
      dist::validate_layout(dist::GridConfig{l.tp, l.pp, l.dp}, l.world(), c.L, c.Hkv, c.H, c.dA, c.dB, c.V,
                            l.global_batch(), l.micro_batch, l.micro_batches);
    }
    return {predict(workload(r, l, m.prec), m.cluster, *m.compute)};
  }
  WIOLA_CHECK(!r.cpu || r.devices <= 4,
              "plan: a --cpu search times every stage shape here; give --layout for > 4 ranks");
  SearchSpace sp;
  sp.global_batch = r.global_batch;
  sp.try_interleaved = !r.cpu;  // on the CPU every chunk shape would be timed here
  std::vector<Prediction> ps = r.is_gpt ? search_gpt(r.gpt, m.cluster, *m.compute, sp)
                                        : search_wiola(r.model, m.cluster, *m.compute, sp, m.prec);
  WIOLA_CHECK(!ps.empty(), "plan: no layout of ", r.devices, " devices divides the global batch of ", r.global_batch,
              " sequences (try --global-batch)");
  return ps;
}

// Which schedule the best layout runs, and why.
void print_schedule(const Prediction& best, const Cluster& cl) {
  const bool predicted_only = std::any_of(best.schedule_options.begin(), best.schedule_options.end(),
                                          [](const Prediction::ScheduleOption& o) { return !o.runnable; });
  if (!best.schedule_why.empty())
    std::printf("    schedule: %s, the fastest that fits of those wiola train runs%s\n      %s\n",
                to_string(best.layout.schedule).data(),
                predicted_only ? " (interleaved, zb-v: not picked on GPUs, where their pipeline messages go through "
                                 "host memory; their chunks cut by the chunk balancer)"
                               : "",
                best.schedule_why.c_str());
  else if (best.layout.pp > 1)
    std::printf("    schedule: %s%s (given)%s\n", to_string(best.layout.schedule).data(),
                best.layout.schedule == dist::Schedule::Interleaved
                    ? (" v" + std::to_string(best.layout.virtual_stages)).c_str()
                    : "",
                dist::chunked(best.layout.schedule) && cl.device != "cpu"
                    ? ": on GPUs wiola train sends its pipeline messages through host memory (not in this prediction)"
                    : "");
}

// The best layout: its step, schedule, memory and traffic.
void print_best(const Prediction& best, const Cluster& cl) {
  std::printf("\n  best: %s%s\n", best.layout.name().c_str(), best.fits ? "" : " (NOTHING FITS)");
  std::printf(
      "    step %.3f s = pipeline %.3f (compute %.3f, TP %.3f, transfers %.3f; bubble %.1f%% simulated = "
      "%.1f%% fill/drain + %.1f%% imbalance, %.1f%% for (p-1)/(m+p-1)) + embedding %.3f + DP exposed %.3f "
      "+ AdamW %.3f\n",
      best.step_s, best.pipeline_s, best.compute_s, best.tp_s, best.pp_s, 100 * best.bubble_sim,
      100 * best.bubble_fill_drain, 100 * best.bubble_imbalance, 100 * best.bubble_analytic, best.embed_s,
      best.dp_exposed_s, best.optimizer_s);
  print_schedule(best, cl);
  std::printf("    memory per device %.2f GiB: params %.2f, grads %.2f, optimizer %.2f, activations %.2f\n",
              best.memory.total() / 1073741824.0, best.memory.params / 1073741824.0, best.memory.grads / 1073741824.0,
              best.memory.optimizer / 1073741824.0, best.memory.activations / 1073741824.0);
  std::printf("    traffic per device per step: TP %.1f MiB, PP %.1f MiB, DP %.1f MiB, embedding %.1f MiB\n",
              best.traffic.tp / 1048576, best.traffic.pp / 1048576, best.traffic.dp / 1048576,
              best.traffic.embed / 1048576);
}

void print_run(const PlanRequest& r, const RunEstimate& est, double run_tokens) {
  std::printf(
      "  run: %.3g tokens (%s) = %.0f steps: %s wall clock, %.0f %s-hours; %d checkpoints every %.0f min "
      "cost %s (%s)\n",
      run_tokens, r.tokens > 0 ? "--tokens" : "Chinchilla 20 x params", est.steps, human_time(est.wall_s).c_str(),
      est.device_hours, r.cpu ? "rank" : "GPU", est.checkpoints, r.ckpt_minutes, human_time(est.checkpoint_s).c_str(),
      r.blocking_ckpt ? "blocking writes" : "background writes");
}

void write_plan_json(const PlanRequest& r, const PlanMachine& m, const std::vector<Prediction>& ps,
                     const RunEstimate& est, double run_tokens) {
  const Cluster& cl = m.cluster;
  nlohmann::json j = {{"model", model_name(r)},
                      {"params", param_count(r)},
                      {"T", seq_len(r)},
                      {"devices", r.devices},
                      {"device", cl.device},
                      {"global_batch", r.global_batch},
                      {"compute_model", m.compute->describe()},
                      {"peak_flops_per_device", cl.peak_flops},
                      {"run",
                       {{"tokens", run_tokens},
                        {"steps", est.steps},
                        {"wall_s", est.wall_s},
                        {"device_hours", est.device_hours},
                        {"checkpoints", est.checkpoints},
                        {"checkpoint_s", est.checkpoint_s}}}};
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& p : ps) arr.push_back(to_json(p));
  j["predictions"] = arr;
  write_text_atomic(r.json_out, j.dump(2) + "\n");
}

}  // namespace

void run_plan(const PlanRequest& r) {
  PlanMachine m = r.cpu ? cpu_machine(r) : gpu_machine(r);
  print_machine(r, m);
  const std::vector<Prediction> ps = predictions(r, m);
  print_table(ps, r.top);
  const Prediction& best = ps.front();
  const double run_tokens = r.tokens > 0 ? r.tokens : 20.0 * param_count(r);
  const RunEstimate est =
      estimate_run(best, workload(r, best.layout, m.prec), m.cluster, run_tokens, r.ckpt_minutes, !r.blocking_ckpt);
  print_best(best, m.cluster);
  print_run(r, est, run_tokens);
  if (!r.json_out.empty()) write_plan_json(r, m, ps, est, run_tokens);
}

}  // namespace wiola::perf
