#include "util/env.h"

#include <cstdlib>

namespace wiola {

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

std::string env_text(const char* name) { return env_value(name).value_or(""); }

bool env_flag(const char* name) {
  const std::string v = env_text(name);
  return !v.empty() && v != "0";
}

int env_first_int(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const std::optional<std::string> v = env_value(name)) return std::atoi(v->c_str());
  return -1;
}

}  // namespace wiola
