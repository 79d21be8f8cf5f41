// TensorBoard event files (train.tensorboard; docs/performance.md): the
// scalars of every metrics.jsonl record, written by world rank 0 into
// RUN_DIR/tensorboard/events.out.tfevents.<seconds>.<host>.<pid>.
//
// The format is TensorFlow's, encoded here by hand (no Debian package has a
// C++ writer, and the few protobuf fields do not justify protoc and
// libprotobuf): TFRecord frames (uint64 length, masked CRC32C of the length,
// the data, masked CRC32C of the data) of `Event` messages: wall_time
// (double, field 1), step (int64, 2), file_version ("brain.Event:2", 3, the
// first record), session_log (7) = SessionLog { status = 1 } (START: the
// second record, and after a loss-spike rewind) or summary (5) = Summary { repeated Value value = 1 },
// Value { string tag = 1; float simple_value = 2 }.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"

namespace wiola {

// CRC-32C (Castagnoli, reflected 0x82F63B78), continuing from `crc`.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked form: rotate right by 15, add 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

using Scalars = std::vector<std::pair<std::string, double>>;

// The scalars of one metrics.jsonl record under their TensorBoard tags:
// loss, lr, grad_norm, tokens, skipped -> train/...; tokens_per_s, step_ms,
// checkpoint_ms, mfu -> perf/...; time_ms.<part> -> time_ms/<part>;
// atm_mu, atm_saved_attention_gflop -> atm/mu, atm/saved_attention_gflop;
// peak_mem_mib -> memory/peak_mib; val_loss -> val/loss; val_loss_sources[k]
// -> val/<k+1>-<source_names[k]>/loss. Any other number (a field added
// later) -> metrics/<key>[/<sub>]; null -> NaN. "step" is the event's step.
Scalars tensorboard_scalars(const nlohmann::json& record, const std::vector<std::string>& source_names);

// A short tag-safe name of a data source path: its folder or file name
// ("runs/web/manifest.json" -> "web"), characters outside [A-Za-z0-9._-]
// replaced by '_'.
std::string tensorboard_source_name(const std::string& path);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it, which starts with a session
  // START at `first_step`: TensorBoard reads a folder's files in name order
  // and, at a START, drops what earlier files hold from that step on. So a
  // resumed run (a new file) hides the steps the old file has past the
  // checkpoint, and a fresh run in the same folder hides the old run, as
  // metrics.jsonl is cut back or started anew. `blend`: data.blend, which
  // names the val/ sources.
  TensorBoardWriter(const std::filesystem::path& dir, const std::vector<BlendSource>& blend, int64_t first_step);
  // A session START at `first_step` in this file: TensorBoard drops the
  // events before it (this file's and earlier files') from that step on. A
  // loss-spike rewind to checkpoint c calls it with c + 1, as metrics.jsonl
  // is cut back to step c, so the steps trained again replace the rewound
  // ones instead of showing as a second curve.
  void restart(int64_t first_step);
  // One Event with every scalar at `step`, flushed (a crash keeps it).
  void add(int64_t step, const Scalars& scalars);
  // The scalars of a metrics.jsonl record (tensorboard_scalars).
  void add_metrics(int64_t step, const nlohmann::json& record) { add(step, tensorboard_scalars(record, sources_)); }
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::filesystem::path path_;
  std::vector<std::string> sources_;  // tensorboard_source_name of each blend source
  std::ofstream out_;
  bool failed_ = false;  // a write failed (warned once; nothing more is written)
};

}  // namespace wiola
