// Every rank's last known state, readable by a rank that times out without
// asking anyone (docs/distributed.md, "What the other ranks were doing").
// A rank that is stuck (computing, sleeping, blocked elsewhere) cannot answer
// a message, so each rank publishes its state as a small text file,
// DIR/rank-<R>.txt, rewritten in place (one pwrite) when its context changes
// (dist::set_context: the trainer's phase and step) and when one of its
// communication waits has lasted a while (which operation it is blocked in).
// The timeout diagnostic reads every rank's file. The files are plain text,
// so `cat RUN/ranks/*` on a hung job shows the same. No MPI here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace wiola::dist {

class Comm;

class RankStateBoard {
 public:
  // Opens this rank's file in `dir` (created) and installs the board as the
  // process's; `job` tags the files of this job (a file from an earlier job
  // in the same folder is reported as such). One board at a time: a newer
  // one replaces the older.
  RankStateBoard(const std::string& dir, int rank, int size, uint64_t job);
  ~RankStateBoard();  // uninstalls; the file stays (the last state of the run)
  RankStateBoard(const RankStateBoard&) = delete;
  RankStateBoard& operator=(const RankStateBoard&) = delete;

  // Collective over `world`: rank 0 draws the job tag and broadcasts it;
  // every rank opens its file in `dir`.
  static std::unique_ptr<RankStateBoard> open(Comm& world, const std::string& dir);

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  uint64_t generation_ = 0;
};

// From a signal handler (async-signal-safe): a signal asked this process to
// stop; its record says so from now on ("signal N" in the record's last
// line), so a post-mortem tells ranks that were stopped from ranks that
// vanished (killed, or their node lost). A board closed in order ends its
// record with "ended" instead.
void note_rank_signal(int sig);

// Called by Diagnostics::set_context: the new context is this rank's phase.
void publish_rank_context(const std::string& context);
// A communication wait that has lasted `waited_s` so far (published once per
// wait, by the wait itself, after a threshold: short waits cost nothing):
// "all_reduce on group 'tp' (rank 1 of 2), count 5 float32".
void publish_rank_wait(const std::string& what, double waited_s);
// The wait published by publish_rank_wait has ended.
void publish_rank_wait_done();
// How long a wait lasts before it is published: min(1 s, timeout / 4).
double rank_wait_publish_after_s(double timeout_s);

// Every rank's last published state, one line each, for a diagnostic (""
// without a board, or in a job of one rank). Reads the files only, so any
// thread may call it.
std::string rank_states_report();

}  // namespace wiola::dist
