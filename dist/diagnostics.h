// Process-wide diagnostics for the distributed layer: the communication
// timeout, a context string the trainer keeps current ("stage 1 step 42 fwd
// microbatch 3"), and abort_job, which ends every rank of the job.
#pragma once

#include <mutex>
#include <string>
#include <utility>

namespace wiola::dist {

class Diagnostics {
 public:
  static Diagnostics& instance();

  // Longest wait of any collective or point-to-point wait, in seconds.
  // Default 300; wiola train sets the run config's parallel.comm_timeout_s.
  double timeout_s() const { return timeout_s_; }
  void set_timeout_s(double s) { timeout_s_ = s; }

  // What this rank is doing now; printed with every timeout or abort, and
  // published to the rank state board when one is open (dist/rank_states.h).
  // Thread-safe: the NCCL watchdog reads it beside the trainer's thread, and
  // the schedule runner's tests run every stage's runner in one process.
  std::string context() const;
  void set_context(std::string c);

 private:
  Diagnostics();
  double timeout_s_ = 300.0;
  mutable std::mutex mu_;  // guards context_
  std::string context_;
};

// Shorthands.
inline void set_context(std::string c) { Diagnostics::instance().set_context(std::move(c)); }
inline void set_comm_timeout(double seconds) { Diagnostics::instance().set_timeout_s(seconds); }

// Prints "rank R: msg" (R = world rank; plus the context when set) to stderr,
// then every rank's last published state when a rank state board is open
// (dist/rank_states.h), and ends every rank of the job with exit status
// `code` (MPI_Abort on the world). Without MPI initialised: prints and exits
// the process.
[[noreturn]] void abort_job(const std::string& msg, int code = 1);

// World rank of this process (0 when MPI is not initialised).
int world_rank();

}  // namespace wiola::dist
