// The PyTorch baselines (bench/torch_baseline.h).
#include "bench/torch_baseline.h"

#include <cstdio>

#include "util/error.h"

namespace wiola {
namespace {

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace

nlohmann::json run_torch_baseline(const std::string& python, const std::string& script, const std::string& args,
                                  const std::string& env) {
  const std::string path = std::string(WIOLA_SOURCE_DIR) + "/bench/" + script;
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + python + " " + shell_quote(path) + " " + args +
                          " 2>&1";
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

std::string torch_model_args(const ModelConfig& cfg, int batch, int steps, int warmup) {
  char a[512];
  std::snprintf(a, sizeof a, "--d %d --L %d --H %d --Hkv %d --dA %d --dB %d --V %d --T %d --B %d --tau %.17g "
                "--steps %d --warmup %d%s", cfg.d, cfg.L, cfg.H, cfg.Hkv, cfg.dA, cfg.dB, cfg.V, cfg.T, batch,
                cfg.tau, steps, warmup, cfg.atm ? "" : " --no-atm");
  return a;
}

}  // namespace wiola
