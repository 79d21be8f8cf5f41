// The CUDA emulator's runtime (tools/cuda_emu/emu.h): launches run their
// blocks one after another on the calling thread, each block's threads as
// fibers that switch only at barriers, warp operations and exit (a stack
// switch of the callee-saved registers: ucontext's signal-mask system calls
// made the tests ten times slower);
// "device" memory is tracked host memory. Errors found while running a
// kernel are reported by the next cudaGetLastError or synchronisation, with a
// message naming the kernel, block and threads. Streams, events and CUDA
// Graphs: emu_streams.cpp.
#include "tools/cuda_emu/emu.h"
#include "tools/cuda_emu/emu_internal.h"
#include "tools/cuda_emu/emu_sanitizer.h"
#include "tools/cuda_emu/launch_record.h"
#include "util/test_hooks.h"

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define WIOLA_EMU_ASAN 1
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

// wiola_emu_switch(save, to): saves the callee-saved registers and the stack
// pointer into *save, then resumes the context whose stack pointer is `to`
// (System V x86-64). The SSE and x87 control words are not switched: every
// fiber runs in the thread's floating-point environment (saving them cost
// half of the emulator's time).
extern "C" void wiola_emu_switch(void** save, void* to);
asm(R"(
.text
.globl wiola_emu_switch
.type wiola_emu_switch,@function
wiola_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size wiola_emu_switch, .-wiola_emu_switch
)");

namespace wiola_emu {
namespace {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 128 << 10;
constexpr size_t kDefaultSmem = 48 << 10;  // dynamic shared memory without the opt-in
constexpr size_t kOptinSmem = 227 << 10;   // H100's opt-in limit per block
constexpr size_t kDeviceBytes = size_t(80) << 30;
constexpr size_t kGatherBytes = 64;  // a lane's part of warp_all_gather, at most

}  // namespace

// ---- errors ----------------------------------------------------------------------
// The pending error and its message: returned (and cleared) by the next
// cudaGetLastError or synchronisation, as an asynchronous fault would be.
thread_local cudaError_t t_pending = cudaSuccess;
thread_local std::string t_detail;

cudaError_t raise(cudaError_t e, std::string msg) {
  std::fprintf(stderr, "cuda-emu: %s\n", msg.c_str());
  if (t_pending == cudaSuccess) {
    t_pending = e;
    t_detail = std::move(msg);
  }
  return e;
}

cudaError_t take_pending() {
  const cudaError_t e = t_pending;
  t_pending = cudaSuccess;
  return e;
}

namespace {

// ---- device memory (the emulator is used from one thread at a time) --------------------
std::map<const char*, size_t>& allocations() {
  static std::map<const char*, size_t> m;  // base -> bytes
  return m;
}
size_t g_in_use = 0;

// ---- fibers -------------------------------------------------------------------------------
enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

struct Fiber {
  void* sp;            // saved stack pointer while switched out
  char* stack_bottom;  // its stack: [stack_bottom, stack_bottom + kStackBytes)
  ThreadCoords c;
  int index, lane, warp;
  State st;
  unsigned shuffles;                    // shuffles done: picks the slot buffer
  unsigned gathers;                     // warp_all_gathers done: picks the gather buffer
  std::shared_ptr<PtxThreadState> ptx;  // emu_ptx.cpp's, once used
};

struct BlockRun {
  const std::function<void()>* body;
  std::vector<Fiber> fibers;
  void* sched_sp;
  struct Slot {
    uint64_t value;
    unsigned gen;  // which shuffle of its thread wrote it
  };
  std::vector<Slot> slots[2];  // one per thread, two buffers: shuffle values
  struct GatherSlot {
    unsigned char data[kGatherBytes];
    const char* what;  // the operation
    unsigned gen;      // which gather of its thread wrote it
  };
  // As slots, for warp_all_gather; empty until a block's first gather.
  std::vector<GatherSlot> gather[2];
  unsigned char* smem;
  std::string error;  // the block's first error
};

thread_local BlockRun* t_run = nullptr;
thread_local Fiber* t_fiber = nullptr;

// Fiber stacks, kept between launches; a guard page below each turns an
// overflow into a fault instead of corruption.
struct Stack {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* base = nullptr;
  Stack() {
    base = mmap(nullptr, page + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      std::perror("cuda-emu: fiber stack");
      std::abort();
    }
    mprotect(base, page, PROT_NONE);
  }
  ~Stack() { munmap(base, page + kStackBytes); }
  // The usable stack, [bottom(), bottom() + kStackBytes), above the guard page.
  char* bottom() const { return static_cast<char*>(base) + page; }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
};
thread_local std::vector<std::unique_ptr<Stack>> t_stacks;

void fiber_error(std::string msg) {
  if (t_run->error.empty()) t_run->error = std::move(msg);
}

// AddressSanitizer must be told of each stack switch (the scheduler's stack
// bounds are learnt when the first fiber starts); no-ops otherwise.
#ifdef WIOLA_EMU_ASAN
thread_local const void* t_sched_bottom = nullptr;
thread_local size_t t_sched_size = 0;
#endif

bool reverse_order();

// The lane of f's warp that the scheduler's sweep (run_warp) would run after
// f, if it is ready; nullptr otherwise. (Not under ASan, whose fibers switch
// through the scheduler.)
[[maybe_unused]] Fiber* next_ready_lane(const Fiber& f) {
  std::vector<Fiber>& fs = t_run->fibers;
  const int w0 = f.warp * kWarp, w1 = std::min(int(fs.size()), w0 + kWarp);
  if (reverse_order()) {
    for (int i = f.index - 1; i >= w0; --i)
      if (fs[size_t(i)].st == State::Ready) return &fs[size_t(i)];
  } else {
    for (int i = f.index + 1; i < w1; ++i)
      if (fs[size_t(i)].st == State::Ready) return &fs[size_t(i)];
  }
  return nullptr;
}

// From a fiber back to the scheduler; `dying`: the fiber never resumes.
// Without AddressSanitizer the fiber switches straight to the lane the
// scheduler's sweep would run next (the same order, half the switches: a
// switch and back through the scheduler at each barrier and shuffle was
// 60 % of an emulated training step), and to the scheduler only at the end
// of a sweep or after an error.
void to_scheduler(bool dying) {
#ifdef WIOLA_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake, t_sched_bottom, t_sched_size);
  wiola_emu_switch(&t_fiber->sp, t_run->sched_sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)dying;
  Fiber* me = t_fiber;
  if (Fiber* next = t_run->error.empty() ? next_ready_lane(*me) : nullptr) {
    t_fiber = next;
    wiola_emu_switch(&me->sp, next->sp);
  } else {
    wiola_emu_switch(&me->sp, t_run->sched_sp);
  }
#endif
}

void fiber_main() {
#ifdef WIOLA_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &t_sched_bottom, &t_sched_size);
#endif
  try {
    (*t_run->body)();
  } catch (const std::exception& e) {
    fiber_error(std::string("exception in device code: ") + e.what());
  }
  if (t_fiber->ptx) {  // e.g. cp.async copies never waited for
    const std::string left = ptx_unfinished_at_exit(*t_fiber->ptx);
    if (!left.empty()) thread_error(left);
  }
  t_fiber->st = State::Done;
  to_scheduler(true);  // never resumed
}

void wait(State s) {
  t_fiber->st = s;
  to_scheduler(false);
}

// A new fiber's stack, as wiola_emu_switch leaves one: six registers, then
// the return address fiber_main, entered with the stack aligned as after a
// call.
void* initial_stack(void* top_of_stack) {
  auto top = reinterpret_cast<uintptr_t>(top_of_stack) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top - 64);
  for (int i = 0; i < 6; ++i) sp[i] = 0;
  sp[6] = reinterpret_cast<uint64_t>(&fiber_main);
  sp[7] = 0;  // fiber_main never returns
  return sp;
}

Fiber& current() {
  if (!t_fiber) {
    std::fprintf(stderr, "cuda-emu: a device builtin was used outside a kernel\n");
    std::abort();
  }
  return *t_fiber;
}

// "(x,y,z)" (snprintf: GCC 12 warns wrongly on "(" + std::string).
std::string xyz(unsigned x, unsigned y, unsigned z) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", x, y, z);
  return buf;
}
std::string coords_str(uint3 v) { return xyz(v.x, v.y, v.z); }
std::string dims(dim3 d) { return xyz(d.x, d.y, d.z); }

const char* state_name(State s) {
  switch (s) {
    case State::Ready: return "running";
    case State::AtBlockBarrier: return "__syncthreads";
    case State::AtWarpBarrier: return "a warp operation";
    case State::Done: return "exited";
  }
  return "?";
}

// From the scheduler into fiber f.
void to_fiber(BlockRun& r, Fiber& f) {
#ifdef WIOLA_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack_bottom, kStackBytes);
  wiola_emu_switch(&r.sched_sp, f.sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  wiola_emu_switch(&r.sched_sp, f.sp);
#endif
}

// WIOLA_EMU_ORDER=reverse runs the warps of a block, and the lanes of a warp,
// last to first. A kernel whose threads read shared data without the barrier
// that orders it gets what the other order gives: running the tests in both
// orders catches a missing barrier whichever side of it the reader is.
int g_reverse = -1;  // -1: not yet read from the environment
bool reverse_order() {
  if (g_reverse < 0) {
    const wiola::TestHook h(wiola::Hook::EmuOrder);
    if (h.set()) h.fields(1, 1);
    g_reverse = h.set() && h.word(0, {"forward", "reverse"}) == "reverse";
  }
  return g_reverse == 1;
}

// Runs warp [w0, w1) until each of its live threads has exited or waits at
// __syncthreads (warp barriers are released as soon as the whole warp is
// there, so a warp's shuffles stay on a few hot stacks), or until it is stuck.
void run_warp(BlockRun& r, int w0, int w1) {
  const bool rev = reverse_order();
  for (;;) {
    for (int k = w0; k < w1; ++k) {
      Fiber& f = r.fibers[size_t(rev ? w0 + w1 - 1 - k : k)];
      if (f.st != State::Ready) continue;
      t_fiber = &f;
      to_fiber(r, f);
      t_fiber = nullptr;
    }
    if (!r.error.empty()) return;
    int live = 0, at = 0;
    for (int i = w0; i < w1; ++i) {
      live += r.fibers[size_t(i)].st != State::Done;
      at += r.fibers[size_t(i)].st == State::AtWarpBarrier;
    }
    if (live == 0 || at != live) return;  // done, at __syncthreads, or stuck
    for (int i = w0; i < w1; ++i)
      if (r.fibers[size_t(i)].st == State::AtWarpBarrier) r.fibers[size_t(i)].st = State::Ready;
  }
}

std::string stuck_message(const BlockRun& r) {
  std::string m = "threads wait at different barriers:";
  State prev = State::Ready;
  int from = -1;
  auto flush = [&](int to) {
    if (from >= 0)
      m += " threads " + std::to_string(from) + ".." + std::to_string(to) + " at " + state_name(prev) + ";";
  };
  for (const Fiber& f : r.fibers) {
    if (f.index == 0 || f.st != prev) {
      flush(f.index - 1);
      from = f.index;
      prev = f.st;
    }
  }
  flush(int(r.fibers.size()) - 1);
  return m;
}

// Runs one block to completion; false (with r.error set) on an error.
bool run_block(BlockRun& r, dim3 grid, dim3 block, uint3 bid) {
  const int n = int(block.x * block.y * block.z);
  while (t_stacks.size() < size_t(n)) t_stacks.push_back(std::make_unique<Stack>());
  r.fibers.assign(size_t(n), Fiber{});
  r.slots[0].assign(size_t(n), {0, ~0u});
  r.slots[1].assign(size_t(n), {0, ~0u});
  for (auto& g : r.gather) g.clear();  // keeps the capacity
  for (int i = 0; i < n; ++i) {
    Fiber& f = r.fibers[size_t(i)];
    f.index = i;
    f.lane = i % kWarp;
    f.warp = i / kWarp;
    f.st = State::Ready;
    f.shuffles = 0;
    f.gathers = 0;
    f.c.tid = uint3{unsigned(i) % block.x, unsigned(i) / block.x % block.y, unsigned(i) / (block.x * block.y)};
    f.c.bid = bid;
    f.c.bdim = block;
    f.c.gdim = grid;
    // Stack tops staggered by 64 bytes a fiber: at one page offset they would
    // all share an L1 set, and every switch would miss.
    f.stack_bottom = t_stacks[size_t(i)]->bottom();
#ifdef WIOLA_EMU_ASAN
    // Frames that never return leave AddressSanitizer's redzones in the
    // stack's shadow: every fiber ends in a switch, and a failed block's
    // fibers stop anywhere. The next fiber on the stack would trip on them
    // (asan.CudaEmu.PtxFaults did, after the launches that fail before it).
    __asan_unpoison_memory_region(f.stack_bottom, kStackBytes);
#endif
    f.sp = initial_stack(f.stack_bottom + kStackBytes - 64 * size_t(i % 64));
  }
  for (;;) {
    const int warps = (n + kWarp - 1) / kWarp;
    for (int k = 0; k < warps; ++k) {
      const int w0 = (reverse_order() ? warps - 1 - k : k) * kWarp;
      run_warp(r, w0, std::min(n, w0 + kWarp));
      if (!r.error.empty()) return false;
    }
    int live = 0, at = 0;
    for (const Fiber& f : r.fibers) {
      live += f.st != State::Done;
      at += f.st == State::AtBlockBarrier;
    }
    if (live == 0) return true;
    if (at != live) {  // some thread waits at a warp barrier its warp does not reach
      r.error = stuck_message(r);
      return false;
    }
    for (Fiber& f : r.fibers)
      if (f.st == State::AtBlockBarrier) f.st = State::Ready;
  }
}

std::map<const void*, size_t>& max_smem() {
  static std::map<const void*, size_t> m;
  return m;
}

// launch_record.h: the launches issued while on.
struct LaunchRecord {
  std::mutex mu;
  bool on = false;
  std::vector<LaunchShape> shapes;
};
LaunchRecord& launch_record() {
  static LaunchRecord r;
  return r;
}

}  // namespace

void set_reverse_order(bool reverse) { g_reverse = reverse; }

// emu_sanitizer.h.
bool under_address_sanitizer() {
#ifdef WIOLA_EMU_ASAN
  return true;
#else
  return false;
#endif
}

void record_launches(bool on) {
  std::lock_guard<std::mutex> lock(launch_record().mu);
  launch_record().on = on;
  if (on) launch_record().shapes.clear();
}

std::vector<LaunchShape> recorded_launches() {
  std::lock_guard<std::mutex> lock(launch_record().mu);
  return launch_record().shapes;
}

const ThreadCoords& coords() { return current().c; }
int lane_id() { return current().lane; }
unsigned char* dynamic_smem() {
  current();
  return t_run->smem;
}

void syncthreads() {
  current();
  wait(State::AtBlockBarrier);
}

void syncwarp(unsigned mask) {
  Fiber& f = current();
  const int n = int(t_run->fibers.size());
  const int lanes = std::min(kWarp, n - f.warp * kWarp);
  const unsigned full = lanes == kWarp ? 0xffffffffu : ((1u << lanes) - 1u);
  if ((mask & full) != full)
    fiber_error("warp operation with the partial mask " + std::to_string(mask) +
                " (not emulated; the kernels use full warps)");
  wait(State::AtWarpBarrier);
}

// One barrier per shuffle: consecutive shuffles alternate between two slot
// buffers, and a lane cannot write a buffer again before every lane has
// passed the next barrier, after its read.
uint64_t shuffle(unsigned mask, uint64_t in, int src_lane) {
  Fiber& f = current();
  BlockRun& r = *t_run;
  const unsigned gen = f.shuffles++;
  std::vector<BlockRun::Slot>& slots = r.slots[gen & 1u];
  slots[size_t(f.index)] = {in, gen};
  syncwarp(mask);
  const int src = f.warp * kWarp + src_lane;
  if (src_lane < 0 || src_lane >= kWarp || src >= int(r.fibers.size())) {
    fiber_error("thread " + std::to_string(f.index) + " shuffles from lane " + std::to_string(src_lane) +
                ", outside the block");
    return in;
  } else if (slots[size_t(src)].gen != gen) {
    fiber_error("thread " + std::to_string(f.index) + " shuffles from thread " + std::to_string(src) +
                ", which did not take part in this shuffle: it has exited (undefined on the GPU)");
    return in;
  }
  return slots[size_t(src)].value;
}

void thread_error(const std::string& msg) { fiber_error("thread " + std::to_string(current().index) + ": " + msg); }

// As shuffle: one warp barrier per gather, two buffers alternating. A lane
// whose slot is not of this gather did not arrive at it.
bool warp_all_gather(const char* what, const void* in, size_t bytes, void* out) {
  Fiber& f = current();
  BlockRun& r = *t_run;
  const int n = int(r.fibers.size());
  if (bytes > kGatherBytes) {
    std::fprintf(stderr, "cuda-emu: warp_all_gather of %zu bytes a lane (at most %zu)\n", bytes, kGatherBytes);
    std::abort();
  }
  if ((f.warp + 1) * kWarp > n) {
    thread_error(std::string(what) + " needs the whole warp; the block's last warp has " +
                 std::to_string(n - f.warp * kWarp) + " threads");
    return false;
  }
  if (r.gather[0].empty())
    for (auto& g : r.gather) g.assign(size_t(n), BlockRun::GatherSlot{{}, "", ~0u});
  const unsigned gen = f.gathers++;
  std::vector<BlockRun::GatherSlot>& slots = r.gather[gen & 1u];
  BlockRun::GatherSlot& mine = slots[size_t(f.index)];
  std::memcpy(mine.data, in, bytes);
  mine.what = what;
  mine.gen = gen;
  syncwarp(0xffffffffu);
  for (int l = 0; l < kWarp; ++l) {
    const size_t src = size_t(f.warp * kWarp + l);
    const BlockRun::GatherSlot& s = slots[src];
    // (The same operation names itself with the same literal: the pointers
    // compare first, the strings only where they differ. A strcmp for each
    // of a warp's 32 x 32 pairs was a third of the fa2 tests' time.)
    if (s.gen != gen || (s.what != what && std::strcmp(s.what, what) != 0)) {
      thread_error(std::string(what) + " needs the whole warp, converged: lane " + std::to_string(l) +
                   (r.fibers[src].st == State::Done && s.gen != gen
                        ? " has exited (undefined on the GPU)"
                        : " is at another warp operation (the warp is not converged)"));
      return false;
    }
    std::memcpy(static_cast<unsigned char*>(out) + size_t(l) * bytes, s.data, bytes);
  }
  return true;
}

PtxThreadState& ptx_thread_state() {
  Fiber& f = current();
  if (!f.ptx) f.ptx = new_ptx_thread_state();
  return *f.ptx;
}

namespace {
void run_grid(const char* name, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);
}  // namespace

void launch(const char* name, const void* fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            std::function<void()> body) {
  if (t_run) {
    raise(cudaErrorLaunchFailure, std::string(name) + ": launched from device code (not emulated)");
    return;
  }
  const size_t threads = size_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
      block.z > 64) {
    raise(cudaErrorInvalidConfiguration,
          std::string("invalid launch of ") + name + ": grid " + dims(grid) + ", block " + dims(block));
    return;
  }
  auto it = max_smem().find(fn);
  const size_t limit = it == max_smem().end() ? kDefaultSmem : it->second;
  if (smem > limit) {
    raise(cudaErrorInvalidValue, std::string("launch of ") + name + " asks " + std::to_string(smem) +
                                     " bytes of dynamic shared memory; its limit is " + std::to_string(limit) +
                                     (it == max_smem().end() ? " (no cudaFuncSetAttribute opt-in)" : ""));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(launch_record().mu);
    if (launch_record().on)
      launch_record().shapes.push_back({name, {grid.x, grid.y, grid.z}, {block.x, block.y, block.z}});
  }
  // Checked as it is issued (a captured launch too); runs now or, while the
  // stream captures, at every launch of the graph.
  issue(stream, name, [name, grid, block, smem, body = std::move(body)] { run_grid(name, grid, block, smem, body); });
}

namespace {
void run_grid(const char* name, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  // Dynamic shared memory starts as NaN bytes in every block: a read before
  // any write shows up in the results.
  // Its exact size too, for AddressSanitizer.
  void* smem_block = nullptr;
  if (posix_memalign(&smem_block, 128, std::max<size_t>(smem, 1)) != 0) {
    raise(cudaErrorMemoryAllocation, std::string("launch of ") + name + ": no host memory for shared memory");
    return;
  }
  std::unique_ptr<unsigned char, decltype(&std::free)> sm(static_cast<unsigned char*>(smem_block), &std::free);
  BlockRun r;
  r.body = &body;
  r.smem = sm.get();
  t_run = &r;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(r.smem, 0xff, smem);
        if (!run_block(r, grid, block, uint3{x, y, z})) {
          t_run = nullptr;
          raise(cudaErrorLaunchFailure, std::string("kernel ") + name + ", block " + coords_str(uint3{x, y, z}) +
                                            " of grid " + dims(grid) + ", block size " + dims(block) + ": " + r.error);
          return;  // the block's fibers are abandoned (their stacks are reused)
        }
      }
  t_run = nullptr;
}
}  // namespace

cudaError_t set_max_dynamic_smem(const void* fn, int bytes) {
  if (bytes < 0 || size_t(bytes) > kOptinSmem)
    return raise(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(bytes) +
                                            " bytes of dynamic shared memory, above the opt-in limit " +
                                            std::to_string(kOptinSmem));
  max_smem()[fn] = size_t(bytes);
  return cudaSuccess;
}

bool in_device_memory(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  auto& m = allocations();
  auto it = m.upper_bound(c);
  if (it == m.begin()) return false;
  --it;
  return size_t(c - it->first) + bytes <= it->second;
}

}  // namespace wiola_emu

using wiola_emu::raise;

// ---- the runtime API ------------------------------------------------------------------------
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
  }
  return "cudaErrorUnknown";
}
// The emulator's own message for the error it last raised.
const char* cudaGetErrorString(cudaError_t e) {
  if (e == cudaSuccess) return "no error";
  if (!wiola_emu::t_detail.empty()) return wiola_emu::t_detail.c_str();
  return cudaGetErrorName(e);
}
cudaError_t cudaGetLastError() { return wiola_emu::take_pending(); }
cudaError_t cudaPeekAtLastError() { return wiola_emu::t_pending; }
namespace {
// WIOLA_EMU_DEVICES=n (default 1): the devices a process sees, so that the
// ranks of an mpirun on one machine each take their own, as on a GPU node
// (every process emulates its own).
int device_count() {
  static const int n = [] {
    const wiola::TestHook h(wiola::Hook::EmuDevices);
    if (!h.set()) return 1;
    h.fields(1, 1);
    return int(h.integer(0, 1, 64));
  }();
  return n;
}
bool valid_device(int d) { return d >= 0 && d < device_count(); }
}  // namespace

cudaError_t cudaGetDeviceCount(int* n) {
  *n = device_count();
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!valid_device(device))
    return raise(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device " + std::to_string(device));
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "%s", "CUDA emulator on the CPU (tools/cuda_emu)");
  p->totalGlobalMem = wiola_emu::kDeviceBytes;
  p->sharedMemPerBlock = wiola_emu::kDefaultSmem;
  p->sharedMemPerBlockOptin = wiola_emu::kOptinSmem;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerBlock = 1024;
  p->warpSize = 32;
  p->pciBusID = device;  // each emulated device a bus of its own
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int device) {
  if (!valid_device(device))
    return raise(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: device " + std::to_string(device));
  if (a != cudaDevAttrMaxSharedMemoryPerBlockOptin) return raise(cudaErrorInvalidValue, "cudaDeviceGetAttribute");
  *v = int(wiola_emu::kOptinSmem);
  return cudaSuccess;
}
namespace {
thread_local int t_device = 0;
}
cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return raise(cudaErrorInvalidDevice, "cudaSetDevice: device " + std::to_string(device));
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  // It would wait for the work a capture only records.
  for (cudaStream_t s : wiola_emu::capturing_streams(false)) wiola_emu::capture_violation(s, "cudaDeviceSynchronize");
  if (!wiola_emu::capturing_streams(false).empty()) return cudaErrorStreamCaptureUnsupported;
  wiola_emu::streams_ready(false);
  return wiola_emu::take_pending();
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  // A capture in global or thread-local mode forbids it ("potentially
  // unsafe"); relaxed mode allows it.
  if (const auto strict = wiola_emu::capturing_streams(true); !strict.empty()) {
    for (cudaStream_t s : strict) wiola_emu::capture_violation(s, "cudaMalloc (capture mode not relaxed)");
    return cudaErrorStreamCaptureUnsupported;
  }
  if (wiola_emu::g_in_use + bytes > wiola_emu::kDeviceBytes) return cudaErrorMemoryAllocation;
  // The exact size (256-byte aligned, as cudaMalloc's): under
  // AddressSanitizer a kernel reading past a buffer's end is caught.
  void* q = nullptr;
  if (posix_memalign(&q, 256, std::max<size_t>(bytes, 1)) != 0) return cudaErrorMemoryAllocation;
  std::memset(q, 0xff, bytes);  // uninitialised device memory reads as NaN
  wiola_emu::allocations()[static_cast<const char*>(q)] = bytes;
  wiola_emu::g_in_use += bytes;
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  // It synchronises the device: never during a capture (stricter than some
  // CUDA versions in relaxed mode).
  if (const auto cap = wiola_emu::capturing_streams(false); !cap.empty()) {
    for (cudaStream_t s : cap) wiola_emu::capture_violation(s, "cudaFree");
    return cudaErrorStreamCaptureUnsupported;
  }
  auto& m = wiola_emu::allocations();
  auto it = m.find(static_cast<const char*>(p));
  if (it == m.end()) return raise(cudaErrorInvalidValue, "cudaFree of a pointer cudaMalloc did not return");
  wiola_emu::g_in_use -= it->second;
  m.erase(it);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = wiola_emu::kDeviceBytes;
  *free_bytes = wiola_emu::kDeviceBytes - wiola_emu::g_in_use;
  return cudaSuccess;
}

namespace {

// The device-side ranges of a copy must each lie inside one allocation.
cudaError_t check_ranges(const char* what, const void* dst, size_t dst_span, const void* src, size_t src_span,
                         cudaMemcpyKind kind) {
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_dev && !wiola_emu::in_device_memory(dst, dst_span))
    return raise(cudaErrorInvalidValue, std::string(what) + ": the destination's " + std::to_string(dst_span) +
                                            " bytes are not inside one device allocation");
  if (src_dev && !wiola_emu::in_device_memory(src, src_span))
    return raise(cudaErrorInvalidValue, std::string(what) + ": the source's " + std::to_string(src_span) +
                                            " bytes are not inside one device allocation");
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  // The legacy stream's synchronous copy: "potentially unsafe" during a
  // capture in global or thread-local mode.
  if (const auto strict = wiola_emu::capturing_streams(true); !strict.empty()) {
    for (cudaStream_t s : strict) wiola_emu::capture_violation(s, "cudaMemcpy (synchronous, legacy stream)");
    return cudaErrorStreamCaptureUnsupported;
  }
  wiola_emu::streams_ready(true);
  if (const cudaError_t e = wiola_emu::take_pending(); e != cudaSuccess) return e;
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  // A capture records device-to-device copies only: the backend's host
  // memory is pageable, which a graph cannot copy to or from.
  if (wiola_emu::capturing(s) && kind != cudaMemcpyDeviceToDevice)
    return cudaError_t(wiola_emu::capture_violation(s, "cudaMemcpyAsync to or from host memory"));
  if (const cudaError_t e = check_ranges("cudaMemcpyAsync", dst, bytes, src, bytes, kind); e != cudaSuccess) return e;
  wiola_emu::issue(s, "cudaMemcpyAsync", [dst, src, bytes, kind] {
    if (check_ranges("cudaMemcpyAsync (in a graph)", dst, bytes, src, bytes, kind) == cudaSuccess)
      std::memmove(dst, src, bytes);
  });
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s) {
  if (!width || !height) return cudaSuccess;
  if (wiola_emu::capturing(s) && kind != cudaMemcpyDeviceToDevice)
    return cudaError_t(wiola_emu::capture_violation(s, "cudaMemcpy2DAsync to or from host memory"));
  if (width > dpitch || width > spitch) return raise(cudaErrorInvalidValue, "cudaMemcpy2DAsync: width above a pitch");
  const size_t dspan = (height - 1) * dpitch + width, sspan = (height - 1) * spitch + width;
  if (const cudaError_t e = check_ranges("cudaMemcpy2DAsync", dst, dspan, src, sspan, kind); e != cudaSuccess) return e;
  wiola_emu::issue(s, "cudaMemcpy2DAsync", [=] {
    if (check_ranges("cudaMemcpy2DAsync (in a graph)", dst, dspan, src, sspan, kind) != cudaSuccess) return;
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  if (!wiola_emu::in_device_memory(p, bytes))
    return raise(cudaErrorInvalidValue,
                 "cudaMemsetAsync: " + std::to_string(bytes) + " bytes not inside one device allocation");
  wiola_emu::issue(s, "cudaMemsetAsync", [p, value, bytes] {
    if (!wiola_emu::in_device_memory(p, bytes))
      raise(cudaErrorInvalidValue,
            "cudaMemsetAsync (in a graph): " + std::to_string(bytes) + " bytes not inside one device allocation");
    else std::memset(p, value, bytes);
  });
  return cudaSuccess;
}
