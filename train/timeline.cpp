#include "train/timeline.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "train/run_settings.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola {

namespace fs = std::filesystem;

namespace {
fs::path part_path(const fs::path& dir, int rank) { return dir / ("trace.rank" + std::to_string(rank) + ".part.json"); }
}  // namespace

Timeline::Timeline(const RunSettings& run) : run_(run), steps_(run.rc.train.trace_steps) {
  if (!on()) return;
  trace::name_thread("main");
  if (run.world.size() > 1) run.world.barrier();  // the ranks leave it together: the common origin
  origin_ = trace::Clock::now();
}

bool Timeline::traced(int64_t t) const {
  for (const StepWindow& w : steps_)
    if (t >= w.from && t <= w.to) return true;
  return false;
}

void Timeline::begin_step(int64_t t) {
  if (!on()) return;
  if (open_) end_step();
  if (!traced(t)) return;
  open_ = t;
  step_t0_ = trace::Clock::now();
  starts_.emplace_back(t, step_t0_);
  trace::set_recording(true);
}

void Timeline::end_step() {
  if (!open_) return;
  trace::record("step", "step " + std::to_string(open_), step_t0_, trace::Clock::now());
  trace::set_recording(false);
  keep_events();
  open_ = 0;
}

// A span may end after its step (a background checkpoint write): it
// belongs to the step it began in.
void Timeline::keep_events() {
  for (const trace::Event& e : trace::take()) events_.push_back(event_json(e));
}

nlohmann::json Timeline::event_json(const trace::Event& e) const {
  int64_t step = starts_.empty() ? 0 : starts_.front().first;
  for (const auto& [t, t0] : starts_)
    if (t0 <= e.begin) step = t;
  const auto us = [this](trace::Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - origin_).count();
  };
  nlohmann::json args = e.args.empty() ? nlohmann::json::object() : nlohmann::json::parse(e.args);
  args["step"] = step;
  return {{"name", e.name},
          {"cat", e.cat},
          {"ph", "X"},
          {"ts", us(e.begin)},
          {"dur", std::max(0.0, us(e.end) - us(e.begin))},
          {"pid", run_.world.rank()},
          {"tid", e.tid},
          {"args", std::move(args)}};
}

void Timeline::write() {
  if (!on()) return;
  end_step();
  keep_events();  // what ended after the last traced step
  const fs::path dir = run_.rc.train.run_dir;
  std::set<int> tids;
  for (const auto& e : events_) tids.insert(e.at("tid").get<int>());
  nlohmann::json threads = nlohmann::json::object();
  for (const auto& [tid, name] : trace::thread_names())
    if (tids.count(tid)) threads[std::to_string(tid)] = name;
  const dist::GridCoord& me = run_.me;
  const nlohmann::json part = {{"rank", run_.world.rank()},
                               {"coord", {me.tp, me.pp, me.dp}},
                               {"threads", std::move(threads)},
                               {"events", std::move(events_)}};
  events_ = nlohmann::json::array();
  fs::create_directories(dir);
  write_text_atomic(part_path(dir, run_.world.rank()).string(), part.dump());
  if (run_.world.size() > 1) run_.world.barrier();  // every part written
  if (run_.root()) merge_parts();
}

// Rank 0: the parts as one trace, each rank's process and threads named
// ("M" events), then every rank's spans; the parts removed.
void Timeline::merge_parts() const {
  const fs::path dir = run_.rc.train.run_dir;
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < run_.world.size(); ++r) {
    std::ifstream in(part_path(dir, r));
    WIOLA_CHECK(in.good(), "timeline: cannot read '", part_path(dir, r).string(), "'");
    nlohmann::json part = nlohmann::json::parse(in);
    const auto& c = part.at("coord");
    const std::string name = "rank " + std::to_string(r) + " (tp " + std::to_string(c[0].get<int>()) + ", pp " +
                             std::to_string(c[1].get<int>()) + ", dp " + std::to_string(c[2].get<int>()) + ")";
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0}, {"args", {{"name", name}}}});
    events.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", r}, {"tid", 0}, {"args", {{"sort_index", r}}}});
    for (const auto& [tid, tname] : part.at("threads").items())
      events.push_back(
          {{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", std::stoi(tid)}, {"args", {{"name", tname}}}});
    for (auto& e : part.at("events")) events.push_back(std::move(e));
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const StepWindow& w : steps_) steps.push_back({w.from, w.to});
  const nlohmann::json trace = {
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"producer", "wiola train"}, {"trace_steps", std::move(steps)}, {"ranks", run_.world.size()}}}};
  write_text_atomic((dir / "trace.json").string(), trace.dump());
  for (int r = 0; r < run_.world.size(); ++r) fs::remove(part_path(dir, r));
}

}  // namespace wiola
