// The message of the wiola::Error a call throws, for tests that check what an
// error says; a test failure (and "") when it throws none.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "util/error.h"

namespace wiola::test {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected wiola::Error";
  return "";
}

}  // namespace wiola::test
