// What every fuzz target demands of an input: it is accepted, or it is
// refused with a wiola::Error (the one clear message naming file and field
// that a user sees). Anything else is a finding and aborts, so libFuzzer and
// the corpus replay in ctest both report it: another exception type (the CLI
// would print "internal error"), a crash or sanitizer report, a broken
// round trip, an input that is accepted but then misbehaves.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "util/error.h"

namespace wiola::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_EXPECT(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) ::wiola::fuzz::finding(::wiola::detail::concat(#cond, ": ", __VA_ARGS__)); \
  } while (0)

// Runs f; a wiola::Error is a proper refusal, any other exception a finding.
// Returns whether the input was accepted.
template <class F>
bool accept_or_refuse(F&& f) {
  try {
    f();
    return true;
  } catch (const wiola::Error&) {
    return false;
  } catch (const std::exception& e) {
    finding(std::string("refused with an exception that is not a wiola::Error: ") + e.what());
  }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A private folder for the targets that read files: made once per process,
// removed at exit (left behind only when a finding aborts).
class Scratch {
 public:
  static const std::filesystem::path& dir() {
    static Scratch s;
    return s.dir_;
  }
  // Writes bytes to dir()/name and returns the path. Called once per input,
  // it also checks that the inputs before left no file descriptor open (a
  // reader that throws must still close its file).
  static std::string write(const std::string& name, std::string_view bytes) {
    if (const size_t fds = open_fds(); fds > 0)
      finding(std::to_string(fds) + " file descriptor(s) on scratch files left open by earlier inputs");
    const std::filesystem::path p = dir() / name;
    std::filesystem::create_directories(p.parent_path());
    std::FILE* f = std::fopen(p.c_str(), "wb");
    if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
      finding("cannot write the scratch file " + p.string());
    return p.string();
  }

 private:
  // Descriptors open on files of the scratch folder (libFuzzer's own come
  // and go: its memory watchdog reads /proc now and then).
  static size_t open_fds() {
    size_t n = 0;
    std::error_code ec;
    const std::string ours = dir().string();
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
      if (!ec && target.rfind(ours, 0) == 0) ++n;
    }
    return n;
  }
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/wiola-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) finding("cannot make a scratch folder from " + tmpl);
    dir_ = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::filesystem::path dir_;
};

}  // namespace wiola::fuzz
