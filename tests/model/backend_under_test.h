// The backend the model tests run on: WIOLA_TEST_BACKEND names it ("cpu" by
// default; ctest also runs the suite on "cpu-opaque", where any host access
// to a backend buffer crashes). Tests reach backend memory only through
// these helpers (upload/download), never by dereferencing.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"

namespace wiola {

template <class T>
std::unique_ptr<Ops<T>> test_backend() {
  const char* b = std::getenv("WIOLA_TEST_BACKEND");
  return make_backend<T>(b && *b ? b : "cpu");
}

template <class T>
std::vector<T> download_vec(Ops<T>& ops, const T* p, size_t n) {
  std::vector<T> h(n);
  ops.download(h.data(), p, n * sizeof(T));
  return h;
}

template <class T>
void set_element(Ops<T>& ops, T* p, size_t i, T v) {
  ops.upload(p + i, &v, sizeof(T));
}

}  // namespace wiola
