// Setup errors that every rank meets (a bad config, a layout that does not
// fit, a missing data file) are reported once, not once per rank: each rank
// runs the setup, then all agree (one collective) before any work starts.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "dist/comm.h"

namespace wiola::dist {

// Thrown on every rank after a failed agreement; the message was already
// printed by the lowest failing rank. The caller exits non-zero quietly.
class SetupFailed : public std::runtime_error {
 public:
  SetupFailed() : std::runtime_error("setup failed (reported by the failing rank)") {}
};

// Runs `setup` (no collectives inside) and agrees over `world`: if any rank
// threw, the lowest such rank prints "PREFIX: error: MESSAGE" to stderr and
// every rank throws SetupFailed. With one rank the error propagates as is.
void agree_on_setup(Comm& world, const std::string& prefix, const std::function<void()>& setup);

}  // namespace wiola::dist
