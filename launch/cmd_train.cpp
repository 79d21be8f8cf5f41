// wiola train --config FILE [--set section.key=value ...] [--dump-step N:PATH ...]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "dist/agree.h"
#include "dist/mpi_comm.h"
#include "kernels/backend.h"
#include "dist/rank_states.h"
#include "kernels/ops.h"
#include "launch/cli.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/test_hooks.h"

namespace {

// Preemption (docs/launch.md): SIGUSR1 (Slurm's --signal=B:USR1@T, forwarded
// by mpirun) and SIGTERM (best effort: mpirun escalates to SIGKILL) ask the
// run to stop at a checkpoint. The flag is the only state a handler may
// touch; the trainer polls it once per step and all ranks agree.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  wiola::dist::note_rank_signal(sig);
}

// Without checkpoints SIGTERM and SIGINT end the run as usual, after the
// rank's state file has noted the signal (the post-mortem of a failed job
// tells ranks the launcher stopped from ranks that vanished).
extern "C" void on_end_signal(int sig) {
  wiola::dist::note_rank_signal(sig);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void note_end_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_end_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void take_over_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// A test hook: WIOLA_PARAM_ALIGN=N lays the parameters out on multiples of N
// elements instead of wiola::kParamAlign (1: the packed layout of checkpoints
// written before tensors were aligned; tests/dist/equivalence.sh).
size_t param_align_from_env() {
  const wiola::TestHook h(wiola::Hook::ParamAlign);
  if (!h.set()) return wiola::kParamAlign;
  h.fields(1, 1);
  return size_t(h.integer(0, 1, 1 << 20));
}

// A test hook: WIOLA_TRACE_SCHEDULE=1 has every rank write the pipeline
// actions it executed (TrainOptions::trace_schedule; tests/dist/schedule_order.sh).
bool trace_schedule_from_env() {
  const wiola::TestHook h(wiola::Hook::TraceSchedule);
  if (!h.set()) return false;
  h.fields(1, 1);
  return h.word(0, {"0", "1"}) == "1";
}

}  // namespace

int wiola_cmd_train(int argc, char** argv) {
  CLI::App app{"Train a Wiola model from a TOML run config (docs/config.md)", "wiola train"};
  std::string config;
  std::vector<std::string> sets, dump_specs;
  bool quiet = false;
  app.add_option("-c,--config", config, "TOML run config ([model] [train] [data] [parallel] [checkpoint])");
  app.add_option("--set", sets, "override one key: section.key=value (repeatable)");
  app.add_option("--dump-step", dump_specs,
                 "N:PATH write the numerics of step N to HDF5 (docs/model.md §7; repeatable)");
  app.add_flag("-q,--quiet", quiet, "no per-step progress lines");
  bool print_schema = false;  // hidden: docs/config.md's key tables come from it (scripts/config_docs.py)
  app.add_flag("--print-config-schema", print_schema, "print every config key as JSON and exit")->group("");
  if (const int rc = wiola::cli::parse(app, argc, argv, "train"); rc >= 0) return rc;
  if (print_schema) {
    nlohmann::json keys = nlohmann::json::array();
    for (const wiola::ConfigKeyDoc& k : wiola::run_config_schema())
      keys.push_back({{"section", k.section},
                      {"key", k.key},
                      {"type", k.type},
                      {"default", k.default_value},
                      {"values", k.values},
                      {"doc", k.doc}});
    std::printf("%s\n", keys.dump(1).c_str());
    return 0;
  }
  wiola::TrainOptions opt;
  opt.quiet = quiet;
  opt.param_align = param_align_from_env();
  opt.trace_schedule = trace_schedule_from_env();
  for (const std::string& s : dump_specs) {
    const auto colon = s.find(':');
    WIOLA_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < s.size(), "--dump-step '", s,
                "': expected N:PATH");
    int64_t step = 0;
    try {
      size_t used = 0;
      step = std::stoll(s.substr(0, colon), &used);
      WIOLA_CHECK(used == colon, "");
    } catch (...) {
      wiola::fail("--dump-step '", s, "': '", s.substr(0, colon), "' is not a step number");
    }
    opt.dumps.emplace_back(step, s.substr(colon + 1));
  }
  // Under mpirun or srun every rank runs this; alone, MPI starts as a
  // singleton (world of 1) and errors propagate to main's handler. With
  // several ranks, a setup error is reported once by the failing rank
  // (agree_on_setup), and a later error on any rank ends the whole job with
  // that rank's message (no rank is left waiting).
  wiola::dist::MpiRuntime mpi(&argc, &argv);
  auto world = wiola::dist::mpi_world_comm();
  auto body = [&] {
    wiola::RunConfig rc;
    wiola::dist::agree_on_setup(*world, "wiola train", [&] { rc = wiola::load_run_config(config, sets); });
    if (world->rank() != 0) opt.quiet = true;
    // The backend is start-up configuration: chosen here, used by everything.
    wiola::set_cpu_threads(rc.train.threads);
    auto ops = wiola::make_backend<float>(std::string(to_string(rc.train.backend)), rc.train.backend_options);
    if (!rc.checkpoint.dir.empty()) {
      take_over_stop_signals();
      opt.stop_requested = [] { return g_stop_signal != 0; };
    } else {
      note_end_signals();
    }
    const wiola::TrainSummary sum = wiola::run_training(rc, opt, *ops, *world);
    return sum.stopped ? wiola::kExitPreempted : 0;
  };
  if (world->size() == 1) return body();
  return wiola::dist::run_or_abort([&] {
    try {
      return body();
    } catch (const wiola::dist::SetupFailed&) {
      return 1;  // already reported once, by the failing rank
    }
  });
}
