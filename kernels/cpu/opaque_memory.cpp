#include "kernels/cpu/opaque_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <new>

#include "util/error.h"

namespace wiola::cpu {
namespace {
size_t page_size() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}
size_t round_up(size_t b, size_t to) { return (b + to - 1) / to * to; }
size_t round_pages(size_t b) { return round_up(std::max<size_t>(b, 1), page_size()); }
// Huge pages make open() and close() cheap: mprotect's cost grows with the
// page-table entries it rewrites, 512 times fewer with 2 MiB pages (measured
// on a 80 MiB range: 1.5 ms per call with 4 KiB pages, 5 us with 2 MiB ones).
// An op opens and closes the whole range, thousands of times per step.
constexpr size_t kHuge = size_t(2) << 20;
void protect(void* p, size_t bytes, int prot) {
  if (bytes && mprotect(p, bytes, prot) != 0)
    fail("cpu-opaque: mprotect failed: ", std::strerror(errno));
}
}  // namespace

OpaqueMemory::OpaqueMemory(size_t reserve_bytes) : reserved_(round_up(round_pages(reserve_bytes), kHuge)) {
  // One huge page more than asked, so that the range can start on a huge page.
  void* p = mmap(nullptr, reserved_ + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cpu-opaque: cannot reserve ", reserved_ >> 20, " MiB of address space: ",
                            std::strerror(errno));
  map_ = static_cast<char*>(p);
  base_ = map_ + (round_up(reinterpret_cast<uintptr_t>(map_), kHuge) - reinterpret_cast<uintptr_t>(map_));
  // Advice only: without transparent huge pages the backend is the same, slower.
  madvise(base_, reserved_, MADV_HUGEPAGE);
}

OpaqueMemory::~OpaqueMemory() {
  if (map_) munmap(map_, reserved_ + kHuge);
}

void* OpaqueMemory::alloc(size_t bytes) {
  const size_t size = round_pages(bytes);
  void* p = nullptr;
  if (auto it = free_.find(size); it != free_.end()) {
    p = it->second;
    free_.erase(it);
  } else {
    if (top_ + size > reserved_) throw std::bad_alloc();
    p = base_ + top_;
    top_ += size;
  }
  live_[p] = size;
  OpenGuard g(this);
  std::memset(p, 0xFF, size);  // NaN: nothing may rely on zero-filled memory
  return p;
}

void OpaqueMemory::free(void* p) {
  if (!p) return;
  const auto it = live_.find(p);
  WIOLA_CHECK(it != live_.end(), "cpu-opaque: free of a pointer it did not allocate");
  const size_t size = it->second;
  live_.erase(it);
  // Kept, not returned to the system (MADV_DONTNEED would split the huge
  // pages): the next allocation of this size reuses it, filled afresh.
  free_.emplace(size, p);
}

// Whole huge pages: a protection boundary inside one would split it.
size_t OpaqueMemory::span() const { return std::min(round_up(top_, kHuge), reserved_); }

void OpaqueMemory::open() {
  if (depth_++ == 0) protect(base_, span(), PROT_READ | PROT_WRITE);
}

void OpaqueMemory::close() {
  if (--depth_ == 0) protect(base_, span(), PROT_NONE);
}

}  // namespace wiola::cpu
