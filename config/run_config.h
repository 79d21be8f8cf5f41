// A training run's configuration: the TOML file of `wiola train --config`
// with sections [model] [train] [data] [parallel] [checkpoint], plus
// `--set section.key=value` overrides. Each key is declared once, with its
// type, default and doc line, in config/run_config_keys.h; the fields below,
// the schema, the checks and docs/config.md's key tables
// (run_config_schema) are made from that list. Unknown sections or keys,
// wrong types, values outside an enum key's names and inconsistent values are
// errors naming the file and key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/run_config_keys.h"
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

// The sections' fields, one per key of config/run_config_keys.h, with its
// default.
#define WIOLA_RUN_CONFIG_FIELD(type, key, default_value, range, doc) type key = default_value;
#define WIOLA_RUN_CONFIG_OPTIONS(member) BackendOptions member;

struct TrainSection {
  WIOLA_TRAIN_KEYS(WIOLA_RUN_CONFIG_FIELD, WIOLA_RUN_CONFIG_OPTIONS)
};

struct DataSection {
  WIOLA_DATA_KEYS(WIOLA_RUN_CONFIG_FIELD)
};

struct ParallelSection {
  WIOLA_PARALLEL_KEYS(WIOLA_RUN_CONFIG_FIELD)
};

struct CheckpointSection {
  WIOLA_CHECKPOINT_KEYS(WIOLA_RUN_CONFIG_FIELD)
};

#undef WIOLA_RUN_CONFIG_OPTIONS
#undef WIOLA_RUN_CONFIG_FIELD

struct RunConfig {
  std::string source;  // file the config came from (for messages)
  std::string preset;  // model.preset ("" = custom)
  ModelConfig model;
  TrainSection train;
  DataSection data;
  ParallelSection parallel;
  CheckpointSection checkpoint;

  // data.path as a blend of one, or data.blend.
  std::vector<BlendSource> data_sources() const {
    return data.blend.empty() ? std::vector<BlendSource>{{data.path, 1.0}} : data.blend;
  }
  int global_batch() const { return train.micro_batch * train.grad_accum * parallel.dp; }
  // The layout the cost model and planner speak of (perf/cost_model.h).
  perf::Layout layout() const {
    perf::Layout l;
    l.tp = parallel.tp;
    l.pp = parallel.pp;
    l.dp = parallel.dp;
    l.micro_batch = train.micro_batch;
    l.micro_batches = train.grad_accum;
    l.zero = parallel.zero;
    l.recompute = train.recompute;
    l.schedule = parallel.schedule;
    l.stage_balance = parallel.stage_balance;
    l.virtual_stages = parallel.schedule == dist::Schedule::Interleaved ? parallel.virtual_stages : 1;
    l.cuts = parallel.layer_cuts;
    return l;
  }
};

// Parse `path` (TOML) and apply `overrides` ("section.key=value", value in
// TOML syntax or a bare string), then validate (model included). `path` may
// be empty: defaults plus overrides. Throws wiola::Error naming the file,
// section.key and the problem.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides);

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
  std::string type;                 // as docs/config.md's "Types" table names it: "int", "float", ...
  std::string default_value;        // as run_config_to_toml writes it for a default RunConfig
  std::vector<std::string> values;  // the values an enum key takes (empty: any of its type)
  std::string doc;                  // the meaning (Markdown, one line)
};

// Every key in schema order (the order of the effective config):
// `wiola train --print-config-schema` prints it as JSON, from which
// scripts/config_docs.py writes and checks docs/config.md's key tables.
std::vector<ConfigKeyDoc> run_config_schema();

}  // namespace wiola
