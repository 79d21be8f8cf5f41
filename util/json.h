// Integers from JSON that a user or a file supplied. nlohmann's get<T>()
// converts any number: 1.5 becomes 1, 2^40 wraps in a uint32_t, and 1e300
// is undefined behaviour. These take only integers that fit T and otherwise
// throw wiola::Error naming `what` (callers put the file and field in it).
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "util/error.h"

namespace wiola {

template <std::integral T>
T json_int(const nlohmann::json& v, const std::string& what) {
  if (v.is_number_unsigned()) {
    if (const uint64_t u = v.get<uint64_t>(); std::in_range<T>(u)) return T(u);
  } else if (v.is_number_integer()) {
    if (const int64_t i = v.get<int64_t>(); std::in_range<T>(i)) return T(i);
  }
  std::string shown = v.dump();
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  fail(what, " is ", shown, ", not an integer from ", +std::numeric_limits<T>::min(), " to ",
       +std::numeric_limits<T>::max());
}

template <std::integral T>
std::vector<T> json_ints(const nlohmann::json& v, const std::string& what) {
  WIOLA_CHECK(v.is_array(), what, " is not an array of integers");
  std::vector<T> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) out.push_back(json_int<T>(v[i], what + "[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace wiola
