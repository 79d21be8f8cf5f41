// Pointers into backend memory that carry their element type. The host may
// offset them (in elements of that type) and hand them to ops, never
// dereference them: on a GPU they are device memory, and the debug backend
// (cpu-opaque) keeps them inaccessible outside its ops. A backend reads an
// argument with as<E>(), which checks that the buffer holds E.
#pragma once

#include <cstddef>

#include "kernels/dtype.h"

namespace wiola {

// Thrown (as wiola::Error) by as<E>() on a dtype mismatch.
[[noreturn]] void dtype_mismatch(DType have, DType want);

class Ptr {
 public:
  Ptr() = default;
  Ptr(std::nullptr_t) {}
  Ptr(void* p, DType t) : p_(p), t_(t) {}
  template <FloatElement E>
  Ptr(E* p) : p_(p), t_(dtype_of<E>()) {}  // implicit: typed buffers convert

  void* raw() const { return p_; }
  DType dtype() const { return t_; }
  explicit operator bool() const { return p_ != nullptr; }
  Ptr operator+(size_t elems) const {
    return Ptr(static_cast<char*>(p_) + elems * dtype_bytes(t_), t_);
  }
  template <class E>
  E* as() const {
    if (p_ && t_ != dtype_of<E>()) dtype_mismatch(t_, dtype_of<E>());
    return static_cast<E*>(p_);
  }

 private:
  void* p_ = nullptr;
  DType t_ = DType::F32;
};

class CPtr {
 public:
  CPtr() = default;
  CPtr(std::nullptr_t) {}
  CPtr(const void* p, DType t) : p_(p), t_(t) {}
  CPtr(Ptr p) : p_(p.raw()), t_(p.dtype()) {}
  template <FloatElement E>
  CPtr(const E* p) : p_(p), t_(dtype_of<E>()) {}

  const void* raw() const { return p_; }
  DType dtype() const { return t_; }
  explicit operator bool() const { return p_ != nullptr; }
  CPtr operator+(size_t elems) const {
    return CPtr(static_cast<const char*>(p_) + elems * dtype_bytes(t_), t_);
  }
  template <class E>
  const E* as() const {
    if (p_ && t_ != dtype_of<E>()) dtype_mismatch(t_, dtype_of<E>());
    return static_cast<const E*>(p_);
  }

 private:
  const void* p_ = nullptr;
  DType t_ = DType::F32;
};

}  // namespace wiola
