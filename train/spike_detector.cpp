#include "train/spike_detector.h"

#include <cmath>
#include <cstdio>

#include "util/json.h"

namespace wiola {

SpikeVerdict SpikeDetector::check(double loss, bool skipped) {
  st_.consecutive_skipped = skipped ? st_.consecutive_skipped + 1 : 0;
  SpikeVerdict v;
  char buf[256];
  const std::vector<double>& recent = st_.recent_losses;
  if (s_.skipped > 0 && st_.consecutive_skipped >= s_.skipped) {
    v.rewind = true;
    std::snprintf(buf, sizeof buf, "%lld consecutive skipped steps (train.spike_skipped = %d)",
                  (long long)st_.consecutive_skipped, s_.skipped);
    v.reason = buf;
  } else if (s_.sigma > 0 && !skipped && std::isfinite(loss) && recent.size() >= size_t(s_.window)) {
    double mean = 0, var = 0;
    for (double x : recent) mean += x;
    mean /= double(recent.size());
    for (double x : recent) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / double(recent.size()));
    const double limit = mean + s_.sigma * sd;
    if (loss > limit) {
      v.rewind = true;
      std::snprintf(buf, sizeof buf, "loss spike: %.6g > mean %.6g + %g x std %.4g of the last %d steps", loss, mean,
                    s_.sigma, sd, s_.window);
      v.reason = buf;
    }
  }
  return v;
}

void SpikeDetector::accept(double loss, bool skipped) {
  if (skipped || !std::isfinite(loss)) return;
  st_.recent_losses.push_back(loss);
  if (st_.recent_losses.size() > size_t(s_.window)) st_.recent_losses.erase(st_.recent_losses.begin());
}

void spike_state_to_json(const SpikeState& st, nlohmann::json& spike) {
  spike["consecutive_skipped"] = st.consecutive_skipped;
  spike["recent_losses"] = st.recent_losses;
}

SpikeState spike_state_from_json(const nlohmann::json& spike, const std::string& where) {
  SpikeState st;
  st.consecutive_skipped = json_int<int64_t>(spike.at("consecutive_skipped"), where + "spike.consecutive_skipped");
  st.recent_losses = spike.at("recent_losses").get<std::vector<double>>();
  return st;
}

}  // namespace wiola
