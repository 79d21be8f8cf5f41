// Memory of the cpu-opaque debug backend: one reserved address range whose
// pages are PROT_NONE except while the backend itself runs (an op, an upload
// or a download). Host code above kernels/ that touches a backend buffer
// therefore crashes at the faulting instruction instead of reading silently,
// which is what a GPU's device memory would do to it. Fresh allocations are
// filled with 0xFF bytes (NaN as float/double, -1 as int) so code that relied
// on zero-filled allocation shows NaN in its results. Freed blocks are kept
// for reuse, not returned to the system.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>

namespace wiola::cpu {

class OpaqueMemory {
 public:
  explicit OpaqueMemory(size_t reserve_bytes = size_t(64) << 30);
  ~OpaqueMemory();
  OpaqueMemory(const OpaqueMemory&) = delete;
  OpaqueMemory& operator=(const OpaqueMemory&) = delete;

  void* alloc(size_t bytes);
  void free(void* p);
  // Make every allocation readable and writable / inaccessible again.
  // Nested opens are counted; only the outermost close protects.
  void open();
  void close();

 private:
  size_t span() const;  // the bytes open() and close() change: [base, base+span)

  char* map_ = nullptr;            // the mapping: reserved_ and one huge page more
  char* base_ = nullptr;           // its first 2 MiB boundary
  size_t reserved_ = 0, top_ = 0;  // bytes handed out so far: [base, base+top)
  int depth_ = 0;
  std::map<void*, size_t> live_;            // allocation -> rounded size
  std::multimap<size_t, void*> free_;       // freed blocks by size, reused
};

// RAII: the memory is open for the lifetime of the guard (no-op for null).
class OpenGuard {
 public:
  explicit OpenGuard(OpaqueMemory* m) : m_(m) {
    if (m_) m_->open();
  }
  ~OpenGuard() {
    if (m_) m_->close();
  }
  OpenGuard(const OpenGuard&) = delete;
  OpenGuard& operator=(const OpenGuard&) = delete;

 private:
  OpaqueMemory* m_;
};

}  // namespace wiola::cpu
