// Pipeline schedules (docs/model.md §5): the ordered list of forward/backward
// micro-batch actions one stage runs in a step. Pure logic, no communication:
// the trainer walks the list, receiving inputs before and sending outputs
// after each action.
#pragma once

#include <string>
#include <vector>

namespace wiola::dist {

enum class Op { Fwd, Bwd };
struct Action {
  Op op;
  int micro;
  bool operator==(const Action&) const = default;
};

// 1F1B (PipeDream-flush): min(pp − stage − 1, m) warm-up forwards, then
// alternate one forward / one backward, then the remaining backwards. At most
// pp − stage micro-batches' activations are alive on a stage.
std::vector<Action> schedule_1f1b(int pp, int stage, int m);
// GPipe: all m forwards, then all m backwards (in forward order). Up to m
// micro-batches' activations alive.
std::vector<Action> schedule_gpipe(int pp, int stage, int m);

// Idle fraction of a balanced pipeline: (p − 1)/(m + p − 1).
double bubble_fraction_predicted(int pp, int m);

// Peak number of micro-batches forwarded but not yet backwarded.
int max_in_flight(const std::vector<Action>& s);

// Event simulation of a whole pipeline: schedules[s] for every stage; Fwd(i)
// on stage s needs Fwd(i) of stage s−1, Bwd(i) needs Bwd(i) of stage s+1 and
// Fwd(i) of stage s. Each action takes t_fwd / t_bwd; sends are free and
// non-blocking. Throws wiola::Error naming the stuck stages on deadlock.
struct PipelineSim {
  double makespan = 0;        // time of the last action's end
  double bubble_fraction = 0; // 1 − busy/(pp·makespan)
  // The bubble split (docs/distributed.md §4): bubble_fill_drain is the
  // bubble fraction of the same schedules with every stage at the mean
  // stage cost (same total work, same link); bubble_imbalance is the rest,
  // bubble_fraction − bubble_fill_drain. Balanced stages: imbalance 0.
  double bubble_fill_drain = 0, bubble_imbalance = 0;
  std::vector<std::vector<double>> start;  // start[s][k]: action k of stage s
};
PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& schedules,
                              double t_fwd, double t_bwd);
// The same with a forward and a backward cost per stage (uneven stages: the
// last one runs the head) and `link` seconds between a message's send and
// its arrival (the cost model's pipeline transfers, perf/). Uneven stages
// are simulated twice: as given, and at the mean costs for the bubble split.
struct StageCosts {
  std::vector<double> fwd, bwd;
  double link = 0;
};
PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& schedules, const StageCosts& cost);

std::string to_string(const std::vector<Action>& s);  // "F0 F1 B0 F2 B1 ..."

}  // namespace wiola::dist
