// The CUDA emulator's warp-level PTX instructions (emu.h), behind the
// wrappers of kernels/cuda/ptx.cuh: mma.sync.m16n8k16 (bf16 in, fp32
// accumulate), ldmatrix.m8n8 (.x1/.x2/.x4, with and without .trans) and
// cp.async (16 bytes, commit and wait groups). The fragment layouts are the
// PTX ISA's; ptx_probe (tests/gpu) compares them with a GPU's.
//
// mma.sync and ldmatrix are warp-collective: every lane gives its part through
// warp_all_gather (emu.cpp) and computes its own registers from all of them,
// so a lane that exited or a warp that is not converged is an error. cp.async
// is per thread: a copy reads its source when issued, and writes its
// destination when a wait completes its group; until then the destination
// holds NaN bytes, so a read before the wait shows.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "kernels/cuda/ptx.cuh"
#include "tools/cuda_emu/emu.h"

namespace wiola_emu {

// ---- cp.async: the per-thread state ---------------------------------------------
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;  // null for a zero fill
  unsigned char bytes[16];   // the source as it was at issue
};
struct PtxThreadState {
  std::vector<AsyncCopy> open;                  // issued since the last commit
  std::deque<std::vector<AsyncCopy>> committed;  // groups in flight, oldest first
};

std::shared_ptr<PtxThreadState> new_ptx_thread_state() { return std::make_shared<PtxThreadState>(); }

std::string ptx_unfinished_at_exit(const PtxThreadState& s) {
  size_t copies = s.open.size();
  for (const auto& g : s.committed) copies += g.size();
  if (copies == 0) return "";
  return "cp.async still in flight at exit: " + std::to_string(copies) + " copies, " +
         std::to_string(s.committed.size()) + " committed groups not waited for and " + std::to_string(s.open.size()) +
         " copies not committed (the kernel must cp.async.wait_group 0 before it exits)";
}

namespace {

// "0x7f..." for error messages.
std::string address(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- the fragments ----------------------------------------------------------------------
// One lane's registers of mma.m16n8k16: a[4], b[2] (two bf16 each, the lower
// column or row in the low half), c[4].
struct MmaLane {
  uint32_t a[4], b[2];
  float c[4];
};

float bf16_half(uint32_t reg, int half) {
  __nv_bfloat16 h;
  h.bits = uint16_t(half ? reg >> 16 : reg & 0xffffu);
  return float(h);
}

// The PTX ISA's layouts, element by element: lane 4g + t (g = l / 4,
// t = l % 4) holds A rows g and g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9;
// B columns g, rows as A's columns; C rows g and g + 8, columns 2t, 2t + 1.
float a_elem(const MmaLane* w, int row, int k) {
  const MmaLane& l = w[4 * (row % 8) + (k % 8) / 2];
  return bf16_half(l.a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
}
float b_elem(const MmaLane* w, int k, int col) {
  const MmaLane& l = w[4 * col + (k % 8) / 2];
  return bf16_half(l.b[k >= 8 ? 1 : 0], k % 2);
}
float c_elem(const MmaLane* w, int row, int col) {
  return w[4 * (row % 8) + col / 2].c[(row >= 8 ? 2 : 0) + col % 2];
}

}  // namespace

namespace ptx {

// D = A B + C for this lane's four elements. Each sum in fp32, k ascending,
// then C added: the products of two bf16 are exact in fp32, but the tensor
// cores add them in their own order and precision, so a GPU's D may differ
// from this in the last bits (ptx_probe's inputs are small integers, exact
// in both).
void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  MmaLane mine, warp[32];
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  std::memcpy(mine.c, c, sizeof mine.c);
  if (!warp_all_gather("mma.sync.m16n8k16", &mine, sizeof mine, warp)) return;
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + i % 2;
    float acc = 0.f;
    for (int k = 0; k < 16; ++k) acc += a_elem(warp, row, k) * b_elem(warp, k, col);
    d[i] = acc + c_elem(warp, row, col);
  }
}

// Lanes 8i..8i+7 address matrix i's rows. Each lane reads its own row before
// the exchange, so all reads happen before any lane goes on (a lane's later
// store to the tile cannot reach another lane's load, as on the GPU).
void ldmatrix(uint32_t* r, int n, bool trans, const void* row) {
  static const char* const names[2][5] = {
      {"", "ldmatrix.x1", "ldmatrix.x2", "", "ldmatrix.x4"},
      {"", "ldmatrix.x1.trans", "ldmatrix.x2.trans", "", "ldmatrix.x4.trans"}};
  const char* what = names[trans][n];
  const int lane = lane_id();
  unsigned char mine[16] = {}, rows[32][16];
  if (lane < 8 * n) {  // the other lanes' addresses are not read
    if (!aligned16(row)) {
      thread_error(std::string(what) + ": lane " + std::to_string(lane) + "'s row address " + address(row) +
                   " is not 16-byte aligned");
    } else if (in_device_memory(row, 16)) {
      thread_error(std::string(what) + ": lane " + std::to_string(lane) + "'s row address " + address(row) +
                   " is in global memory (ldmatrix reads shared memory)");
    } else {
      std::memcpy(mine, row, 16);
    }
  }
  if (!warp_all_gather(what, mine, sizeof mine, rows)) return;
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < n; ++i) {
    const unsigned char* m = rows[8 * i];  // matrix i: 8 rows of 8 bf16
    uint16_t lo, hi;
    if (!trans) {  // row g, columns 2t, 2t + 1
      std::memcpy(&lo, m + 16 * g + 4 * t, 2);
      std::memcpy(&hi, m + 16 * g + 4 * t + 2, 2);
    } else {  // column g, rows 2t, 2t + 1
      std::memcpy(&lo, m + 16 * (2 * t) + 2 * g, 2);
      std::memcpy(&hi, m + 16 * (2 * t + 1) + 2 * g, 2);
    }
    r[i] = uint32_t(lo) | uint32_t(hi) << 16;
  }
}

void cp_async_16(void* dst, const void* src, bool valid) {
  if (!aligned16(dst) || (valid && !aligned16(src))) {
    thread_error("cp.async: destination " + address(dst) + " or source " + address(src) +
                 " is not 16-byte aligned");
    return;
  }
  if (in_device_memory(dst, 16)) {
    thread_error("cp.async: destination " + address(dst) + " is in global memory (it must be shared memory)");
    return;
  }
  if (valid && !in_device_memory(src, 16)) {
    thread_error("cp.async: the source's 16 bytes at " + address(src) + " are not inside one device allocation");
    return;
  }
  AsyncCopy c{static_cast<unsigned char*>(dst), valid ? static_cast<const unsigned char*>(src) : nullptr, {}};
  if (valid) std::memcpy(c.bytes, src, 16);
  std::memset(dst, 0xff, 16);  // NaN until the wait
  ptx_thread_state().open.push_back(c);
}

// A commit with no copies makes an empty group, as on the GPU: it still
// counts for the waits.
void cp_async_commit() {
  PtxThreadState& s = ptx_thread_state();
  s.committed.push_back(std::move(s.open));
  s.open.clear();
}

// Completes the oldest groups until at most n are in flight. A source that
// changed since its copy was issued is a race the GPU would not forgive (the
// copy may read it at any time until the wait).
void cp_async_wait(int n) {
  PtxThreadState& s = ptx_thread_state();
  while (s.committed.size() > size_t(n)) {
    for (const AsyncCopy& c : s.committed.front()) {
      if (c.src && std::memcmp(c.src, c.bytes, 16) != 0)
        thread_error("cp.async: the source at " + address(c.src) + " changed while its copy was in flight");
      std::memcpy(c.dst, c.bytes, 16);
    }
    s.committed.pop_front();
  }
}

}  // namespace ptx
}  // namespace wiola_emu
