// The CUDA emulator's streams, events and CUDA Graphs (the runtime's
// launches and device memory: emu.cpp). Streams are queues of held work
// (emu.h Held) and of waits on events.
#include "tools/cuda_emu/emu.h"
#include "tools/cuda_emu/emu_internal.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using wiola_emu::raise;

// ---- streams and events -----------------------------------------------------------------------
// A stream is a queue of held work (Held, from nccl_emu.cpp) and of waits on
// other streams' events; everything else runs when it is issued. An event is
// a point in its stream's queue: reached once the work before it completes.
namespace wiola_emu {
namespace {

using Clock = std::chrono::steady_clock;
struct EmuStream;
// "stream s has completed its first n items"; a null stream has none.
struct Point {
  EmuStream* s = nullptr;
  uint64_t n = 0;
};
struct Item {
  std::unique_ptr<Held> work;  // or, without work, a wait for `after`
  Point after;
};
// A graph: the work a capture recorded, in issue order (one stream: a
// chain, as CUDA makes of a single stream's capture).
struct EmuGraph {
  struct Node {
    const char* what;
    std::function<void()> run;
  };
  std::vector<Node> nodes;
};
struct EmuStream {
  bool blocking = true;  // legacy-stream copies wait for it (not cudaStreamNonBlocking)
  // While it captures (cudaStreamBeginCapture): the graph being recorded, its
  // mode, and the first call that invalidated the capture ("" if none).
  std::unique_ptr<EmuGraph> capture;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::string invalidated_by;
  std::deque<Item> items;                  // issued, not yet completed
  std::atomic<uint64_t> done{0};           // read by other threads (cudaEventQuery)
  std::vector<Clock::time_point> done_at;  // item k completed at done_at[k]
};
struct EmuEvent {
  Point at;
  Clock::time_point recorded_at{};
  bool recorded = false;
  bool captured = false;  // last recorded on a capturing stream
};

std::vector<EmuStream*>& streams() {
  static std::vector<EmuStream*> v;
  return v;
}
// The thread that issues work; only it completes held work (the NCCL
// communicator's watchdog asks cudaEventQuery from another thread).
std::atomic<bool> g_have_owner{false};
std::thread::id g_owner;
bool is_owner() { return !g_have_owner || std::this_thread::get_id() == g_owner; }

bool reached(const Point& p) { return !p.s || p.s->done.load() >= p.n; }

// Completes the items of p's stream up to p (block: waiting for them);
// true once p is reached.
bool advance(const Point& p, bool block) {
  while (!reached(p)) {
    EmuStream& s = *p.s;
    Item& it = s.items.front();
    if (it.work ? !it.work->progress(block) : !advance(it.after, block)) return false;
    s.items.pop_front();
    s.done_at.push_back(Clock::now());
    s.done.fetch_add(1);
  }
  return true;
}

Point end_of(cudaStream_t s) {
  auto* st = reinterpret_cast<EmuStream*>(s);
  return st ? Point{st, st->done.load() + st->items.size()} : Point{};
}

// When the event's point was reached (its record time if nothing was held).
Clock::time_point reached_at(const EmuEvent& e) {
  if (!e.at.s || e.at.n == 0) return e.recorded_at;
  return std::max(e.recorded_at, e.at.s->done_at[e.at.n - 1]);
}

}  // namespace

void hold(cudaStream_t s, std::unique_ptr<Held> work) {
  auto* st = reinterpret_cast<EmuStream*>(s);
  if (st && st->capture) {  // NCCL in a graph: CUDA allows it, the emulator does not record it
    capture_violation(s, "NCCL work on a capturing stream (not emulated)");
    work->progress(true);
    return;
  }
  if (!g_have_owner.load()) {  // the owner first, then the flag that publishes it
    g_owner = std::this_thread::get_id();
    g_have_owner.store(true);
  }
  if (!st) {  // the legacy stream: at once
    work->progress(true);
    return;
  }
  st->items.push_back(Item{std::move(work), {}});
}

void stream_ready(cudaStream_t s) { advance(end_of(s), true); }

bool capturing(cudaStream_t s) {
  auto* st = reinterpret_cast<EmuStream*>(s);
  return st && st->capture;
}

void issue(cudaStream_t s, const char* what, std::function<void()> work) {
  auto* st = reinterpret_cast<EmuStream*>(s);
  if (st && st->capture) {  // recorded; an invalidated capture records nothing more
    if (st->invalidated_by.empty()) st->capture->nodes.push_back({what, std::move(work)});
    return;
  }
  stream_ready(s);
  work();
}

int capture_violation(cudaStream_t s, const std::string& call) {
  auto* st = reinterpret_cast<EmuStream*>(s);
  if (st && st->capture && st->invalidated_by.empty()) st->invalidated_by = call;
  // Returned by the call, as CUDA does: not a pending (sticky) error.
  const std::string msg = call +
                          ": not allowed while the stream captures a graph; the capture is invalidated "
                          "(cudaStreamEndCapture fails with cudaErrorStreamCaptureInvalidated)";
  std::fprintf(stderr, "cuda-emu: %s\n", msg.c_str());
  t_detail = msg;
  return cudaErrorStreamCaptureUnsupported;
}

void device_error(const std::string& msg) { raise(cudaErrorLaunchFailure, msg); }

std::vector<cudaStream_t> capturing_streams(bool strict_only) {
  std::vector<cudaStream_t> v;
  for (auto* s : streams())
    if (s->capture && (!strict_only || s->mode != cudaStreamCaptureModeRelaxed))
      v.push_back(reinterpret_cast<cudaStream_t>(s));
  return v;
}

void streams_ready(bool blocking_only) {
  for (auto* s : streams())
    if (s->blocking || !blocking_only) stream_ready(reinterpret_cast<cudaStream_t>(s));
}

}  // namespace wiola_emu

namespace {
cudaError_t make_stream(cudaStream_t* s, unsigned flags) {
  auto* st = new wiola_emu::EmuStream;
  st->blocking = !(flags & cudaStreamNonBlocking);
  wiola_emu::streams().push_back(st);
  *s = reinterpret_cast<cudaStream_t>(st);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaStreamCreate(cudaStream_t* s) { return make_stream(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) { return make_stream(s, flags); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int) { return make_stream(s, flags); }
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;  // as an H100: 0 (lowest) to -5 (highest)
  *greatest = -5;
  return cudaSuccess;
}
// Its work completes first (CUDA lets it finish after the call returns).
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (wiola_emu::capturing(s)) return cudaError_t(wiola_emu::capture_violation(s, "cudaStreamDestroy"));
  wiola_emu::stream_ready(s);
  auto& v = wiola_emu::streams();
  v.erase(std::remove(v.begin(), v.end(), reinterpret_cast<wiola_emu::EmuStream*>(s)), v.end());
  delete reinterpret_cast<wiola_emu::EmuStream*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  // The host would wait for work that a capture only records.
  if (wiola_emu::capturing(s)) return cudaError_t(wiola_emu::capture_violation(s, "cudaStreamSynchronize"));
  wiola_emu::stream_ready(s);
  return wiola_emu::take_pending();
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new wiola_emu::EmuEvent{});
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<wiola_emu::EmuEvent*>(e);
  return cudaSuccess;
}
namespace {
// What CUDA returns for an event last recorded on a capturing stream: it
// marks a point in a graph, not in any stream's work.
cudaError_t captured_event(const char* call) {
  return raise(cudaErrorCapturedEvent,
               std::string(call) + ": the event was last recorded on a capturing stream (cudaErrorCapturedEvent)");
}
}  // namespace

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  auto* ev = reinterpret_cast<wiola_emu::EmuEvent*>(e);
  ev->captured = wiola_emu::capturing(s);
  if (ev->captured) {  // a point of the capture (another stream may join it: not emulated)
    ev->recorded = false;
    return cudaSuccess;
  }
  ev->at = wiola_emu::end_of(s);
  ev->recorded_at = wiola_emu::Clock::now();
  ev->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (reinterpret_cast<wiola_emu::EmuEvent*>(e)->captured) return captured_event("cudaEventSynchronize");
  wiola_emu::advance(reinterpret_cast<wiola_emu::EmuEvent*>(e)->at, true);
  return wiola_emu::take_pending();
}
// The issuing thread completes what it can without blocking; any other
// thread only looks.
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (reinterpret_cast<wiola_emu::EmuEvent*>(e)->captured) return captured_event("cudaEventQuery");
  const auto& at = reinterpret_cast<wiola_emu::EmuEvent*>(e)->at;
  const bool done = wiola_emu::is_owner() ? wiola_emu::advance(at, false) : wiola_emu::reached(at);
  return done ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t from, cudaEvent_t to) {
  auto *a = reinterpret_cast<wiola_emu::EmuEvent*>(from), *b = reinterpret_cast<wiola_emu::EmuEvent*>(to);
  if (a->captured || b->captured) return captured_event("cudaEventElapsedTime");
  if (!a->recorded || !b->recorded) return raise(cudaErrorInvalidValue, "cudaEventElapsedTime: event not recorded");
  if (!wiola_emu::reached(a->at) || !wiola_emu::reached(b->at)) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(wiola_emu::reached_at(*b) - wiola_emu::reached_at(*a)).count();
  return cudaSuccess;
}
// Work issued to s later runs after e is reached: a wait in s's queue.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  auto* ev = reinterpret_cast<wiola_emu::EmuEvent*>(e);
  // A capture that forks into another stream, or waits on work outside it
  // (CUDA: cudaErrorStreamCaptureIsolation): one stream's capture only.
  if (ev->captured) {
    const auto cap = wiola_emu::capturing_streams(false);
    if (cap.empty()) return captured_event("cudaStreamWaitEvent");
    for (cudaStream_t c : cap)
      wiola_emu::capture_violation(c,
                                   "cudaStreamWaitEvent on an event of a capture (another stream joining it is "
                                   "not emulated)");
    return cudaErrorStreamCaptureUnsupported;
  }
  if (wiola_emu::capturing(s)) {
    wiola_emu::capture_violation(s, "cudaStreamWaitEvent on work outside the capture");
    return cudaErrorStreamCaptureIsolation;
  }
  const auto& at = ev->at;
  auto* st = reinterpret_cast<wiola_emu::EmuStream*>(s);
  if (wiola_emu::reached(at)) return cudaSuccess;
  if (!st) {
    wiola_emu::advance(at, true);
    return cudaSuccess;
  }
  st->items.push_back(wiola_emu::Item{nullptr, at});
  return cudaSuccess;
}

// ---- CUDA Graphs ---------------------------------------------------------------------------
// A capture records what is issued to its stream (kernels, device copies and
// sets, GEMMs, graph launches) instead of running it; an instantiated graph
// runs the recording in order at each launch, after the launching stream's
// earlier work (or is recorded in turn, while that stream captures). Calls a
// capture does not allow invalidate it (capture_violation).
namespace wiola_emu {
namespace {
struct EmuGraphExec {
  std::shared_ptr<const EmuGraph> graph;
};
}  // namespace
}  // namespace wiola_emu

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  auto* st = reinterpret_cast<wiola_emu::EmuStream*>(s);
  if (!st) return raise(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy stream cannot capture");
  if (st->capture) return raise(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream already captures");
  wiola_emu::stream_ready(s);  // what was issued before runs before the graph, as it would
  st->capture = std::make_unique<wiola_emu::EmuGraph>();
  st->mode = mode;
  st->invalidated_by.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  auto* st = reinterpret_cast<wiola_emu::EmuStream*>(s);
  *graph = nullptr;
  if (!st || !st->capture) return raise(cudaErrorIllegalState, "cudaStreamEndCapture: the stream does not capture");
  std::unique_ptr<wiola_emu::EmuGraph> g = std::move(st->capture);
  if (!st->invalidated_by.empty()) {
    const std::string why = std::move(st->invalidated_by);
    st->invalidated_by.clear();
    const std::string msg = "cudaStreamEndCapture: the capture was invalidated by " + why;
    std::fprintf(stderr, "cuda-emu: %s\n", msg.c_str());
    wiola_emu::t_detail = msg;
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = reinterpret_cast<cudaGraph_t>(g.release());
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  auto* st = reinterpret_cast<wiola_emu::EmuStream*>(s);
  *status = !st || !st->capture          ? cudaStreamCaptureStatusNone
            : st->invalidated_by.empty() ? cudaStreamCaptureStatusActive
                                         : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  if (!graph) return raise(cudaErrorInvalidValue, "cudaGraphGetNodes: no graph");
  if (nodes) return raise(cudaErrorInvalidValue, "cudaGraphGetNodes: only the count is emulated");
  *count = reinterpret_cast<const wiola_emu::EmuGraph*>(graph)->nodes.size();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = nullptr;
  if (!graph) return raise(cudaErrorInvalidValue, "cudaGraphInstantiate: no graph");
  // A copy: the graph may be destroyed (or changed) while its executable lives.
  auto copy = std::make_shared<wiola_emu::EmuGraph>(*reinterpret_cast<const wiola_emu::EmuGraph*>(graph));
  *exec = reinterpret_cast<cudaGraphExec_t>(new wiola_emu::EmuGraphExec{std::move(copy)});
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return raise(cudaErrorInvalidValue, "cudaGraphLaunch: no executable graph");
  std::shared_ptr<const wiola_emu::EmuGraph> g = reinterpret_cast<wiola_emu::EmuGraphExec*>(exec)->graph;
  wiola_emu::issue(s, "cudaGraphLaunch", [g] {
    for (const auto& n : g->nodes) n.run();
  });
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<wiola_emu::EmuGraphExec*>(exec);  // a launch in flight keeps its graph
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<wiola_emu::EmuGraph*>(graph);
  return cudaSuccess;
}
