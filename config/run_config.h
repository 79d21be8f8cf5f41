// A training run's configuration: the TOML file of `wiola train --config`
// with sections [model] [train] [data] [parallel] [checkpoint], plus
// `--set section.key=value` overrides. A key's default is its field's
// initializer below; its name and doc line are its schema line in
// run_config.cpp; docs/config.md's key tables are generated from the two
// (run_config_schema). Unknown sections or keys, wrong types and inconsistent
// values are errors naming the file and key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/loader.h"
#include "kernels/backend_options.h"
#include "model/config.h"
#include "perf/cost_model.h"

namespace wiola {

// Steps [from, to] (inclusive) whose global batches are read and dropped:
// no forward, backward or update (train.skip_batches, docs/config.md).
struct StepWindow {
  int64_t from = 0, to = 0;
  bool operator==(const StepWindow&) const = default;
};

struct TrainSection {
  int micro_batch = 8;        // sequences per rank per micro-step
  int grad_accum = 1;         // micro-batches per optimizer step
  int64_t steps = 0;          // T_max; 0 = from `tokens`, or Chinchilla 20 N
  int64_t tokens = 0;         // token budget (0 = Chinchilla: 20 x params)
  double lr_max = 3e-4;
  double lr_min = 0.0;
  int64_t warmup = -1;        // -1 = floor((T_max + 10) / 20) (docs/model.md §4)
  double beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  double weight_decay = 0.1;
  double clip = 1.0;          // <= 0: no clipping
  bool nonfinite_fatal = false;  // non-finite grad norm: stop instead of skip
  uint64_t seed = 1234;       // parameter init (and data order unless data.seed)
  bool recompute = false;     // per-layer activation recompute
  int threads = 0;            // OpenMP threads; 0 = runtime default
  std::string backend = "cpu";  // op backend: "cpu", or "cpu-opaque" (debug: host cannot touch its memory)
  BackendOptions backend_options;  // cuda_attention(_bwd, _tile), cuda_gemm (kernels/backend_options.h)
  int log_every = 1;          // print a progress line every N steps
  int eval_every = 0;         // validation loss every N steps (0 = off)
  int eval_batches = 4;       // global batches per validation
  std::string run_dir = "runs/default";  // metrics.jsonl etc.
  int64_t max_steps = 0;      // stop after this many steps of T_max (0 = all)
  bool accounting = true;     // per-step time breakdown (docs/performance.md)
  double peak_tflops = 0;     // MFU denominator per rank; 0 = measured sgemm (CPU) / datasheet (GPU)
  bool tensorboard = false;   // TensorBoard event files in RUN_DIR/tensorboard (train/tensorboard.h)
  double straggler_share = 0.2;  // warn about a rank this much slower than its peers' median (0 = off)
  // Loss-spike policy (docs/checkpoints.md "Loss spikes"): a loss above
  // mean + spike_sigma x std of the last spike_window steps' losses, or
  // spike_skipped consecutive skipped (non-finite) steps, rewinds to the
  // newest checkpoint and skips the data since it. 0 = that rule off.
  double spike_sigma = 0;
  int spike_window = 50;
  int spike_skipped = 0;
  int spike_max_rewinds = 3;
  std::vector<StepWindow> skip_batches;  // data windows to skip (sorted, disjoint)
};

struct DataSection {
  std::string path;           // manifest.json, directory holding it, or one .h5 shard
  std::vector<BlendSource> blend;  // instead of path: several sources and their shares of the samples
  bool shuffle = true;
  int64_t seed = -1;          // data order seed; -1 = train.seed
  int prefetch = 2;           // batches prepared ahead by the loader thread
  int max_open_shards = 64;   // shards kept open per source (0 = all); samples do not depend on it
};

struct ParallelSection {
  int tp = 1, pp = 1, dp = 1;
  bool zero = true;                  // shard AdamW state over DP (ZeRO-1)
  std::string schedule = "1f1b";     // "1f1b", "gpipe", "zb-h1", "interleaved" or "zb-v"
  int virtual_stages = 2;            // model chunks per rank of "interleaved"
  std::vector<int> layer_cuts;       // the chunks' layer boundaries (pp·v + 1); empty: stage_balance
  bool overlap = true;               // start DP gradient reduction during the last backward
  std::string stage_balance = "compute";  // "compute" (FLOPs, head included) or "layers"
  std::string data_plane = "auto";   // "auto", "nccl" or "staged" (docs/gpu.md)
  double comm_timeout_s = 300;       // a collective waiting longer aborts the job (docs/distributed.md)
};

struct CheckpointSection {
  std::string dir;            // empty: no checkpoints
  int every = 0;              // steps between checkpoints (0 = end only)
  double minutes = 0;         // also at most this many minutes apart (0 = off)
  bool resume = true;         // resume from the newest sound checkpoint in dir
  int keep = 2;               // newest checkpoints kept
  int keep_every = 0;         // also keep for good those whose step is a multiple (0 = none)
  bool async = true;          // write in a background thread
  double max_failed_minutes = 60;  // stop when saves keep failing this long (0: at the first failure)
  std::string init_from;      // weights-only start (fine-tuning) from this checkpoint
};

struct RunConfig {
  std::string source;         // file the config came from (for messages)
  std::string preset;         // model.preset ("" = custom)
  ModelConfig model;
  TrainSection train;
  DataSection data;
  ParallelSection parallel;
  CheckpointSection checkpoint;

  // data.path as a blend of one, or data.blend.
  std::vector<BlendSource> data_sources() const {
    return data.blend.empty() ? std::vector<BlendSource>{{data.path, 1.0}} : data.blend;
  }
  int global_batch() const {
    return train.micro_batch * train.grad_accum * parallel.dp;
  }
  // The layout the cost model and planner speak of (perf/cost_model.h).
  perf::Layout layout() const {
    perf::Layout l;
    l.tp = parallel.tp; l.pp = parallel.pp; l.dp = parallel.dp;
    l.micro_batch = train.micro_batch; l.micro_batches = train.grad_accum;
    l.zero = parallel.zero; l.recompute = train.recompute;
    l.schedule = parallel.schedule; l.stage_balance = parallel.stage_balance;
    l.virtual_stages = parallel.schedule == "interleaved" ? parallel.virtual_stages : 1;
    l.cuts = parallel.layer_cuts;
    return l;
  }
};

// Parse `path` (TOML) and apply `overrides` ("section.key=value", value in
// TOML syntax or a bare string), then validate (model included). `path` may
// be empty: defaults plus overrides. Throws wiola::Error naming the file,
// section.key and the problem.
RunConfig load_run_config(const std::string& path,
                          const std::vector<std::string>& overrides);

// The same from TOML text already in memory (the effective config a
// checkpoint manifest records); `source` names it in messages.
RunConfig run_config_from_toml_text(const std::string& text, const std::string& source,
                                    const std::vector<std::string>& overrides = {});

// Check cross-field consistency; throws wiola::Error.
void validate_run_config(const RunConfig& rc);

// The effective configuration as TOML (written into RUN_DIR/config.toml and
// checkpoints, so a run records exactly what it ran with).
std::string run_config_to_toml(const RunConfig& rc);

// One key of the schema as docs/config.md's tables show it.
struct ConfigKeyDoc {
  std::string section, key;
  std::string type;           // as docs/config.md's "Types" table names it: "int", "float", ...
  std::string default_value;  // as run_config_to_toml writes it for a default RunConfig
  std::string doc;            // the meaning (Markdown, one line)
};

// Every key in schema order (the order of the effective config):
// `wiola train --print-config-schema` prints it as JSON, from which
// scripts/config_docs.py writes and checks docs/config.md's key tables.
std::vector<ConfigKeyDoc> run_config_schema();

}  // namespace wiola
