// One error type for the whole project: a message that names what failed and
// where (file, key, rank...). Entry points catch it, print it once, exit != 0.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace wiola {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// throw wiola::Error built from the streamed arguments.
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

}  // namespace wiola

// Check a condition that depends on input (config, files, shapes): throws
// wiola::Error with the message. Not for internal invariants.
#define WIOLA_CHECK(cond, ...)                 \
  do {                                         \
    if (!(cond)) ::wiola::fail(__VA_ARGS__);   \
  } while (0)
