#include "dist/schedule.h"

#include <algorithm>
#include <sstream>

#include "util/error.h"

namespace wiola::dist {
namespace {
void check_args(int pp, int stage, int m) {
  WIOLA_CHECK(pp >= 1 && stage >= 0 && stage < pp && m >= 1,
              "pipeline schedule: need pp >= 1, 0 <= stage < pp, m >= 1 (pp=",
              pp, " stage=", stage, " m=", m, ")");
}
}  // namespace

std::vector<Action> schedule_1f1b(int pp, int stage, int m) {
  check_args(pp, stage, m);
  std::vector<Action> s;
  const int warm = std::min(pp - stage - 1, m);
  int f = 0, b = 0;
  for (; f < warm; ++f) s.push_back({Op::Fwd, f});
  for (; f < m; ++f, ++b) {  // steady state: one forward, one backward
    s.push_back({Op::Fwd, f});
    s.push_back({Op::Bwd, b});
  }
  for (; b < m; ++b) s.push_back({Op::Bwd, b});  // cool-down
  return s;
}

std::vector<Action> schedule_gpipe(int pp, int stage, int m) {
  check_args(pp, stage, m);
  std::vector<Action> s;
  for (int i = 0; i < m; ++i) s.push_back({Op::Fwd, i});
  for (int i = 0; i < m; ++i) s.push_back({Op::Bwd, i});
  return s;
}

double bubble_fraction_predicted(int pp, int m) {
  return double(pp - 1) / double(m + pp - 1);
}

int max_in_flight(const std::vector<Action>& s) {
  int cur = 0, peak = 0;
  for (const Action& a : s) {
    cur += a.op == Op::Fwd ? 1 : -1;
    peak = std::max(peak, cur);
  }
  return peak;
}

PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& sched,
                              double t_fwd, double t_bwd) {
  const size_t pp = sched.size();
  return simulate_pipeline(sched, StageCosts{std::vector<double>(pp, t_fwd), std::vector<double>(pp, t_bwd), 0.0});
}

namespace {
// The event simulation itself: makespan, bubble fraction and start times.
PipelineSim simulate(const std::vector<std::vector<Action>>& sched, const StageCosts& cost) {
  const int pp = int(sched.size());
  int m = 0;
  for (const auto& s : sched)
    for (const Action& a : s) m = std::max(m, a.micro + 1);
  // done[op][stage][micro] = finish time, < 0 while not run.
  std::vector<std::vector<double>> fdone(pp, std::vector<double>(m, -1)),
      bdone(pp, std::vector<double>(m, -1));
  std::vector<size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0);
  PipelineSim r;
  r.start.resize(pp);
  double busy = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      while (next[s] < sched[s].size()) {
        const Action a = sched[s][next[s]];
        double ready = free_at[s];
        if (a.op == Op::Fwd) {
          if (s > 0) {
            if (fdone[s - 1][a.micro] < 0) break;
            ready = std::max(ready, fdone[s - 1][a.micro] + cost.link);
          }
        } else {
          if (fdone[s][a.micro] < 0) break;
          if (s + 1 < pp) {
            if (bdone[s + 1][a.micro] < 0) break;
            ready = std::max(ready, bdone[s + 1][a.micro] + cost.link);
          }
        }
        const double dur = a.op == Op::Fwd ? cost.fwd[size_t(s)] : cost.bwd[size_t(s)];
        r.start[s].push_back(ready);
        free_at[s] = ready + dur;
        (a.op == Op::Fwd ? fdone : bdone)[s][a.micro] = free_at[s];
        busy += dur;
        r.makespan = std::max(r.makespan, free_at[s]);
        ++next[s];
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int s = 0; s < pp; ++s)
    if (next[s] < sched[s].size()) {
      const Action a = sched[s][next[s]];
      stuck << " stage " << s << " waits at " << (a.op == Op::Fwd ? "F" : "B")
            << a.micro << ";";
    }
  WIOLA_CHECK(stuck.str().empty(), "pipeline schedule deadlocks:", stuck.str());
  r.bubble_fraction = r.makespan > 0 ? 1.0 - busy / (pp * r.makespan) : 0.0;
  return r;
}

// Every stage at the mean forward and the mean backward cost: the same work.
StageCosts mean_costs(const StageCosts& cost) {
  const auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return std::vector<double>(v.size(), v.empty() ? 0.0 : sum / double(v.size()));
  };
  return StageCosts{mean(cost.fwd), mean(cost.bwd), cost.link};
}

bool uniform(const std::vector<double>& v) { return v.empty() || std::equal(v.begin() + 1, v.end(), v.begin()); }
}  // namespace

PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& sched, const StageCosts& cost) {
  WIOLA_CHECK(cost.fwd.size() == sched.size() && cost.bwd.size() == sched.size(),
              "simulate_pipeline: one forward and one backward cost per stage");
  PipelineSim r = simulate(sched, cost);
  const bool balanced = uniform(cost.fwd) && uniform(cost.bwd);
  r.bubble_fill_drain = balanced ? r.bubble_fraction : simulate(sched, mean_costs(cost)).bubble_fraction;
  r.bubble_imbalance = r.bubble_fraction - r.bubble_fill_drain;
  return r;
}

std::string to_string(const std::vector<Action>& s) {
  std::ostringstream os;
  for (size_t i = 0; i < s.size(); ++i)
    os << (i ? " " : "") << (s[i].op == Op::Fwd ? "F" : "B") << s[i].micro;
  return os.str();
}

}  // namespace wiola::dist
