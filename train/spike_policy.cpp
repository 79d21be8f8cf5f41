#include "train/spike_policy.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "dist/diagnostics.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/test_hooks.h"

namespace wiola {
namespace {

// `w` added to the sorted, disjoint windows `list` (overlapping or adjacent
// ones merge).
void add_window(std::vector<StepWindow>& list, StepWindow w) {
  list.push_back(w);
  std::sort(list.begin(), list.end(), [](const StepWindow& a, const StepWindow& b) { return a.from < b.from; });
  std::vector<StepWindow> merged;
  for (const StepWindow& x : list) {
    if (!merged.empty() && x.from <= merged.back().to + 1) merged.back().to = std::max(merged.back().to, x.to);
    else merged.push_back(x);
  }
  list = std::move(merged);
}

nlohmann::json windows_json(const std::vector<StepWindow>& list) {
  nlohmann::json j = nlohmann::json::array();
  for (const StepWindow& x : list) j.push_back({x.from, x.to});
  return j;
}

}  // namespace

SpikePolicy::SpikePolicy(const RunConfig& rc, dist::Comm& world)
    : rc_(rc), world_(world), on_(rc.train.spike_sigma > 0 || rc.train.spike_skipped > 0),
      windows_(rc.train.skip_batches),
      detector_(SpikeSettings{rc.train.spike_sigma, rc.train.spike_window, rc.train.spike_skipped}) {}

void SpikePolicy::read_test_hook() {
  if (!on_) return;
  const TestHook h(Hook::InjectLossSpike);
  if (!h.set()) return;
  h.fields(1, 1);
  inject_ = h.integer(0, 1);
}

bool SpikePolicy::skipping(int64_t t) const {
  for (const StepWindow& w : windows_)
    if (t >= w.from && t <= w.to) return true;
  return false;
}

void SpikePolicy::restore(const ResumeState& st) {
  for (const StepWindow& w : st.skip_batches) add_window(windows_, w);
  rewinds_ = st.rewinds;
  detector_.restore({st.recent_losses, st.consecutive_skipped});
}

void SpikePolicy::save_to(ResumeState& st) const {
  st.spike = on_ || !windows_.empty();
  st.skip_batches = windows_;
  st.rewinds = rewinds_;
  st.consecutive_skipped = detector_.state().consecutive_skipped;
  st.recent_losses = detector_.state().recent_losses;
}

bool SpikePolicy::detected(int64_t t, const StepOutcome& out, std::string& why) {
  double seen = out.loss;  // what detection sees
  if (t == inject_) {
    seen *= 1000.0;
    inject_ = -1;  // the first time only
  }
  const SpikeVerdict v = detector_.check(seen, out.skipped);
  int64_t flag = v.rewind ? 1 : 0;
  why = v.reason;
  if (world_.size() > 1) {
    dist::set_context("step " + std::to_string(t) + " loss-spike decision");
    world_.broadcast(&flag, 1, 0);  // rank 0's decision on every rank
  }
  if (flag && why.empty()) why = "loss-spike policy (rank 0's decision)";
  if (flag) return true;
  detector_.accept(out.loss, out.skipped);
  return false;
}

std::string SpikePolicy::check_rewind(int64_t t, const std::string& why) const {
  const TrainSection& tr = rc_.train;
  const std::string at = why + " at step " + std::to_string(t);
  WIOLA_CHECK(rewinds_ < tr.spike_max_rewinds, at, ": not rewinding again, ", rewinds_,
              " rewinds made already (train.spike_max_rewinds = ", tr.spike_max_rewinds, ")");
  return at;
}

void SpikePolicy::rewound(int64_t t, const std::string& why, const std::string& at, const std::string& folder,
                          const ResumeState& st) {
  detector_.restore({st.recent_losses, st.consecutive_skipped});
  ++rewinds_;
  const StepWindow w{st.step + 1, t};
  add_window(windows_, w);
  if (world_.rank() != 0) return;
  std::printf("wiola train: %s: rewinding to %s (step %lld) and skipping the data of steps %lld..%lld "
              "(rewind %lld of at most %d)\n", at.c_str(), folder.c_str(), (long long)st.step, (long long)w.from,
              (long long)w.to, (long long)rewinds_, rc_.train.spike_max_rewinds);
  std::fflush(stdout);
  pending_ = {{"detected_at", t}, {"reason", why}, {"checkpoint_step", st.step},
              {"window", {w.from, w.to}}, {"rewinds", rewinds_}, {"skip_batches", windows_json(windows_)}};
}

nlohmann::json SpikePolicy::take_rewind_record() {
  nlohmann::json j = std::move(pending_);
  pending_ = nullptr;
  return j;
}

}  // namespace wiola

