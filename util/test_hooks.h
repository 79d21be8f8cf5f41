// Test hooks: the environment variables that tests and drills set to make a
// production path fail, stall, slow down, take another layout or show what it
// did (docs/testing.md, "Test hooks"). Never set in production. Each is
// declared once, in kTestHooks (util/test_hooks.cpp: name, format, effect,
// reader), and read through TestHook, which splits its value into the
// colon-separated fields of its format and names the hook, its value and its
// format in every error. The ctest arch.env_vars holds docs/testing.md's
// tables to this list and to every variable the code reads.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace wiola {

enum class Hook {
  Fault,                // train/trainer.cpp
  CkptFailAt,           // ckpt/format.cpp
  SlowRank,             // train/stragglers.cpp
  InjectLossSpike,      // train/spike_policy.cpp
  PrepKillAfterShards,  // launch/cmd_prep.cpp
  ParamAlign,           // launch/cmd_train.cpp
  TraceSchedule,        // launch/cmd_train.cpp
  Blas,                 // kernels/cpu/blas.cpp
  EmuOrder,             // tools/cuda_emu/emu.cpp
  EmuDevices,           // tools/cuda_emu/emu.cpp
  EmuLtWrongAlgo,       // tools/cuda_emu/cublaslt_emu.cpp
};

struct TestHookSpec {
  Hook hook;
  const char* env;     // WIOLA_FAULT
  const char* format;  // KIND:RANK:STEP
  const char* effect;  // one sentence
  const char* reader;  // the file that reads it
};
// Every hook, in the order of Hook.
const std::vector<TestHookSpec>& test_hooks();
const TestHookSpec& test_hook_spec(Hook hook);

// One hook's value as the environment has it now. Unset and empty are the
// same: off.
class TestHook {
 public:
  explicit TestHook(Hook hook);
  bool set() const { return !value_.empty(); }
  const std::string& value() const { return value_; }

  // The colon-separated fields; an error unless there are lo..hi of them.
  size_t fields(size_t lo, size_t hi) const;
  const std::string& field(size_t i) const;
  // Field i (or `text`, a part of one) as a whole number in [lo, hi].
  int64_t integer(size_t i, int64_t lo, int64_t hi = INT64_MAX) const;
  int64_t integer_text(const std::string& text, int64_t lo, int64_t hi = INT64_MAX) const;
  // Field i as a number >= lo.
  double number(size_t i, double lo) const;
  // Field i, one of `allowed`.
  const std::string& word(size_t i, std::initializer_list<const char*> allowed) const;
  const std::string& word(size_t i, const std::vector<std::string>& allowed) const;
  // wiola::Error "WIOLA_X='value': why (expected FORMAT)".
  [[noreturn]] void bad(const std::string& why) const;

 private:
  const TestHookSpec& spec_;
  std::string value_;
  std::vector<std::string> fields_;
};

}  // namespace wiola
