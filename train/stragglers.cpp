// Per-rank step times and straggler warnings (train/stragglers.h).
#include "train/stragglers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <thread>

#include "dist/diagnostics.h"
#include "util/error.h"
#include "util/test_hooks.h"

namespace wiola {
namespace {

constexpr size_t kMinWindow = 5;  // steps a log interval's median looks back at least

// "rank 1 (stage 0): 45.2 ms, 2.10 x its peers' median 21.5 ms"
std::string describe(const std::vector<int>& slow, const std::vector<double>& own, const std::vector<int>& group_of) {
  std::string s;
  for (int r : slow) {
    std::vector<double> peers;
    for (size_t q = 0; q < own.size(); ++q)
      if (group_of[size_t(r)] < 0 || group_of[q] == group_of[size_t(r)]) peers.push_back(own[q]);
    const double med = median_of(peers);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%srank %d%s: %.1f ms, %.2f x its peers' median %.1f ms", s.empty() ? "" : "; ",
                  r, group_of[size_t(r)] >= 0 ? (" (stage " + std::to_string(group_of[size_t(r)]) + ")").c_str() : "",
                  own[size_t(r)] * 1e3, own[size_t(r)] / med, med * 1e3);
    s += buf;
  }
  return s;
}

}  // namespace

double median_of(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(h), v.end());
  if (v.size() % 2) return v[h];
  const double hi = v[h];
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + std::ptrdiff_t(h)));
}

std::vector<int> find_stragglers(const std::vector<double>& own_s, const std::vector<int>& group_of, double share) {
  std::vector<int> slow;
  if (share <= 0) return slow;
  for (double x : own_s)
    if (!std::isfinite(x)) return slow;
  std::map<int, std::vector<double>> groups;
  for (size_t r = 0; r < own_s.size(); ++r) groups[group_of[r]].push_back(own_s[r]);
  const double all = median_of(own_s);
  for (size_t r = 0; r < own_s.size(); ++r) {
    const int g = group_of[r];
    const double ref = g >= 0 ? median_of(groups[g]) : all;
    if (own_s[r] > (1.0 + share) * ref) slow.push_back(int(r));
  }
  return slow;
}

StragglerWatch::StragglerWatch(const RunConfig& rc, dist::Comm& world)
    : world_(world), share_(rc.train.straggler_share), log_every_(rc.train.log_every) {
  // Peers: the ranks of one pipeline stage (rank = pp·(DP·TP) + dp·TP + tp,
  // docs/distributed.md), when a stage has several; else every rank.
  const int per_stage = rc.parallel.tp * rc.parallel.dp;
  for (int r = 0; r < world.size(); ++r) group_of_.push_back(per_stage > 1 ? r / per_stage : -1);
  if (const TestHook h(Hook::SlowRank); h.set()) {
    h.fields(2, 2);
    slow_rank_ = int(h.integer(0, 0, INT32_MAX));
    slow_ms_ = h.number(1, 0.0);
  }
}

void StragglerWatch::inject_delay() const {
  if (slow_rank_ == world_.rank() && slow_ms_ > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(slow_ms_ * 1e3)));
}

void StragglerWatch::after_step(int64_t t, const StepTimes& cur, bool accounted, int64_t last_step) {
  if (accounted) {
    step_s_.push_back(cur.total);
    own_s_.push_back(cur.total - cur.comm - cur.bubble - cur.checkpoint);
  }
  if (share_ <= 0 || world_.size() < 2 || !(t % log_every_ == 0 || t == last_step)) return;
  // This interval's median, over at least the last kMinWindow steps.
  const size_t from = std::min(interval_from_, own_s_.size() - std::min(own_s_.size(), kMinWindow));
  interval_from_ = own_s_.size();
  const double mine = median_of({own_s_.begin() + std::ptrdiff_t(from), own_s_.end()});
  dist::set_context("step " + std::to_string(t) + " straggler check");
  std::vector<double> own(size_t(world_.size()));
  world_.all_gather(&mine, own.data(), 1, dist::DType::F64);
  if (world_.rank() != 0) return;
  const std::vector<int> slow = find_stragglers(own, group_of_, share_);
  if (slow == flagged_) return;  // said already (or still nothing to say)
  if (!slow.empty())
    std::fprintf(stderr, "wiola train: warning: straggler at step %lld: %s (own work per step, median since the "
                 "last log line; train.straggler_share = %g)\n", (long long)t,
                 describe(slow, own, group_of_).c_str(), share_);
  else
    std::fprintf(stderr, "wiola train: no straggler at step %lld any more\n", (long long)t);
  std::fflush(stderr);
  flagged_ = slow;
}

nlohmann::json StragglerWatch::report() const {
  const double mine[2] = {median_of(step_s_), median_of(own_s_)};
  const size_t n = size_t(world_.size());
  std::vector<double> all(2 * n);
  if (n > 1) world_.all_gather(mine, all.data(), 2, dist::DType::F64);
  else all = {mine[0], mine[1]};
  if (world_.rank() != 0) return nullptr;
  std::vector<double> step(n), own(n);
  for (size_t r = 0; r < n; ++r) step[r] = all[2 * r], own[r] = all[2 * r + 1];
  const auto json_or_null = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); };
  nlohmann::json j = {{"straggler_share", share_}};
  for (size_t r = 0; r < n; ++r) {
    j["median_step_s"].push_back(json_or_null(step[r]));
    j["median_own_s"].push_back(json_or_null(own[r]));
  }
  const std::vector<int> slow = find_stragglers(own, group_of_, share_);
  j["stragglers"] = slow;
  if (!std::isfinite(own[0])) return j;  // no accounted step
  std::printf("  step time per rank (median over steps 2..; ms, wall / own work = not waiting on other ranks):");
  for (size_t r = 0; r < n; ++r) std::printf(" %zu: %.1f/%.1f", r, step[r] * 1e3, own[r] * 1e3);
  std::printf("\n");
  if (!slow.empty())
    std::printf("  stragglers (own work over %.2f x its peers' median): %s\n", 1.0 + share_,
                describe(slow, own, group_of_).c_str());
  return j;
}

}  // namespace wiola
