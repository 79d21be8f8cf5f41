// Device memory for the CUDA backend: a caching allocator, so the step loop
// never calls cudaMalloc once the first step has run. Freed blocks are kept
// by size and reused (best fit within 2x); on out-of-memory the cache is
// released and the allocation retried once, then the error says what was
// being allocated and how much is in use and cached.
// WIOLA_CUDA_NO_CACHE=1 turns the cache off: every buffer is a cudaMalloc of
// its exact size, freed at once, so a memory checker (compute-sanitizer's
// memcheck, or AddressSanitizer under the CUDA emulator) sees each buffer's
// own bounds instead of a rounded, reused block.
// While the backend records a CUDA Graph (begin_capture .. end_capture), the
// blocks handed out go to the graphs' pool: the recording names them, so no
// buffer allocated outside a recording ever gets one of them (a replay would
// write into it). Recordings share the pool (they all replay on the one
// stream, one after another); release_graph_pool() gives it back once no
// recording is left.
#pragma once

#include <cstddef>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace wiola::cuda {

class CachingAllocator {
 public:
  CachingAllocator();
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* alloc(size_t bytes, const char* what);
  void free(void* p);
  void release_cache();
  size_t in_use() const { return in_use_; }
  size_t cached() const { return cached_; }
  size_t peak() const { return peak_; }
  size_t device_mallocs() const { return mallocs_; }
  void begin_capture() { capturing_ = true; }
  void end_capture() { capturing_ = false; }
  void release_graph_pool();
  size_t graph_pool_bytes() const { return graph_bytes_; }

 private:
  // A free block of `size` from `pool` (best fit within 2x; exact without
  // the cache), or nullptr.
  void* take(std::multimap<size_t, void*>& pool, size_t size);
  std::multimap<size_t, void*> free_;         // cached blocks by size
  std::unordered_map<void*, size_t> live_;    // block -> size
  std::multimap<size_t, void*> graph_free_;   // the graphs' pool: free blocks by size
  std::unordered_set<void*> graph_blocks_;    // every block of the graphs' pool
  size_t graph_bytes_ = 0;
  bool capturing_ = false;
  size_t in_use_ = 0, cached_ = 0, peak_ = 0, mallocs_ = 0;
  bool cache_;  // false under WIOLA_CUDA_NO_CACHE=1
};

// A temporary device buffer for the duration of one op (stream-ordered
// reuse: the next op on the same stream may get the same block).
class DeviceTemp {
 public:
  DeviceTemp(CachingAllocator& a, size_t bytes, const char* what)
      : a_(a), p_(bytes ? a.alloc(bytes, what) : nullptr) {}
  ~DeviceTemp() {
    if (p_) a_.free(p_);
  }
  DeviceTemp(const DeviceTemp&) = delete;
  DeviceTemp& operator=(const DeviceTemp&) = delete;
  template <class E>
  E* as() const {
    return static_cast<E*>(p_);
  }

 private:
  CachingAllocator& a_;
  void* p_;
};

}  // namespace wiola::cuda
