#include "util/trace.h"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

namespace wiola::trace {
namespace {

std::atomic<bool> g_recording{false};
std::atomic<void (*)(const char*)> g_push{nullptr};
std::atomic<void (*)()> g_pop{nullptr};
std::mutex g_mu;  // the events and the thread names
std::vector<Event> g_events;
std::map<int, std::string> g_names;
std::atomic<int> g_next_tid{0};

}  // namespace

void set_recording(bool on) { g_recording.store(on, std::memory_order_relaxed); }
bool recording() { return g_recording.load(std::memory_order_relaxed); }

void set_range_hooks(RangeHooks h) {
  g_push.store(h.push);
  g_pop.store(h.pop);
}

bool wanted() { return recording() || g_push.load(std::memory_order_relaxed) != nullptr; }

void push_range(const char* name) {
  if (void (*push)(const char*) = g_push.load(std::memory_order_relaxed)) push(name);
}
void pop_range() {
  if (void (*pop)() = g_pop.load(std::memory_order_relaxed)) pop();
}

int thread_id() {
  thread_local const int id = [] {
    const int i = g_next_tid.fetch_add(1);
    if (i == 0) {
      std::lock_guard<std::mutex> lock(g_mu);
      g_names.emplace(0, "main");
    }
    return i;
  }();
  return id;
}

void name_thread(const std::string& name) {
  const int id = thread_id();
  std::lock_guard<std::mutex> lock(g_mu);
  g_names[id] = name;
}

std::vector<std::pair<int, std::string>> thread_names() {
  std::lock_guard<std::mutex> lock(g_mu);
  return {g_names.begin(), g_names.end()};
}

void record(const char* cat, std::string name, Clock::time_point begin, Clock::time_point end, std::string args) {
  if (!recording()) return;
  Event e{std::move(name), cat, begin, end, thread_id(), std::move(args)};
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.push_back(std::move(e));
}

std::vector<Event> take() {
  std::lock_guard<std::mutex> lock(g_mu);
  return std::exchange(g_events, {});
}

Span::Span(const char* cat, std::string name, std::string args) : cat_(cat) {
  if (name.empty()) return;  // no span
  rec_ = recording();
  void (*push)(const char*) = g_push.load(std::memory_order_relaxed);
  range_ = push != nullptr;
  if (!rec_ && !range_) return;
  open_ = true;
  name_ = std::move(name);
  args_ = std::move(args);
  if (range_) push(name_.c_str());
  t0_ = Clock::now();
}

void Span::end() {
  if (!open_) return;
  open_ = false;
  const Clock::time_point t1 = Clock::now();
  if (range_)
    if (void (*pop)() = g_pop.load(std::memory_order_relaxed)) pop();
  if (rec_) {  // the span counts where it began recording
    Event e{std::move(name_), cat_, t0_, t1, thread_id(), std::move(args_)};
    std::lock_guard<std::mutex> lock(g_mu);
    g_events.push_back(std::move(e));
  }
}

}  // namespace wiola::trace
