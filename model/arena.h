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
  template <class E = T>
  void reserve(E** slot, size_t n) {
    requests_.push_back({reinterpret_cast<void**>(slot), (n * sizeof(E) + 63) / 64 * 64});
  }
  void commit(Ops<T>& ops) {
    size_t total = 0;
    for (const auto& r : requests_) total += r.bytes;
    block_ = Buffer<T, unsigned char>(ops, total);
    size_t off = 0;
    for (const auto& r : requests_) {
      *r.slot = r.bytes ? block_.data() + off : nullptr;
      off += r.bytes;
    }
    requests_.clear();
  }
  size_t bytes() const { return block_.bytes(); }

 private:
  struct Request {
    void** slot;
    size_t bytes;
  };
  std::vector<Request> requests_;
  Buffer<T, unsigned char> block_;
};

}  // namespace wiola
