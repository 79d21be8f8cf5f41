#include "dist/agree.h"

#include <cstdio>
#include <exception>

namespace wiola::dist {

void agree_on_setup(Comm& world, const std::string& prefix, const std::function<void()>& setup) {
  if (world.size() == 1) {
    setup();
    return;
  }
  std::string err;
  try {
    setup();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  // Max of (size - rank) over failing ranks names the lowest failing rank.
  const int mine = err.empty() ? 0 : world.size() - world.rank();
  const int top = world.all_reduce_value(mine, ReduceOp::Max);
  if (top == 0) return;
  if (world.size() - top == world.rank()) {
    std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), err.c_str());
    std::fflush(stderr);
  }
  throw SetupFailed();
}

}  // namespace wiola::dist
