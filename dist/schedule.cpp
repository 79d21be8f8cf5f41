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

std::vector<Action> schedule_interleaved(int pp, int stage, int m, int v) {
  check_args(pp, stage, m);
  WIOLA_CHECK(v >= 1, "interleaved schedule: need v >= 1 chunks per rank (v=", v, ")");
  if (v == 1) return schedule_1f1b(pp, stage, m);
  WIOLA_CHECK(m % pp == 0, "interleaved schedule: the micro-batches (", m, ") must be a multiple of pp (", pp,
              ") with v > 1 chunks per rank");
  const int total = m * v, group = pp * v;
  // The k-th forward (backward) of the rank: micro-batches in groups of pp,
  // each group through every chunk (backwards: the chunks in reverse).
  const auto nth = [&](int k, Op op) {
    const int in_group = k % group, c = in_group / pp;
    return Action{op, (k / group) * pp + in_group % pp, op == Op::Fwd ? c : v - 1 - c};
  };
  const int warm = std::min(total, (v - 1) * pp + 2 * (pp - stage - 1));
  std::vector<Action> s;
  int f = 0, b = 0;
  for (; f < warm; ++f) s.push_back(nth(f, Op::Fwd));
  for (; f < total; ++f, ++b) {
    s.push_back(nth(f, Op::Fwd));
    s.push_back(nth(b, Op::Bwd));
  }
  for (; b < total; ++b) s.push_back(nth(b, Op::Bwd));
  return s;
}

std::vector<Action> schedule_zb_h1(int pp, int stage, int m) {
  check_args(pp, stage, m);
  std::vector<Action> s;
  const int warm = std::min(pp - stage - 1, m);
  int pending_from = 0;  // the oldest micro-batch whose W has not run
  const auto backward = [&](int b) {
    s.push_back({Op::BwdInput, b});
    for (; b + 1 - pending_from > stage; ++pending_from) s.push_back({Op::BwdWeight, pending_from});
  };
  int f = 0, b = 0;
  for (; f < warm; ++f) s.push_back({Op::Fwd, f});
  for (; f < m; ++f, ++b) {
    s.push_back({Op::Fwd, f});
    backward(b);
  }
  for (; b < m; ++b) backward(b);
  for (; pending_from < m; ++pending_from) s.push_back({Op::BwdWeight, pending_from});
  return s;
}

int global_chunk(int pp, int stage, int chunk, ChunkPlacement placement) {
  return chunk * pp + (placement == ChunkPlacement::V && chunk % 2 == 1 ? pp - 1 - stage : stage);
}

int chunk_rank(int pp, int g, ChunkPlacement placement) {
  const int r = g % pp;
  return placement == ChunkPlacement::V && (g / pp) % 2 == 1 ? pp - 1 - r : r;
}

std::vector<Action> schedule_zb_v(int pp, int stage, int m) {
  check_args(pp, stage, m);
  WIOLA_CHECK(m >= pp, "zb-v schedule: needs m >= pp micro-batches (m=", m, " pp=", pp,
              "): the last rank's warm-up runs pp of them through both its chunks");
  std::vector<Action> s;
  int f[2] = {0, 0}, b[2] = {0, 0};
  std::vector<Action> deferred;  // W's not yet run, oldest first
  size_t oldest = 0;
  const auto fwd = [&](int c) { s.push_back({Op::Fwd, f[c]++, c}); };
  const auto bwd = [&](int c, bool defer) {
    const int i = b[c]++;
    s.push_back({Op::BwdInput, i, c});
    if (defer) deferred.push_back({Op::BwdWeight, i, c});
    else s.push_back({Op::BwdWeight, i, c});
  };
  const auto weight = [&] { s.push_back(deferred.at(oldest++)); };
  // Chunk-0 forwards before the first chunk-1 one: 2q, or what m leaves.
  const int w0 = std::min(2 * (pp - stage - 1), m - stage - 1);
  const int q1 = (w0 + 1) / 2, q2 = w0 - q1;
  for (int k = 0; k < w0; ++k) fwd(0);  // warm-up
  for (int k = 0; k <= stage; ++k) {
    fwd(0);
    fwd(1);
  }
  for (int k = 0; k < q1; ++k) {
    bwd(1, false);
    fwd(1);
  }
  for (int k = 0; k < m - w0 - stage - 1; ++k) {  // steady state
    bwd(1, false);
    fwd(0);
    bwd(0, false);
    fwd(1);
  }
  for (int k = 0; k < q2; ++k) {  // cool-down
    bwd(1, false);
    bwd(0, false);
    fwd(1);
  }
  for (int k = 0; k <= stage; ++k) {
    bwd(1, false);
    bwd(0, true);
  }
  for (int k = 0; k < q1; ++k) {
    weight();
    bwd(0, true);
  }
  while (oldest < deferred.size()) weight();
  return s;
}

double bubble_fraction_predicted(int pp, int m) {
  return double(pp - 1) / double(m + pp - 1);
}

double bubble_fraction_interleaved(int pp, int m, int v) {
  const double fill = double(pp - 1) / double(v);
  return fill / (double(m) + fill);
}

std::vector<Action> chunk_actions(const std::vector<Action>& s, int chunk) {
  std::vector<Action> out;
  for (const Action& a : s)
    if (a.chunk == chunk) out.push_back(a);
  return out;
}

int max_in_flight(const std::vector<Action>& s) {
  int cur = 0, peak = 0;
  for (const Action& a : s) {
    cur += a.op == Op::Fwd ? 1 : a.op == Op::BwdInput ? 0 : -1;
    peak = std::max(peak, cur);
  }
  return peak;
}

int max_pending_weight(const std::vector<Action>& s) {
  int cur = 0, peak = 0;
  for (const Action& a : s) {
    cur += a.op == Op::BwdInput ? 1 : a.op == Op::BwdWeight ? -1 : 0;
    peak = std::max(peak, cur);
  }
  return peak;
}

namespace {
// v: one more than the largest chunk index of any action.
int chunks_per_rank(const std::vector<std::vector<Action>>& sched) {
  int v = 1;
  for (const auto& s : sched)
    for (const Action& a : s) {
      WIOLA_CHECK(a.chunk >= 0 && a.micro >= 0, "pipeline schedule: negative chunk or micro-batch in ", to_string(a));
      v = std::max(v, a.chunk + 1);
    }
  return v;
}
}  // namespace

PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& sched, double t_fwd, double t_bwd) {
  return simulate_pipeline(sched, t_fwd, t_bwd, 0.0);
}

PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& sched, double t_fwd, double t_bwd_input,
                              double t_bwd_weight, ChunkPlacement placement) {
  const size_t n = sched.size() * size_t(chunks_per_rank(sched));
  return simulate_pipeline(sched,
                           StageCosts{std::vector<double>(n, t_fwd), std::vector<double>(n, t_bwd_input + t_bwd_weight),
                                      0.0, std::vector<double>(n, t_bwd_weight)},
                           placement);
}

namespace {
// The event simulation itself: makespan, bubble fraction, start and end
// times, peak live activations.
PipelineSim simulate(const std::vector<std::vector<Action>>& sched, const StageCosts& cost, ChunkPlacement placement) {
  const int pp = int(sched.size()), v = chunks_per_rank(sched), P = pp * v;
  int m = 0;
  for (const auto& s : sched)
    for (const Action& a : s) m = std::max(m, a.micro + 1);
  // Finish times per global chunk and micro-batch, < 0 while not run: the
  // forward and the input gradient (Bwd or BwdInput).
  const auto table = [&] { return std::vector<std::vector<double>>(size_t(P), std::vector<double>(size_t(m), -1)); };
  auto fdone = table(), gdone = table();
  // Which kinds ran per (chunk, micro): bit 1 F, 2 Bwd, 4 B, 8 W.
  std::vector<std::vector<int>> ran(size_t(P), std::vector<int>(size_t(m), 0));
  std::vector<size_t> next(size_t(pp), 0);
  std::vector<double> free_at(size_t(pp), 0);
  std::vector<int> live(size_t(pp), 0);
  PipelineSim r;
  r.start.resize(size_t(pp));
  r.end.resize(size_t(pp));
  r.peak_live.assign(size_t(pp), 0);
  double busy = 0;
  const auto weight = [&](int g) { return cost.bwd_weight.empty() ? 0.0 : cost.bwd_weight[size_t(g)]; };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      while (next[size_t(s)] < sched[size_t(s)].size()) {
        const Action a = sched[size_t(s)][next[size_t(s)]];
        const int g = global_chunk(pp, s, a.chunk, placement);
        // A message's delay: none between two chunks of this rank.
        const auto link = [&](int from) { return chunk_rank(pp, from, placement) != s ? cost.link : 0.0; };
        const size_t gi = size_t(g), i = size_t(a.micro);
        double ready = free_at[size_t(s)], dur = 0;
        int bit = 0;
        bool blocked = false;  // an input not there yet
        switch (a.op) {
          case Op::Fwd:
            if (g > 0) {
              blocked = fdone[gi - 1][i] < 0;
              ready = std::max(ready, fdone[gi - 1][i] + link(g - 1));
            }
            dur = cost.fwd[gi];
            bit = 1;
            break;
          case Op::Bwd:
          case Op::BwdInput:
            blocked = fdone[gi][i] < 0;
            if (g + 1 < P) {
              blocked = blocked || gdone[gi + 1][i] < 0;
              ready = std::max(ready, gdone[gi + 1][i] + link(g + 1));
            }
            dur = a.op == Op::Bwd ? cost.bwd[gi] : cost.bwd[gi] - weight(g);
            bit = a.op == Op::Bwd ? 2 : 4;
            break;
          case Op::BwdWeight:
            blocked = gdone[gi][i] < 0 || (ran[gi][i] & 4) == 0;
            dur = weight(g);
            bit = 8;
            break;
        }
        if (blocked) break;
        WIOLA_CHECK((ran[gi][i] & bit) == 0 && !(bit == 2 && (ran[gi][i] & 12)) && !(bit > 2 && (ran[gi][i] & 2)),
                    "pipeline schedule: stage ", s, " runs ", to_string(a),
                    " twice, or a backward both whole (B) and split (I, W)");
        ran[gi][i] |= bit;
        r.start[size_t(s)].push_back(ready);
        free_at[size_t(s)] = ready + dur;
        r.end[size_t(s)].push_back(free_at[size_t(s)]);
        if (a.op == Op::Fwd) fdone[gi][i] = free_at[size_t(s)];
        if (a.op == Op::Bwd || a.op == Op::BwdInput) gdone[gi][i] = free_at[size_t(s)];
        live[size_t(s)] += a.op == Op::Fwd ? 1 : a.op == Op::BwdInput ? 0 : -1;
        r.peak_live[size_t(s)] = std::max(r.peak_live[size_t(s)], live[size_t(s)]);
        busy += dur;
        r.makespan = std::max(r.makespan, free_at[size_t(s)]);
        ++next[size_t(s)];
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int s = 0; s < pp; ++s)
    if (next[size_t(s)] < sched[size_t(s)].size())
      stuck << " stage " << s << " waits at " << to_string(sched[size_t(s)][next[size_t(s)]]) << ";";
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
  return StageCosts{mean(cost.fwd), mean(cost.bwd), cost.link, mean(cost.bwd_weight)};
}

bool uniform(const std::vector<double>& v) { return v.empty() || std::equal(v.begin() + 1, v.end(), v.begin()); }
}  // namespace

PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& sched, const StageCosts& cost,
                              ChunkPlacement placement) {
  const size_t n = sched.size() * size_t(chunks_per_rank(sched));
  WIOLA_CHECK(cost.fwd.size() == n && cost.bwd.size() == n && (cost.bwd_weight.empty() || cost.bwd_weight.size() == n),
              "simulate_pipeline: one forward and one backward cost (and weight-gradient share, if any) per global "
              "chunk (", n, ")");
  for (size_t g = 0; g < cost.bwd_weight.size(); ++g)
    WIOLA_CHECK(cost.bwd_weight[g] >= 0 && cost.bwd_weight[g] <= cost.bwd[g],
                "simulate_pipeline: the weight-gradient share of a backward must lie in [0, the backward]");
  PipelineSim r = simulate(sched, cost, placement);
  const bool balanced = uniform(cost.fwd) && uniform(cost.bwd) && uniform(cost.bwd_weight);
  r.bubble_fill_drain =
      balanced ? r.bubble_fraction : simulate(sched, mean_costs(cost), placement).bubble_fraction;
  r.bubble_imbalance = r.bubble_fraction - r.bubble_fill_drain;
  return r;
}

std::string to_string(const Action& a) {
  static const char kind[] = {'F', 'B', 'I', 'W'};
  std::string out(1, kind[int(a.op)]);
  out += std::to_string(a.micro);
  if (a.chunk != 0) {
    out += '.';
    out += std::to_string(a.chunk);
  }
  return out;
}

std::string to_string(const std::vector<Action>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ' ';
    out += to_string(s[i]);
  }
  return out;
}

}  // namespace wiola::dist
