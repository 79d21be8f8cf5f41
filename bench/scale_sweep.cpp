// `wiola bench scale`'s sweep (bench/scale_sweep.h).
#include "bench/scale_sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Row {
  ScaleConfig c;
  bool ok = false;
  std::string status;
  double seconds = 0;
  double predicted_s = 0;  // the planner's step (with --link), 0: none
  nlohmann::json report;
};

// The layout's `--set` options, as wiola train and wiola plan take them.
std::string layout_sets(const ScaleConfig& c) {
  std::ostringstream o;
  o << " --set model.preset=" << c.model << " --set parallel.tp=" << c.g.tp << " --set parallel.pp=" << c.g.pp
    << " --set parallel.dp=" << c.g.dp << " --set train.micro_batch=" << c.micro_batch
    << " --set train.grad_accum=" << c.micro_batches << " --set parallel.zero=" << (c.zero ? "true" : "false")
    << " --set train.recompute=" << (c.recompute ? "true" : "false") << " --set train.threads=" << c.threads;
  return o.str();
}

// How a run of c.ranks() ranks starts: plain mpirun on this machine, or
// launch/mpirun.sh with the sweep's hostfile.
std::string launcher(const ScaleConfig& c, const ScaleSweep& s, const std::string& src) {
  if (c.ranks() == 1) return "";
  if (s.hostfile.empty()) return "mpirun -np " + std::to_string(c.ranks()) + " --bind-to none ";
  return "bash " + shell_quoted(src + "/launch/mpirun.sh") + " --hostfile " + shell_quoted(s.hostfile) + " -np " +
         std::to_string(c.ranks()) + (s.placement == "round-robin" ? " --map-by node" : "") + " -- ";
}

// The planner's step for c (wiola plan --cpu with the sweep's link), 0 when
// it fails (its log says why).
double predict_one(const ScaleConfig& c, const ScaleSweep& s, const std::string& wiola, const fs::path& dir,
                   const std::string& plan_sets) {
  const fs::path out = dir / "runs" / (c.name() + ".plan.json"), log = dir / "logs" / (c.name() + ".plan.log");
  const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(c.threads) + " " + shell_quoted(wiola) +
                          " plan --cpu --ranks " + std::to_string(c.ranks()) + " --link " + shell_quoted(s.link) +
                          " --placement " + s.placement + " --json " + shell_quoted(out.string()) + plan_sets +
                          layout_sets(c) + " > " + shell_quoted(log.string()) + " 2>&1";
  if (std::system(cmd.c_str()) != 0 || !fs::exists(out)) return 0.0;
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  return j.is_object() && j.contains("predictions") && !j["predictions"].empty()
             ? j["predictions"][0].value("step_s", 0.0)
             : 0.0;
}

std::string eta(double s) {
  char buf[32];
  const long v = long(s + 0.5);
  if (v >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", v / 60, v % 60);
  else std::snprintf(buf, sizeof buf, "%lds", v);
  return buf;
}

std::string last_error_line(const fs::path& log) {
  std::ifstream f(log);
  std::string line, err, last;
  while (std::getline(f, line)) {
    if (line.find("error") != std::string::npos) err = line;
    if (!line.empty()) last = line;
  }
  return err.empty() ? last : err;
}

Row run_one(const ScaleConfig& c, const ScaleSweep& s, const std::string& wiola, const fs::path& dir,
            const std::string& common, const std::string& src) {
  Row r;
  r.c = c;
  const fs::path run = dir / "runs" / c.name(), log = dir / "logs" / (c.name() + ".log");
  fs::create_directories(run);
  std::ostringstream cmd;
  cmd << launcher(c, s, src) << shell_quoted(wiola) << " train -q" << common << layout_sets(c)
      << " --set checkpoint.dir= --set train.run_dir=" << shell_quoted(run.string()) << " > "
      << shell_quoted(log.string()) << " 2>&1";
  const auto t0 = Clock::now();
  const int rc = std::system(cmd.str().c_str());
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const fs::path rep = run / "report.json";
  if (rc == 0 && fs::exists(rep)) {
    std::ifstream f(rep);
    r.report = nlohmann::json::parse(f);
    r.ok = true;
    r.status = "ok";
  } else {
    r.status = "failed: " + last_error_line(log);
  }
  return r;
}

double num(const nlohmann::json& j, const char* k) {
  return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0;
}

std::string fixed1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// "predicted / measured ms (error)" of a run's step.
std::string step_vs(const Row& r) {
  const double meas = r.report.contains("time_per_step_s") ? num(r.report["time_per_step_s"]["mean"], "total") : 0.0;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.1f / %.1f ms (%+.0f %%)", r.predicted_s * 1e3, meas * 1e3,
                meas > 0 ? 100 * (r.predicted_s / meas - 1) : 0.0);
  return buf;
}

// The most memory any rank holds in each class (MiB).
nlohmann::json max_memory(const nlohmann::json& rep) {
  nlohmann::json m = {{"params", 0.0}, {"grads", 0.0}, {"optimizer", 0.0}, {"activations", 0.0}, {"peak", 0.0}};
  if (!rep.contains("memory_mib_per_rank")) return m;
  for (const auto& r : rep["memory_mib_per_rank"])
    for (auto& [k, v] : m.items()) v = std::max(v.get<double>(), num(r, k.c_str()));
  return m;
}

void write_outputs(const std::vector<Row>& rows, const fs::path& dir, int cores, const std::string& source_dir) {
  const std::vector<std::string> parts = {"compute", "comm", "bubble", "data", "optimizer", "checkpoint", "other"};
  std::ostringstream csv, md;
  csv << "name,model,layout,ranks,threads,tp,pp,dp,micro_batch,micro_batches,zero,recompute,status,tokens_per_s,"
         "baseline_tokens_per_s,speedup,ideal_speedup,mfu,bubble_predicted,bubble_measured,step_predicted_ms,"
         "step_measured_ms";
  for (const auto& p : parts) csv << "," << p << "_ms";
  csv << ",params_mib,grads_mib,optimizer_mib,activations_mib,peak_mib,tp_bytes,pp_bytes,dp_bytes,embed_bytes\n";
  md << "# Scaling sweep\n\n";
  bool contended = false;
  for (const Row& r : rows) contended |= r.c.ranks() * r.c.threads > cores;
  md << "Every row is one `wiola train` run (figures over steps 2..; time per step is the mean over ranks). "
     << "This host has " << cores << " cores.";
  if (contended)
    md << " **Rows with ranks x threads > " << cores << " time-share cores: their throughput measures contention, "
       << "not scaling** (marked *).";
  md << " Ideal speedup: the busy cores over the baseline's (the same model on one rank).\n\n";
  md << "| config | ranks x threads | status | tokens/s | speedup / ideal | MFU | bubble pred. / meas. | step ms pred. / meas. |";
  for (const auto& p : parts) md << " " << p << " ms |";
  md << " max MiB/rank params / grads / opt / act / peak |\n|";
  for (int i = 0; i < 8 + int(parts.size()); ++i) md << "---|";
  md << "\n";
  for (const Row& r : rows) {
    double base = 0;
    int base_cores = 1;
    for (const Row& b : rows)
      if (b.ok && b.c.model == r.c.model && b.c.ranks() == 1 && b.c.micro_batches == r.c.micro_batches &&
          b.c.recompute == r.c.recompute) {
        base = num(b.report, "tokens_per_s");
        base_cores = b.c.threads;
        break;
      }
    const int used = std::min(cores, r.c.ranks() * r.c.threads);
    const double ideal = double(used) / base_cores;
    const double tps = r.ok ? num(r.report, "tokens_per_s") : 0.0;
    const nlohmann::json tm =
        r.ok && r.report.contains("time_per_step_s") ? r.report["time_per_step_s"]["mean"] : nlohmann::json::object();
    const nlohmann::json mem = max_memory(r.report);
    const nlohmann::json comm = r.ok && r.report.contains("comm_per_rank_per_step") ? r.report["comm_per_rank_per_step"]
                                                                                    : nlohmann::json::object();
    const auto bytes = [&](const char* g) { return comm.contains(g) ? num(comm[g], "measured_bytes") : 0.0; };
    const std::string flag = r.c.ranks() * r.c.threads > cores ? "*" : "";
    csv << r.c.name() << "," << r.c.model << "," << r.c.layout << "," << r.c.ranks() << "," << r.c.threads << ","
        << r.c.g.tp << "," << r.c.g.pp << "," << r.c.g.dp << "," << r.c.micro_batch << "," << r.c.micro_batches << ","
        << (r.c.zero && r.c.g.dp > 1) << "," << r.c.recompute << ",\"" << r.status << "\"," << tps << "," << base << ","
        << (base > 0 ? tps / base : 0) << "," << ideal << "," << num(r.report, "mfu") << ","
        << num(r.report, "bubble_predicted") << "," << num(r.report, "bubble_measured") << "," << r.predicted_s * 1e3
        << "," << num(tm, "total") * 1e3;
    for (const auto& p : parts) csv << "," << num(tm, p.c_str()) * 1e3;
    csv << "," << mem["params"] << "," << mem["grads"] << "," << mem["optimizer"] << "," << mem["activations"] << ","
        << mem["peak"] << "," << bytes("tp") << "," << bytes("pp") << "," << bytes("dp") << "," << bytes("embed")
        << "\n";
    char buf[512];
    if (!r.ok) {
      md << "| " << r.c.name() << " | " << r.c.ranks() << " x " << r.c.threads << flag << " | " << r.status << " |";
      for (int i = 0; i < 5 + int(parts.size()) + 1; ++i) md << " - |";
      md << "\n";
      continue;
    }
    std::snprintf(buf, sizeof buf, "| %s | %d x %d%s | ok | %.0f | %.2f / %.2f | %.1f%% | %.3f / %.3f |",
                  r.c.name().c_str(), r.c.ranks(), r.c.threads, flag.c_str(), tps, base > 0 ? tps / base : 0.0, ideal,
                  100 * num(r.report, "mfu"), num(r.report, "bubble_predicted"), num(r.report, "bubble_measured"));
    md << buf << " " << (r.predicted_s > 0 ? step_vs(r) : "- / " + fixed1(num(tm, "total") * 1e3)) << " |";
    for (const auto& p : parts) {
      std::snprintf(buf, sizeof buf, " %.1f |", num(tm, p.c_str()) * 1e3);
      md << buf;
    }
    std::snprintf(buf, sizeof buf, " %.1f / %.1f / %.1f / %.1f / %.0f |\n", mem["params"].get<double>(),
                  mem["grads"].get<double>(), mem["optimizer"].get<double>(), mem["activations"].get<double>(),
                  mem["peak"].get<double>());
    md << buf;
  }
  wiola::write_text_atomic((dir / "scale.csv").string(), csv.str());
  const std::string script = source_dir + "/bench/scale_plots.py";
  std::string plots = "(no plots: " + script + " or matplotlib missing)";
  if (fs::exists(script)) {
    const std::string cmd = "/usr/bin/python3 " + shell_quoted(script) + " " + shell_quoted(dir.string()) + " > " +
                            shell_quoted((dir / "plots.log").string()) + " 2>&1";
    if (std::system(cmd.c_str()) == 0)
      plots = "![throughput](throughput.png)\n\n![time per step](breakdown.png)\n\n![memory per rank](memory.png)" +
              std::string(fs::exists(dir / "predicted.png") ? "\n\n![predicted and measured step](predicted.png)" : "");
  }
  md << "\n" << plots << "\n";
  wiola::write_text_atomic((dir / "report.md").string(), md.str());
}

// The bundled Brown corpus as shards in DIR/shards (once).
std::string default_data(const fs::path& dir, const std::string& wiola, const std::string& src) {
  const std::string data = (dir / "shards" / "manifest.json").string();
  if (fs::exists(data)) return data;
  const std::string txt = (dir / "brown.txt").string();
  const std::string cmd = "xz -dc " + shell_quoted(src + "/data/brown/brown.txt.xz") + " > " + shell_quoted(txt) +
                          " && " + shell_quoted(wiola) + " prep --no-progress --tokenizer " +
                          shell_quoted(src + "/data/wiola360m/tokenizer.json") + " --output " +
                          shell_quoted((dir / "shards").string()) + " " + shell_quoted(txt) + " > " +
                          shell_quoted((dir / "logs" / "prep.log").string()) + " 2>&1";
  std::printf("bench scale: preparing the Brown corpus shards in %s\n", (dir / "shards").c_str());
  WIOLA_CHECK(std::system(cmd.c_str()) == 0, "bench scale: preparing the data failed (see ",
              (dir / "logs" / "prep.log").string(), "); give --data");
  return data;
}

}  // namespace

ScaleGrid parse_scale_layout(const std::string& name) {
  ScaleGrid g;
  if (name == "single") return g;
  std::stringstream ss(name);
  std::string part;
  while (std::getline(ss, part, 'x')) {
    int* dst = part.rfind("tp", 0) == 0   ? &g.tp
               : part.rfind("pp", 0) == 0 ? &g.pp
               : part.rfind("dp", 0) == 0 ? &g.dp
                                          : nullptr;
    int v = 0;
    try {
      v = std::stoi(part.substr(2));
    } catch (const std::exception&) {
      v = 0;
    }
    WIOLA_CHECK(dst && v >= 1, "--layouts: '", name, "' is not single or tpN/ppN/dpN joined by x (e.g. tp2xpp2)");
    *dst = v;
  }
  return g;
}

std::string ScaleConfig::name() const {
  return model + "_" + layout + "_m" + std::to_string(micro_batches) + (g.dp > 1 ? (zero ? "_zero" : "_nozero") : "") +
         (recompute ? "_rc" : "");
}

std::vector<ScaleConfig> scale_configs(const ScaleSweep& s, int cores) {
  std::vector<ScaleConfig> configs;
  for (const auto& model : s.models) {
    model_preset(model);  // unknown presets fail here, before any run
    for (const auto& lay : s.layouts)
      for (const int m : s.micro_batches)
        for (const bool z : s.zero)
          for (const bool rc : s.recompute) {
            ScaleConfig c;
            c.model = model;
            c.layout = lay;
            c.g = parse_scale_layout(lay);
            c.micro_batches = m;
            c.zero = z;
            c.recompute = rc;
            if (c.g.dp == 1 && !c.zero && s.zero.size() > 1) continue;  // ZeRO means nothing without DP
            const int per = c.g.dp * c.micro_batches;
            c.micro_batch = per > 0 && s.global_batch % per == 0 ? s.global_batch / per : 0;
            c.threads = s.threads > 0 ? s.threads : std::max(1, cores / c.ranks());
            configs.push_back(c);
          }
  }
  return configs;
}

void run_scale_sweep(const ScaleSweep& s, const std::string& wiola, const std::string& src) {
  WIOLA_CHECK(s.steps >= 2 && s.global_batch >= 1, "bench scale: --steps must be >= 2 and --global-batch >= 1");
  const fs::path dir = fs::absolute(s.out);
  fs::create_directories(dir / "logs");
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  const std::vector<ScaleConfig> configs = scale_configs(s, cores);
  const std::string data = s.data.empty() ? default_data(dir, wiola, src) : s.data;
  std::string common = " --set train.steps=" + std::to_string(s.steps) +
                       " --set train.lr_max=1e-3 --set data.path=" + shell_quoted(data);
  for (const auto& set : s.sets) common += " --set " + shell_quoted(set);
  WIOLA_CHECK(s.placement == "block" || s.placement == "round-robin",
              "bench scale: --placement must be block or "
              "round-robin (got '",
              s.placement, "')");
  std::printf("bench scale: %zu configurations, %d steps each, global batch %d, into %s\n", configs.size(), s.steps,
              s.global_batch, dir.c_str());
  std::vector<Row> rows;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < configs.size(); ++i) {
    const ScaleConfig& c = configs[i];
    std::printf("[%zu/%zu] %-40s ", i + 1, configs.size(), c.name().c_str());
    std::fflush(stdout);
    Row r;
    if (c.micro_batch == 0) {
      r.c = c;
      r.status = "failed: global batch " + std::to_string(s.global_batch) +
                 " is not a multiple of dp x micro-batches = " + std::to_string(c.g.dp * c.micro_batches);
    } else {
      r = run_one(c, s, wiola, dir, common, src);
      if (!s.link.empty() && r.ok) r.predicted_s = predict_one(c, s, wiola, dir, common);
    }
    rows.push_back(r);
    const double spent = std::chrono::duration<double>(Clock::now() - t0).count();
    std::string what = r.ok ? "ok, " + std::to_string(long(num(r.report, "tokens_per_s"))) + " tokens/s" : r.status;
    if (r.predicted_s > 0) what += ", step " + step_vs(r);
    std::printf("%s (%.1f s; ETA %s)\n", what.c_str(), r.seconds,
                eta(spent / double(i + 1) * double(configs.size() - i - 1)).c_str());
    std::fflush(stdout);
  }
  write_outputs(rows, dir, cores, src);
  std::printf("bench scale: %s, %s\n", (dir / "report.md").c_str(), (dir / "scale.csv").c_str());
}

}  // namespace wiola::bench
