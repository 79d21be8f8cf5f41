// The record of the run's GEMM choices (train/gemm_record.h).
#include "train/gemm_record.h"

#include <sstream>

#include "kernels/gemm_tuning.h"

namespace wiola {

namespace {

bool tunes(const Ops<float>& ops) {
  const std::string n = ops.name();
  return n.rfind("cuda", 0) == 0;  // the CUDA backends choose their GEMMs; the CPU ones do not
}

std::string default_algorithm(const std::string& mode) {
  if (mode == "none") return "the backend's own GEMM (no choice of algorithm)";
  if (mode == "cublaslt") return "cuBLASLt, the heuristic's first candidate";
  return "cublas default (cublasGemmEx, CUBLAS_GEMM_DEFAULT)";
}

}  // namespace

nlohmann::json gemm_record(const Ops<float>& ops, const BackendOptions& options) {
  const std::string mode = tunes(ops) ? std::string(to_string(options.gemm)) : "none";
  nlohmann::json r = {{"mode", mode},       {"device", ops.device_name()},         {"default", default_algorithm(mode)},
                      {"table_device", ""}, {"choices", nlohmann::json::object()}, {"tuning", nullptr}};
  const std::string text = ops.gemm_tuning();
  if (text.empty()) return r;
  const nlohmann::json tuning = nlohmann::json::parse(text);
  r["tuning"] = tuning;
  if (tuning.contains("tables") && !tuning["tables"].empty()) {
    const std::string device = tuning["tables"][0].value("device", "");
    r["table_device"] = device;
    for (const auto& [key, c] : gemm_table_for(text, device, "the backend's tuning table").choices)
      r["choices"][key] = c.algo == "cublaslt" ? "cublaslt " + c.config : c.algo;
  }
  return r;
}

std::string gemm_record_difference(const nlohmann::json& saved, const nlohmann::json& now) {
  if (saved.is_null()) return "";
  auto str = [](const nlohmann::json& j, const char* k) { return j.contains(k) ? j[k].get<std::string>() : ""; };
  std::ostringstream m;
  if (str(saved, "mode") != str(now, "mode")) {
    m << "GEMM mode " << str(saved, "mode") << " then, " << str(now, "mode") << " now";
    return m.str();
  }
  if (str(saved, "device") != str(now, "device")) {
    m << "device \"" << str(saved, "device") << "\" then, \"" << str(now, "device") << "\" now";
    return m.str();
  }
  if (str(saved, "mode") != "auto") return "";
  if (str(saved, "table_device") != str(now, "table_device")) {
    m << "tuning table of \"" << str(saved, "table_device") << "\" then, \"" << str(now, "table_device") << "\" now";
    return m.str();
  }
  // Same table key: the choices themselves (algorithm and cuBLASLt's words).
  auto table = [&](const nlohmann::json& r) {
    return r["tuning"].is_null() ? GemmTable{}
                                 : gemm_table_for(r["tuning"].dump(), str(r, "table_device"), "a GEMM record");
  };
  const GemmTable a = table(saved), b = table(now);
  int n = 0;
  std::string first;
  for (const auto& [key, c] : a.choices) {
    const auto it = b.choices.find(key);
    if (it != b.choices.end() && it->second == c) continue;
    if (n++ < 3) first += (first.empty() ? "" : "; ") + key;
  }
  for (const auto& [key, c] : b.choices)
    if (!a.choices.count(key) && n++ < 3) first += (first.empty() ? "" : "; ") + key;
  if (n == 0) return "";
  m << n << " GEMM shape(s) with another algorithm or none recorded then (" << first << (n > 3 ? "; ..." : "") << ")";
  return m.str();
}

}  // namespace wiola
