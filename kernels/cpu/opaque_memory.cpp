#include "kernels/cpu/opaque_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
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
size_t round_pages(size_t b) {
  const size_t p = page_size();
  return (std::max<size_t>(b, 1) + p - 1) / p * p;
}
void protect(void* p, size_t bytes, int prot) {
  if (bytes && mprotect(p, bytes, prot) != 0)
    fail("cpu-opaque: mprotect failed: ", std::strerror(errno));
}
}  // namespace

OpaqueMemory::OpaqueMemory(size_t reserve_bytes) : reserved_(round_pages(reserve_bytes)) {
  void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cpu-opaque: cannot reserve ", reserved_ >> 20, " MiB of address space: ",
                            std::strerror(errno));
  base_ = static_cast<char*>(p);
}

OpaqueMemory::~OpaqueMemory() {
  if (base_) munmap(base_, reserved_);
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
  {
    OpenGuard g(this);  // the advice below needs the pages mapped writable
    madvise(p, size, MADV_DONTNEED);
  }
  free_.emplace(size, p);
}

void OpaqueMemory::open() {
  if (depth_++ == 0) protect(base_, top_, PROT_READ | PROT_WRITE);
}

void OpaqueMemory::close() {
  if (--depth_ == 0) protect(base_, top_, PROT_NONE);
}

}  // namespace wiola::cpu
