// The test hooks, declared once (util/test_hooks.h, docs/testing.md "Test hooks").
#include "util/test_hooks.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "util/env.h"
#include "util/error.h"

namespace wiola {

const std::vector<TestHookSpec>& test_hooks() {
  static const std::vector<TestHookSpec> hooks = {
      {Hook::Fault, "WIOLA_FAULT", "KIND:RANK:STEP",
       "world rank RANK throws (KIND fail) or stops answering (KIND stall) at the start of step STEP",
       "train/trainer.cpp"},
      {Hook::CkptFailAt, "WIOLA_CKPT_FAIL_AT", "STAGE[:STEP[-][:RANK]]",
       "a checkpoint save fails with ENOSPC at STAGE (a save stage of ckpt/format.cpp) of the save at step STEP "
       "(from STEP on with -; every save without STEP), on world rank RANK (every rank without it)",
       "ckpt/format.cpp"},
      {Hook::SlowRank, "WIOLA_SLOW_RANK", "RANK:MS", "world rank RANK sleeps MS milliseconds in every step",
       "train/stragglers.cpp"},
      {Hook::InjectLossSpike, "WIOLA_INJECT_LOSS_SPIKE", "STEP",
       "with the loss-spike policy on, step STEP's loss counts as a spike", "train/spike_policy.cpp"},
      {Hook::PrepKillAfterShards, "WIOLA_PREP_TEST_KILL_AFTER_SHARDS", "N",
       "wiola prep kills itself (SIGKILL) after writing N shards", "launch/cmd_prep.cpp"},
      {Hook::ParamAlign, "WIOLA_PARAM_ALIGN", "N",
       "wiola train lays parameters out on multiples of N elements instead of 128 (1: the packed layout of "
       "checkpoints written before tensors were aligned)",
       "launch/cmd_train.cpp"},
      {Hook::TraceSchedule, "WIOLA_TRACE_SCHEDULE", "0|1",
       "1: every rank of wiola train writes the pipeline actions it executed", "launch/cmd_train.cpp"},
      {Hook::Blas, "WIOLA_TEST_BLAS", "MODE:CORE[@VERSION]",
       "OpenBLAS runs its CORE kernels as if it had chosen them (MODE library: wiola's selection follows) or as "
       "if OPENBLAS_CORETYPE=CORE had (MODE forced: kept); @VERSION judges the cores as that release's. "
       "Overrides OPENBLAS_CORETYPE",
       "kernels/cpu/blas.cpp"},
      {Hook::EmuOrder, "WIOLA_EMU_ORDER", "forward|reverse",
       "reverse: the CUDA emulator runs the warps of a block and the lanes of a warp last to first",
       "tools/cuda_emu/emu.cpp"},
      {Hook::EmuDevices, "WIOLA_EMU_DEVICES", "N", "the CUDA emulator shows N devices (1 without it)",
       "tools/cuda_emu/emu.cpp"},
      {Hook::EmuLtWrongAlgo, "WIOLA_EMU_LT_WRONG_ALGO", "ALGO",
       "the emulated cuBLASLt's algorithm ALGO scales alpha by 1.01 (a wrong candidate the GEMM tuning must "
       "refuse)",
       "tools/cuda_emu/cublaslt_emu.cpp"},
  };
  return hooks;
}

const TestHookSpec& test_hook_spec(Hook hook) {
  for (const TestHookSpec& s : test_hooks())
    if (s.hook == hook) return s;
  fail("test hook ", int(hook), " is not in util/test_hooks.cpp's table");
}

TestHook::TestHook(Hook hook) : spec_(test_hook_spec(hook)) {
  value_ = env_text(spec_.env);
  std::stringstream ss(value_);
  for (std::string f; std::getline(ss, f, ':');) fields_.push_back(f);
  if (!value_.empty() && value_.back() == ':') fields_.emplace_back();
}

void TestHook::bad(const std::string& why) const {
  fail(spec_.env, "='", value_, "': ", why, " (expected ", spec_.format, ")");
}

size_t TestHook::fields(size_t lo, size_t hi) const {
  if (fields_.size() < lo || fields_.size() > hi)
    bad(std::to_string(fields_.size()) + " field" + (fields_.size() == 1 ? "" : "s") + " separated by ':'");
  return fields_.size();
}

const std::string& TestHook::field(size_t i) const {
  if (i >= fields_.size()) bad("no field " + std::to_string(i + 1));
  return fields_[i];
}

int64_t TestHook::integer_text(const std::string& text, int64_t lo, int64_t hi) const {
  char* end = nullptr;
  errno = 0;
  const long long v = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != 0 || errno == ERANGE) bad("'" + text + "' is not a whole number");
  if (v < lo || v > hi)
    bad("'" + text + "' is out of range (" + std::to_string(lo) +
        (hi == INT64_MAX ? " or more" : " to " + std::to_string(hi)) + ")");
  return v;
}

int64_t TestHook::integer(size_t i, int64_t lo, int64_t hi) const { return integer_text(field(i), lo, hi); }

double TestHook::number(size_t i, double lo) const {
  const std::string& text = field(i);
  char* end = nullptr;
  const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != 0 || !(v >= lo)) bad("'" + text + "' is not a number >= " + std::to_string(lo));
  return v;
}

const std::string& TestHook::word(size_t i, const std::vector<std::string>& allowed) const {
  const std::string& w = field(i);
  std::string list;
  for (const std::string& a : allowed) {
    if (w == a) return w;
    list += (list.empty() ? "" : ", ") + a;
  }
  bad("'" + w + "' is not one of " + list);
}

const std::string& TestHook::word(size_t i, std::initializer_list<const char*> allowed) const {
  return word(i, std::vector<std::string>(allowed.begin(), allowed.end()));
}

}  // namespace wiola
