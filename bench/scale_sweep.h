// `wiola bench scale` (docs/performance.md): a sweep of training runs over
// layouts, micro-batch counts, ZeRO and recompute on/off and model sizes,
// each a real `wiola train` (under mpirun when it has several ranks) whose
// report.json gives the figures. Writes DIR/report.md, DIR/scale.csv and plots
// (throughput per layout with the ideal line, time breakdown, memory per rank
// per class, and, with a measured link, the planner's predicted step beside
// the measured one; by bench/scale_plots.py). A configuration that fails is a row
// saying why. launch/cmd_bench_scale.cpp parses the command line into a
// ScaleSweep.
#pragma once

#include <string>
#include <vector>

namespace wiola::bench {

// A layout name: "single", or "tp2", "pp2", "dp2" joined by 'x' ("tp2xpp2").
struct ScaleGrid {
  int tp = 1, pp = 1, dp = 1;
};
ScaleGrid parse_scale_layout(const std::string& name);

// What to sweep: every combination of the lists (ZeRO off only where dp > 1
// when both are asked for).
struct ScaleSweep {
  std::string out;  // the output directory
  std::vector<std::string> models, layouts;
  std::vector<int> micro_batches;  // per step per DP replica
  std::vector<bool> zero, recompute;
  int global_batch = 8, steps = 8;
  int threads = 0;                // per rank; 0: cores / ranks, at least 1
  std::string data;               // token shards; "": the bundled Brown corpus, prepared once
  std::vector<std::string> sets;  // more `wiola train` overrides
  // Several nodes: runs of more than one rank start through
  // launch/mpirun.sh --hostfile (placement "round-robin": --map-by node);
  // with `link` (wiola plan --calibrate-link's file) each configuration is
  // also predicted (wiola plan --cpu --link --placement) beside its measure.
  std::string hostfile, link, placement = "block";
};

// One configuration of the sweep.
struct ScaleConfig {
  std::string model, layout;
  ScaleGrid g;
  int micro_batch = 0;  // 0: the global batch is not a multiple of dp x micro-batches
  int micro_batches = 0, threads = 1;
  bool zero = true, recompute = false;
  std::string name() const;
  int ranks() const { return g.tp * g.pp * g.dp; }
};
std::vector<ScaleConfig> scale_configs(const ScaleSweep& s, int cores);

// Runs the sweep with the `wiola` binary at `wiola` (its prep too, for the
// default data), printing each run's result and the ETA; `source_dir` holds
// the bundled corpus and bench/scale_plots.py.
void run_scale_sweep(const ScaleSweep& s, const std::string& wiola, const std::string& source_dir);

}  // namespace wiola::bench
