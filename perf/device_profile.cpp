#include "perf/device_profile.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "model/flops.h"
#include "perf/cost_model.h"
#include "util/error.h"

namespace wiola::perf {

namespace {

double nearest_rate(const std::map<int, double>& rates, int dh, const char* what) {
  WIOLA_CHECK(!rates.empty(), "device profile: no ", what, " rate");
  auto best = rates.begin();
  for (auto it = rates.begin(); it != rates.end(); ++it)
    if (std::abs(it->first - dh) <= std::abs(best->first - dh)) best = it;
  return best->second;
}

double positive(const nlohmann::json& j, const char* key, const std::string& where) {
  WIOLA_CHECK(j.contains(key) && j.at(key).is_number(), where, ": '", key, "' missing or not a number");
  const double v = j.at(key).get<double>();
  WIOLA_CHECK(std::isfinite(v) && v > 0, where, ": '", key, "' is ", v, ", not a positive number");
  return v;
}

std::map<int, double> rates_by_dh(const nlohmann::json& j, const char* key, const std::string& where) {
  WIOLA_CHECK(j.contains(key) && j.at(key).is_object() && !j.at(key).empty(), where, ": '", key,
              "' must be an object of head dimension -> TFLOP/s");
  std::map<int, double> out;
  for (const auto& [dh, v] : j.at(key).items()) {
    int d = 0;
    WIOLA_CHECK(std::sscanf(dh.c_str(), "%d", &d) == 1 && d > 0, where, ": '", key, "' has head dimension '", dh, "'");
    out[d] = positive(j.at(key), dh.c_str(), where + " " + key);
  }
  return out;
}

nlohmann::json rates_json(const std::map<int, double>& rates) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [dh, v] : rates) j[std::to_string(dh)] = v;
  return j;
}

// Milliseconds of one named op in the step benchmark's costliest ops.
double top_op_ms(const nlohmann::json& step, const std::string& op) {
  for (const auto& o : step.at("top_ops"))
    if (o.at("op").get<std::string>() == op) return o.at("ms").get<double>();
  fail("device profile fit: the step's top_ops have no '", op, "'");
}

// The kernel benchmark's causal attention rates of one variant, by direction.
void take_kernel_rates(DeviceProfile& p, const std::vector<nlohmann::json>& lines, const std::string& variant) {
  for (const auto& l : lines) {
    if (l.value("section", "") != "attention" || l.value("variant", "") != variant || l.value("layer", "") != "causal" ||
        !l.value("ok", false) || !l.contains("tflops"))
      continue;
    const std::string dir = l.value("dir", "");
    auto& rates = dir == "fwd" ? p.attention_fwd_tflops : p.attention_bwd_tflops;
    if (dir == "fwd" || dir == "bwd") rates[l.at("dh").get<int>()] = l.at("tflops").get<double>();
  }
}

class ProfileCompute final : public ComputeModel {
 public:
  explicit ProfileCompute(DeviceProfile p) : p_(std::move(p)) {}
  double fwd(const Workload& w, int s) override {
    const StageKinds& k = w.stages[size_t(s)].kinds;
    if (k.dh == 0) return w.stages[size_t(s)].fwd_flops / gemm();  // a GPT workload: GEMM rate throughout
    return k.gemm_fwd / gemm() + attention_fwd(k) + k.units_fwd * p_.memory_bound_ns * 1e-9;
  }
  double bwd(const Workload& w, int s) override {
    const StageKinds& k = w.stages[size_t(s)].kinds;
    if (k.dh == 0) return w.stages[size_t(s)].bwd_flops / gemm();
    const double attn = 2.5 * k.attn_fwd / (p_.attention_bwd_at(k.dh) * 1e12) + (k.recompute ? attention_fwd(k) : 0.0);
    return k.gemm_bwd / gemm() + attn + k.units_bwd * p_.memory_bound_ns * 1e-9;
  }
  // W: the weight-gradient GEMMs at the GEMM rate (B keeps the attention
  // and the memory-bound work).
  double bwd_weight(const Workload& w, int s) override {
    const StageKinds& k = w.stages[size_t(s)].kinds;
    return (k.dh == 0 ? w.stages[size_t(s)].bwd_weight_flops : k.gemm_bwd_weight) / gemm();
  }
  double optimizer(double elems) override { return elems * p_.optimizer_ns * 1e-9; }
  std::string describe() const override {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "device profile %s (%s, %s, build %s): GEMMs %.0f TFLOP/s, attention %s, memory-bound %.3g ns per "
                  "token x d x layer, AdamW %.3g ns per parameter",
                  p_.key.c_str(), p_.card.c_str(), p_.date.c_str(), p_.build.c_str(), p_.gemm_tflops,
                  attention_summary().c_str(), p_.memory_bound_ns, p_.optimizer_ns);
    return buf;
  }

 private:
  double gemm() const { return p_.gemm_tflops * 1e12; }
  double attention_fwd(const StageKinds& k) const { return k.attn_fwd / (p_.attention_fwd_at(k.dh) * 1e12); }
  std::string attention_summary() const {
    std::string s;
    for (const auto& [dh, f] : p_.attention_fwd_tflops) {
      char buf[80];
      std::snprintf(buf, sizeof buf, "%sd_h %d fwd %.0f / bwd %.0f TFLOP/s", s.empty() ? "" : ", ", dh, f,
                    p_.attention_bwd_at(dh));
      s += buf;
    }
    return s;
  }
  DeviceProfile p_;
};

std::string read_text(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  WIOLA_CHECK(in, what, " '", path, "' cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": not JSON (", e.what(), ")");
  }
}

}  // namespace

double DeviceProfile::attention_fwd_at(int dh) const { return nearest_rate(attention_fwd_tflops, dh, "attention forward"); }
double DeviceProfile::attention_bwd_at(int dh) const { return nearest_rate(attention_bwd_tflops, dh, "attention backward"); }

DeviceProfile device_profile_from_json(const nlohmann::json& j, const std::string& where) {
  WIOLA_CHECK(j.is_object(), where, ": a device profile is a JSON object");
  DeviceProfile p;
  for (auto [field, key] : {std::pair{&p.key, "key"}, {&p.card, "card"}, {&p.date, "date"}, {&p.build, "build"},
                            {&p.source, "source"}}) {
    WIOLA_CHECK(j.contains(key) && j.at(key).is_string(), where, ": '", key, "' missing or not a string");
    *field = j.at(key).get<std::string>();
  }
  p.gemm_tflops = positive(j, "gemm_tflops", where);
  p.attention_fwd_tflops = rates_by_dh(j, "attention_fwd_tflops", where);
  p.attention_bwd_tflops = rates_by_dh(j, "attention_bwd_tflops", where);
  p.memory_bound_ns = positive(j, "memory_bound_ns_per_token_d_layer", where);
  p.optimizer_ns = positive(j, "optimizer_ns_per_parameter", where);
  return p;
}

nlohmann::json device_profile_to_json(const DeviceProfile& p) {
  return {{"key", p.key},
          {"card", p.card},
          {"date", p.date},
          {"build", p.build},
          {"source", p.source},
          {"gemm_tflops", p.gemm_tflops},
          {"attention_fwd_tflops", rates_json(p.attention_fwd_tflops)},
          {"attention_bwd_tflops", rates_json(p.attention_bwd_tflops)},
          {"memory_bound_ns_per_token_d_layer", p.memory_bound_ns},
          {"optimizer_ns_per_parameter", p.optimizer_ns}};
}

const DeviceProfile* find_device_profile(const std::string& key) {
  static const std::vector<DeviceProfile> profiles = [] {
    std::vector<DeviceProfile> out;
    for (const auto& [file, text] : committed_profile_texts())
      out.push_back(device_profile_from_json(parse_json(text, file), file));
    return out;
  }();
  for (const auto& p : profiles)
    if (p.key == key) return &p;
  return nullptr;
}

DeviceProfile fit_device_profile(const ProfileFit& f) {
  WIOLA_CHECK(f.batch >= 1, "device profile fit: batch must be positive");
  WIOLA_CHECK(f.step.contains("op_class_ms") && f.step.contains("top_ops"), "device profile fit: the step benchmark's "
              "JSON has no op_class_ms/top_ops (run wiola_gpu_bench with its profiled step)");
  Layout one;
  one.micro_batch = f.batch;
  one.recompute = f.recompute;
  const StageKinds k = stage_kinds(f.model, one, 0);
  const nlohmann::json& cls = f.step.at("op_class_ms");
  auto ms = [&](const char* c) { return cls.value(c, 0.0); };
  DeviceProfile p;
  p.key = f.key;
  p.card = f.card;
  p.date = f.date;
  p.build = f.build;
  p.source = f.source;
  // The context attention's FLOPs are counted with the GEMMs' (model/flops.h), so is its time.
  p.gemm_tflops = (k.gemm_fwd + k.gemm_bwd) / ((ms("gemm") + ms("context attention")) * 1e-3) / 1e12;
  // FlashAttention's count: one forward 4 B H T^2 d_h / 2 a layer; the backward 2.5 x that; a
  // recomputed step runs the forward twice.
  const ModelConfig& c = f.model;
  const double fa_fwd = 4.0 * f.batch * c.H * double(c.T) * c.T * c.dh() / 2.0 * c.L;
  const double fwd_ms = top_op_ms(f.step, "attention_fwd"), bwd_ms = top_op_ms(f.step, "attention_bwd");
  p.attention_fwd_tflops[c.dh()] = fa_fwd * (f.recompute ? 2 : 1) / (fwd_ms * 1e-3) / 1e12;
  p.attention_bwd_tflops[c.dh()] = 2.5 * fa_fwd / (bwd_ms * 1e-3) / 1e12;
  take_kernel_rates(p, f.kernel_lines, f.attention_variant);
  double rest_ms = 0;
  for (const auto& [name, v] : cls.items())
    if (name != "gemm" && name != "context attention" && name != "attention" && name != "optimizer")
      rest_ms += v.get<double>();
  p.memory_bound_ns = rest_ms * 1e6 / (k.units_fwd + k.units_bwd);
  p.optimizer_ns = ms("optimizer") * 1e6 / double(c.param_count());
  WIOLA_CHECK(p.gemm_tflops > 0 && p.memory_bound_ns > 0 && p.optimizer_ns > 0,
              "device profile fit: the step's op classes give a rate that is not positive");
  return p;
}

DeviceProfile fit_device_profile_files(const std::string& bench_json, const std::string& kernels_jsonl,
                                       const std::string& key, const std::string& build, const std::string& date) {
  const nlohmann::json b = parse_json(read_text(bench_json, "step benchmark JSON"), bench_json);
  WIOLA_CHECK(b.contains("bf16") && b.contains("preset") && b.contains("batch") && b.contains("T"), bench_json,
              ": not wiola_gpu_bench's JSON with a bf16 step (preset, T, batch, bf16)");
  ProfileFit f;
  f.key = key;
  f.build = build;
  f.date = date;
  f.card = b.value("device", "");
  f.step = b.at("bf16");
  f.model = model_preset(b.at("preset").get<std::string>());
  f.model.T = b.at("T").get<int>();
  f.batch = b.at("batch").get<int>();
  f.recompute = b.value("recompute", false);
  if (b.contains("backend_options")) f.attention_variant = b.at("backend_options").value("attention", "tc");
  char src[240];
  std::snprintf(src, sizeof src, "wiola_gpu_bench's profiled bf16 step, %s, T=%d, B=%d%s%s", f.model.name.c_str(),
                f.model.T, f.batch, f.recompute ? ", recompute" : "",
                kernels_jsonl.empty() ? "" : "; attention rates of wiola_kernel_bench where it has them");
  f.source = src;
  if (!kernels_jsonl.empty()) {
    std::istringstream lines(read_text(kernels_jsonl, "kernel benchmark JSON lines"));
    int n = 0;
    for (std::string line; std::getline(lines, line); ++n)
      if (!line.empty()) f.kernel_lines.push_back(parse_json(line, kernels_jsonl + " line " + std::to_string(n + 1)));
  }
  return fit_device_profile(f);
}

std::unique_ptr<ComputeModel> profile_compute_model(const DeviceProfile& p) {
  return std::make_unique<ProfileCompute>(p);
}

std::unique_ptr<ComputeModel> gpu_compute_model(const Cluster& cl, const GpuComputeChoice& ch) {
  const Accelerator& a = *find_accelerator(cl.device);
  if (!ch.profile_file.empty()) {
    const DeviceProfile p = device_profile_from_json(
        parse_json(read_text(ch.profile_file, "device profile"), ch.profile_file), ch.profile_file);
    WIOLA_CHECK(p.key == cl.device, ch.profile_file, ": a profile of '", p.key, "', not of the cluster's '", cl.device,
                "'");
    return profile_compute_model(p);
  }
  if (!ch.datasheet)
    if (const DeviceProfile* p = find_device_profile(cl.device)) return profile_compute_model(*p);
  return flops_compute_model(cl.peak_flops, ch.efficiency, a.memory_tbs * 1e3 * 0.8);
}

}  // namespace wiola::perf
