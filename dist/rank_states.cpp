// The rank state board (dist/rank_states.h): one small text file per rank,
// rewritten in place with one pwrite per change, read back by a rank that
// times out.
#include "dist/rank_states.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "dist/comm.h"

namespace wiola::dist {
namespace {

// A record is rewritten whole, padded to this size, so a shorter state never
// leaves the tail of a longer one behind.
constexpr size_t kRecordBytes = 1024;

double wall_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string rank_file(const std::string& dir, int rank) { return dir + "/rank-" + std::to_string(rank) + ".txt"; }

std::string job_hex(uint64_t job) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)job);
  return buf;
}

// What a signal handler may touch (note_rank_signal): the board's file and
// the signal, outside the mutex. The end of a record holds the process's
// end: "signal N" (a signal asked it to stop) or "ended" (it left the board
// in order), written in the record's padding, so the launcher's post-mortem
// (launch/mpirun.sh) tells ranks that were stopped from ranks that vanished.
volatile std::sig_atomic_t g_board_fd = -1;
volatile std::sig_atomic_t g_signal = 0;
constexpr size_t kEndAt = kRecordBytes - 16;

void write_end(const char* text, size_t n) {
  const int fd = g_board_fd;
  if (fd < 0) return;
  ssize_t w = ::pwrite(fd, text, n, kEndAt);
  (void)w;
}

// The process's board: what this rank last published (guarded by mu).
struct BoardState {
  std::mutex mu;
  bool open = false;
  uint64_t generation = 0;  // of the board that owns the file
  int fd = -1, rank = 0, size = 1;
  std::string dir, job, host;
  std::string context, wait;
  double wait_since = 0;

  // Rewrites this rank's record (mu held).
  void write_locked() {
    if (fd < 0) return;
    char rec[kRecordBytes];
    const int n = std::snprintf(rec, sizeof rec,
                                "wiola rank state v1\njob %s\nrank %d of %d\nhost %s\npid %ld\nupdated %.3f\n"
                                "context %s\nwait %s\nwait_since %.3f\n",
                                job.c_str(), rank, size, host.c_str(), long(getpid()), wall_now(),
                                context.empty() ? "-" : context.c_str(), wait.empty() ? "-" : wait.c_str(), wait_since);
    const size_t used = n < 0 ? 0 : std::min(size_t(n), sizeof rec - 1);
    std::memset(rec + used, '\n', sizeof rec - used);  // padding: empty lines
    if (const int sig = g_signal; sig > 0 && used < kEndAt) {
      const int m = std::snprintf(rec + kEndAt, sizeof rec - kEndAt, "signal %d\n", sig % 100);
      if (m > 0) rec[kEndAt + size_t(m)] = '\n';  // no NUL in the file
    }
    // Best effort: a diagnostic must never stop the run.
    ssize_t w = ::pwrite(fd, rec, sizeof rec, 0);
    (void)w;
  }
};

BoardState& board() {
  static BoardState b;
  return b;
}

// One parsed record.
struct Record {
  std::string job, host, context, wait;
  long pid = 0;
  double updated = 0, wait_since = 0;
  std::string end;  // "signal N", "ended" or "" (the process vanished, or runs on)
  bool ok = false;
};

Record read_record(const std::string& path, std::string& error) {
  Record r;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    error = std::strerror(errno);
    return r;
  }
  char buf[kRecordBytes + 1];
  const ssize_t n = ::pread(fd, buf, kRecordBytes, 0);
  ::close(fd);
  if (n <= 0) {
    error = "empty";
    return r;
  }
  buf[n] = '\0';
  std::string text(buf);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) continue;
    const std::string key = line.substr(0, sp), val = line.substr(sp + 1);
    if (key == "job") r.job = val;
    else if (key == "host") r.host = val;
    else if (key == "pid") r.pid = std::atol(val.c_str());
    else if (key == "updated") r.updated = std::atof(val.c_str());
    else if (key == "context") r.context = val;
    else if (key == "wait") r.wait = val == "-" ? "" : val;
    else if (key == "wait_since") r.wait_since = std::atof(val.c_str());
    else if (key == "signal") r.end = line;
  }
  if (r.end.empty() && text.find("\nended\n") != std::string::npos) r.end = "ended";
  r.ok = !r.job.empty();
  if (!r.ok) error = "not a rank state record";
  return r;
}

}  // namespace

RankStateBoard::RankStateBoard(const std::string& dir, int rank, int size, uint64_t job) : dir_(dir) {
  BoardState& b = board();
  std::lock_guard<std::mutex> l(b.mu);
  if (b.fd >= 0) ::close(b.fd);  // a newer board replaces an older one
  generation_ = ++b.generation;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = rank_file(dir, rank);
  b.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (b.fd < 0)  // diagnostics only: the run goes on without its file
    std::fprintf(stderr,
                 "wiola: warning: cannot write the rank state file '%s' (%s); a timeout will not show "
                 "this rank's state\n",
                 path.c_str(), std::strerror(errno));
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "?");
  b.open = true;
  b.rank = rank;
  b.size = size;
  b.dir = dir;
  b.job = job_hex(job);
  b.host = host;
  b.context.clear();
  b.wait.clear();
  b.wait_since = 0;
  b.write_locked();
  g_board_fd = b.fd;
}

RankStateBoard::~RankStateBoard() {
  BoardState& b = board();
  std::lock_guard<std::mutex> l(b.mu);
  if (b.generation != generation_) return;  // replaced by a newer board
  if (g_signal == 0) write_end("ended\n", 6);
  g_board_fd = -1;
  if (b.fd >= 0) ::close(b.fd);
  b.fd = -1;
  b.open = false;
}

std::unique_ptr<RankStateBoard> RankStateBoard::open(Comm& world, const std::string& dir) {
  int64_t job = 0;
  if (world.rank() == 0) {
    const auto ns = std::chrono::system_clock::now().time_since_epoch().count();
    job = int64_t(uint64_t(ns) ^ (uint64_t(getpid()) << 40));
  }
  if (world.size() > 1) world.broadcast(&job, 1, 0);
  return std::make_unique<RankStateBoard>(dir, world.rank(), world.size(), uint64_t(job));
}

void note_rank_signal(int sig) {
  g_signal = sig;
  char text[16] = "signal ";
  size_t n = 7;
  if (sig >= 10) text[n++] = char('0' + sig / 10 % 10);
  text[n++] = char('0' + sig % 10);
  text[n++] = '\n';
  write_end(text, n);
}

void publish_rank_context(const std::string& context) {
  BoardState& b = board();
  std::lock_guard<std::mutex> l(b.mu);
  if (!b.open) return;
  b.context = context;
  b.write_locked();
}

void publish_rank_wait(const std::string& what, double waited_s) {
  BoardState& b = board();
  std::lock_guard<std::mutex> l(b.mu);
  if (!b.open) return;
  b.wait = what;
  b.wait_since = wall_now() - waited_s;
  b.write_locked();
}

void publish_rank_wait_done() {
  BoardState& b = board();
  std::lock_guard<std::mutex> l(b.mu);
  if (!b.open || b.wait.empty()) return;
  b.wait.clear();
  b.wait_since = 0;
  b.write_locked();
}

double rank_wait_publish_after_s(double timeout_s) { return std::min(1.0, 0.25 * timeout_s); }

std::string rank_states_report() {
  std::string dir, job;
  int size = 1;
  {
    BoardState& b = board();
    std::lock_guard<std::mutex> l(b.mu);
    if (!b.open || b.size < 2) return "";
    dir = b.dir;
    job = b.job;
    size = b.size;
  }
  const double now = wall_now();
  char line[1536];
  std::string out = "wiola: last published state of every rank (" + dir +
                    "; phases as they change, a wait once "
                    "it has lasted a while):\n";
  for (int r = 0; r < size; ++r) {
    std::string error;
    const std::string path = rank_file(dir, r);
    const Record rec = read_record(path, error);
    if (!rec.ok) {
      std::snprintf(line, sizeof line,
                    "  rank %d: no state (%s: %s; the rank never got this far, or its node "
                    "does not share this folder)\n",
                    r, path.c_str(), error.c_str());
    } else if (rec.job != job) {
      std::snprintf(line, sizeof line,
                    "  rank %d: no state from this job (%s is an earlier job's, last updated "
                    "%.0f s ago: the rank has not started, or its node does not share this folder)\n",
                    r, path.c_str(), now - rec.updated);
    } else {
      char since[48];
      std::snprintf(since, sizeof since, "blocked for %.1f s in ", now - rec.wait_since);
      const std::string doing = rec.wait.empty()
                                    ? std::string("not blocked in a communication wait (computing, or in a short wait)")
                                    : since + rec.wait;
      std::snprintf(line, sizeof line, "  rank %d (%s, pid %ld): %s; %s; published %.1f s ago\n", r, rec.host.c_str(),
                    rec.pid, rec.context == "-" ? "(no context yet)" : rec.context.c_str(), doing.c_str(),
                    now - rec.updated);
    }
    out += line;
  }
  return out;
}

}  // namespace wiola::dist
