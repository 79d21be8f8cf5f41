// One backend allocation carved into many tensors (activations, workspaces).
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/ops.h"

namespace wiola {

template <class T>
class Arena {
 public:
  // Two passes: reserve sizes (pointers are placeholders), then commit().
  // Index arrays and fixed-type buffers:
  template <class E>
  void reserve(E** slot, size_t n) {
    requests_.push_back({reinterpret_cast<void**>(slot), nullptr, DType::U8, bytes_for(n * sizeof(E))});
  }
  // Floating-point tensors in a storage type chosen at run time:
  void reserve(Ptr* slot, DType t, size_t n) {
    requests_.push_back({nullptr, slot, t, bytes_for(n * dtype_bytes(t))});
  }
  void commit(Ops<T>& ops) {
    size_t total = 0;
    for (const auto& r : requests_) total += r.bytes;
    block_ = Buffer<T, unsigned char>(ops, total);
    size_t off = 0;
    for (const auto& r : requests_) {
      unsigned char* p = r.bytes ? block_.data() + off : nullptr;
      if (r.raw) *r.raw = p;
      else *r.typed = Ptr(p, r.dtype);
      off += r.bytes;
    }
    requests_.clear();
  }
  size_t bytes() const { return block_.bytes(); }
  // What commit() would allocate now (sizing without allocating: perf/).
  size_t reserved_bytes() const {
    size_t total = 0;
    for (const auto& r : requests_) total += r.bytes;
    return total;
  }

 private:
  static size_t bytes_for(size_t b) { return (b + 63) / 64 * 64; }
  struct Request {
    void** raw;
    Ptr* typed;
    DType dtype;
    size_t bytes;
  };
  std::vector<Request> requests_;
  Buffer<T, unsigned char> block_;
};

}  // namespace wiola
