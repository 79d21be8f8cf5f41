// The timeline of what this process does (train.trace_steps,
// docs/performance.md "Timeline"): named spans of the host threads, recorded
// while the trainer has recording on (the traced steps) and written by
// train/timeline.h as one Chrome trace for the job. Every layer can open a
// span (the schedule's actions, messages, reductions, the optimizer,
// checkpoint writes); a GPU backend adds range hooks (NVTX), called for
// every span, recording or not, so Nsight Systems shows the same names.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace wiola::trace {

using Clock = std::chrono::steady_clock;

// One complete span of a thread: [begin, end), its category and name, and
// its arguments as the text of a JSON object ("" for none).
struct Event {
  std::string name;
  const char* cat = "";
  Clock::time_point begin, end;
  int tid = 0;
  std::string args;
};

// Spans are recorded while this is on (off at start).
void set_recording(bool on);
bool recording();

// Range hooks, called around every span on its thread (NVTX: push and pop).
struct RangeHooks {
  void (*push)(const char* name) = nullptr;
  void (*pop)() = nullptr;
};
void set_range_hooks(RangeHooks h);
// Whether a span would be kept or shown (recording, or range hooks set):
// callers skip building names otherwise.
bool wanted();
// A range around a span measured elsewhere (record below).
void push_range(const char* name);
void pop_range();

// This thread's track: a small number, given in the order threads first
// ask, and its name (the first thread to ask is named "main" unless named).
int thread_id();
void name_thread(const std::string& name);
std::vector<std::pair<int, std::string>> thread_names();

// A span that has been measured elsewhere (the step accounting's phases):
// recorded when recording is on.
void record(const char* cat, std::string name, Clock::time_point begin, Clock::time_point end, std::string args = {});
// The events recorded so far, and none left.
std::vector<Event> take();

// A span from construction to end() or destruction; an empty name: none.
class Span {
 public:
  Span(const char* cat, std::string name, std::string args = {});
  ~Span() { end(); }
  void end();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* cat_;
  std::string name_, args_;
  Clock::time_point t0_;
  bool open_ = false, rec_ = false, range_ = false;
};

}  // namespace wiola::trace
