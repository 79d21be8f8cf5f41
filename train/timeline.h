// The job's timeline (train.trace_steps, docs/performance.md "Timeline"):
// every rank's spans (util/trace.h) of the traced steps, written at the end
// of the run as one Chrome trace, RUN_DIR/trace.json, in the Trace Event
// Format that Perfetto and chrome://tracing load: a process per rank (pid =
// world rank), a thread per host thread, an "X" (complete) event per span
// with ts and dur in microseconds since the job's common origin, and "M"
// (metadata) events naming each process and thread. Each rank writes its
// part (RUN_DIR/trace.rank<R>.part.json); rank 0 merges them.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "util/trace.h"

namespace wiola {

struct RunSettings;

class Timeline {
 public:
  // Collective where tracing is on (a barrier: the ranks' common origin).
  explicit Timeline(const RunSettings& run);
  bool on() const { return !steps_.empty(); }
  bool traced(int64_t t) const;
  // Step t starts: recording on where it is traced (a step left open, by a
  // rewind, is closed first).
  void begin_step(int64_t t);
  // Step t ends (after its checkpoint work and log): its spans kept.
  void end_step();
  // Collective: the parts written and merged into RUN_DIR/trace.json
  // (written under a temporary name and renamed).
  void write();

 private:
  nlohmann::json event_json(const trace::Event& e) const;
  // The spans recorded so far, each with the traced step it began in.
  void keep_events();
  void merge_parts() const;

  const RunSettings& run_;
  std::vector<StepWindow> steps_;
  trace::Clock::time_point origin_;
  int64_t open_ = 0;  // the step being recorded, 0: none
  trace::Clock::time_point step_t0_;
  std::vector<std::pair<int64_t, trace::Clock::time_point>> starts_;  // each traced step's start
  nlohmann::json events_ = nlohmann::json::array();                   // this rank's, of the steps ended
};

}  // namespace wiola
