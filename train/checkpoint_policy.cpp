#include "train/checkpoint_policy.h"

#include <cstdio>
#include <utility>

#include "data/sha256.h"
#include "data/text_input.h"
#include "dist/agree.h"
#include "dist/diagnostics.h"
#include "kernels/cpu_info.h"
#include "kernels/backend.h"
#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/rank_optimizer.h"
#include "train/run_settings.h"
#include "train/stage_layers.h"
#include "train/train_data.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola {
namespace {
// A resume on other CPU kernels (SIMD target or BLAS kernels) than the
// checkpoint's computes other roundings: it continues within float rounding,
// not bit for bit (docs/cpu.md#determinism). Rank 0's view; informative.
void note_other_cpu_kernels(const ResumeState& st, const RunSettings& run) {
  if (!run.ops.device_name().empty() || !st.simd.is_string() || !st.blas.is_object() || !st.blas.contains("kernels") ||
      !st.blas["kernels"].is_string())
    return;
  const std::string simd = st.simd.get<std::string>(), kernels = st.blas["kernels"].get<std::string>();
  const std::string now_simd = cpu_simd_target(), now_kernels = cpu_blas().kernels;
  if (simd == now_simd && kernels == now_kernels) return;
  std::printf(
      "wiola train: note: the checkpoint was computed on SIMD %s and OpenBLAS's %s kernels, this run computes "
      "on %s and %s: it continues within float rounding, not bit for bit (docs/cpu.md#determinism)\n",
      simd.c_str(), kernels.c_str(), now_simd.c_str(), now_kernels.c_str());
}

nlohmann::json blend_json(const std::vector<BlendSource>& blend) {
  nlohmann::json j = nlohmann::json::array();
  for (const BlendSource& b : blend) j.push_back({{"path", b.path}, {"weight", b.weight}});
  return j;
}

nlohmann::json stages_json(const std::vector<DataStage>& stages) {
  nlohmann::json j = nlohmann::json::array();
  for (const DataStage& s : stages) j.push_back({{"from", s.from}, {"weights", s.weights}});
  return j;
}

// The data stages that began by step `step` (a resume may change only later ones).
nlohmann::json stages_until(const nlohmann::json& stages, int64_t step) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : stages)
    if (s.at("from").get<int64_t>() <= step) j.push_back(s);
  return j;
}

// What a manifest records about the run besides its identity (informative,
// but for "schedule" and "data_stages": check_lr_schedule, check_data_stages).
nlohmann::json checkpoint_info(const RunSettings& run, const StageLayers& layers, bool zero) {
  const RunConfig& rc = run.rc;
  const auto& par = rc.parallel;
  nlohmann::json st = nlohmann::json::array();  // the global chunks' layers (one per stage: the stages')
  for (const auto& [a, b] : layers.chunk_cuts) st.push_back({a, b});
  const auto pr = run.ops.precision();
  return {{"config", run_config_to_toml(rc)},
          {"layout",
           {{"tp", par.tp},
            {"pp", par.pp},
            {"dp", par.dp},
            {"zero", zero},
            {"stages", st},
            {"chunks_per_rank", layers.v},
            {"chunk_placement", layers.placement == dist::ChunkPlacement::V ? "v" : "interleaved"}}},
          {"backend", run.ops.name()},
          {"backend_options", backend_option_fields(rc.train.backend_options)},
          {"precision",
           {{"activations", dist::dtype_name(pr.act)},
            {"residual", dist::dtype_name(pr.residual)},
            {"weights", dist::dtype_name(pr.weight)}}},
          {"threads_per_rank", cpu_threads()},
          {"simd", cpu_simd_target()},  // the kernels' run-time target on this rank
          {"cpu", host_cpu_model()},
          {"blas", run.ops.device_name().empty() ? cpu_blas_json() : nlohmann::json()},  // the CPU backend's kernels
          {"schedule", run.budget.lr.to_json()},
          {"data_path", rc.data.path},
          {"data_blend", blend_json(rc.data.blend)},
          {"data_stages", stages_json(rc.data.stages)}};
}

}  // namespace

namespace {

using Clock = std::chrono::steady_clock;
using dist::ReduceOp;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

CheckpointPolicy::CheckpointPolicy(const RunSettings& run, const TrainData& data, RankComms& comms, RankModel& model,
                                   RankOptimizer& optimizer, const StageLayers& layers)
    : run_(run), data_(data), comms_(comms), model_(model), optimizer_(optimizer), layers_(layers) {}

CheckpointPolicy::~CheckpointPolicy() = default;

void CheckpointPolicy::check_setup(const RunConfig& rc, int world_rank) {
  if (!rc.checkpoint.dir.empty() && world_rank == 0) {
    Checkpointer::prepare_dir(rc.checkpoint.dir);
    // A fresh run beside another run's checkpoints would mix the two (a
    // later resume takes the newest step, whichever run wrote it).
    const auto there = ckpt::list_checkpoints(rc.checkpoint.dir, true);
    WIOLA_CHECK(rc.checkpoint.resume || there.empty(), "checkpoint.resume = false, but checkpoint.dir '",
                rc.checkpoint.dir, "' already holds checkpoints (", there.front(),
                "...); use an empty directory, or move them away");
  }
  if (!rc.checkpoint.init_from.empty()) (void)ckpt::resolve_checkpoint(rc.checkpoint.init_from);
}

// Resume from checkpoint.dir's newest sound checkpoint, or a weights-only
// start from checkpoint.init_from (a resume wins: a preempted fine-tuning
// run continues from its own checkpoints).
std::optional<ResumeState> CheckpointPolicy::setup() {
  const RunSettings& p = run_;
  const RunConfig& rc = p.rc;
  const auto& cc = rc.checkpoint;
  if (cc.dir.empty() && cc.init_from.empty()) return std::nullopt;
  dist::set_context("checkpoint setup");
  const TokenLoader& loader = *data_.loader;
  ckpt_ = std::make_unique<Checkpointer>(rc, *comms_.grid, p.ops, *model_.model, *optimizer_.adam,
                                         run_identity(rc, loader.info(), &loader),
                                         checkpoint_info(p, layers_, optimizer_.zero));
  std::string folder;
  if (!cc.dir.empty() && cc.resume) folder = ckpt_->find_resume();
  std::optional<ResumeState> resumed;
  if (!folder.empty()) {
    const ResumeState& st = resumed.emplace(ckpt_->resume(folder));
    resumed_from_ = st.step;
    resumed_gemm_ = st.gemm;
    check_lr_schedule(folder, st);
    check_data_stages(folder, st);
    if (p.root()) {
      std::printf("wiola train: resuming from %s (step %lld, %lld tokens, layout of this run: tp %d x pp %d x dp %d)\n",
                  folder.c_str(), (long long)st.step, (long long)st.tokens, rc.parallel.tp, rc.parallel.pp,
                  rc.parallel.dp);
      note_other_cpu_kernels(st, p);
    }
  } else if (!cc.init_from.empty()) {
    ckpt_->load_weights(cc.init_from);
    if (p.root())
      std::printf("wiola train: weights from %s (new optimizer state, data from the start)\n",
                  ckpt::resolve_checkpoint(cc.init_from).c_str());
  }
  if (cc.dir.empty()) ckpt_.reset();  // init_from only: nothing to save
  if (ckpt_ && p.root()) attach_tokenizer();
  std::fflush(stdout);
  return resumed;
}

// A WSD schedule may change on a resume (a longer stable phase, a decay
// branched off) as long as the rate at the checkpoint's step stays what it
// was. Every rank meets the same finding, rank 0 reports it.
void CheckpointPolicy::check_lr_schedule(const std::string& folder, const ResumeState& st) const {
  if (st.schedule.is_null()) return;
  const LrSchedule then = LrSchedule::from_json(st.schedule, folder + "/manifest.json: schedule");
  const std::string jump = lr_jump(then, run_.budget.lr, st.step);
  if (jump.empty()) return;
  if (!run_.root()) throw dist::SetupFailed();
  fail("cannot resume from '", folder, "': ", jump,
       ". A resume may extend a WSD run's stable phase or start its decay at or after the checkpoint's step, "
       "not change the rate it has reached (docs/model.md#wsd)");
}

// Data stages may change from the step after the checkpoint's on (an anneal
// branched off), not those that made its loader state.
void CheckpointPolicy::check_data_stages(const std::string& folder, const ResumeState& st) const {
  const nlohmann::json then =
      stages_until(st.data_stages.is_array() ? st.data_stages : nlohmann::json::array(), st.step);
  const nlohmann::json now = stages_until(stages_json(run_.rc.data.stages), st.step);
  if (then == now) return;
  if (!run_.root()) throw dist::SetupFailed();
  fail("cannot resume from '", folder, "': data.stages that began by its step ", st.step, " differ: ", then.dump(),
       " in the checkpoint, ", now.dump(), " in this run. A resume may change or add only stages from step ",
       st.step + 1, " on (docs/data.md#stages-other-shares-from-a-step-on)");
}

// The tokenizer the data was made with (the prep manifest names it, with its
// SHA-256) goes into every checkpoint. One that has moved or changed since
// prep is left out with a warning: the tools then ask for --tokenizer.
void CheckpointPolicy::attach_tokenizer() {
  const DatasetInfo& di = data_.loader->info();
  const auto skip = [&](const std::string& why) {
    std::fprintf(stderr,
                 "wiola train: warning: checkpoints will not carry the tokenizer (%s); "
                 "generate and export will need --tokenizer\n",
                 why.c_str());
  };
  if (di.tokenizer_file.empty()) return skip("the data source names no tokenizer file");
  std::string text;
  try {
    text = read_file(di.tokenizer_file);
  } catch (const Error& e) {
    return skip(e.what());
  }
  std::string sha = sha256_hex(text);
  if (sha != di.tokenizer_sha256)
    return skip(di.tokenizer_file + " changed since prep (sha256 " + sha.substr(0, 12) + "…, the data's " +
                di.tokenizer_sha256.substr(0, 12) + "…)");
  ckpt_->set_tokenizer(std::move(text), std::move(sha));
}

bool CheckpointPolicy::after_step(int64_t t, bool local_stop, const std::function<ResumeState()>& state) {
  const RunSettings& s = run_;
  if (!ckpt_) return false;  // stop signals are only taken over when checkpoints are on
  Checkpointer& ck = *ckpt_;
  dist::set_context("step " + std::to_string(t) + " checkpoint control");
  // One control all-reduce per step: any rank asked to stop, rank 0's clock
  // says a save is due, any rank still writing the last save.
  const double minutes = s.rc.checkpoint.minutes;
  int64_t flags[3] = {local_stop ? 1 : 0,
                      s.root() && minutes > 0 && seconds_since(last_save_) >= minutes * 60.0 ? 1 : 0,
                      ck.still_writing() ? 1 : 0};
  if (s.world.size() > 1) s.world.all_reduce(flags, 3, ReduceOp::Max);
  const bool stop = flags[0] != 0, time_due = flags[1] != 0, writing = flags[2] != 0;
  if (ck.in_flight() && !writing) ck.commit();
  const int every = s.rc.checkpoint.every;
  const bool due = stop || time_due || t == s.budget.last_step || (every > 0 && t % every == 0);
  if (!due) return false;
  dist::set_context("step " + std::to_string(t) + " checkpoint");
  if (ck.in_flight()) ck.finish();  // one save at a time
  ck.save(state());
  last_save_ = Clock::now();
  ++saves_;
  if (stop || t == s.budget.last_step) ck.finish(/*final=*/true);  // a failure ends the run with it
  if (s.root() && !s.opt.quiet && (stop || t == s.budget.last_step))
    std::printf("checkpoint step %lld written to %s (%.2f s)\n", (long long)t, s.rc.checkpoint.dir.c_str(),
                ck.last_save_seconds());
  return stop && t < s.budget.last_step;  // a stop at the last step is just the end
}

ResumeState CheckpointPolicy::rewind(int64_t t, const std::string& at, std::string& folder) {
  WIOLA_CHECK(ckpt_ != nullptr, at, ": no checkpoint to rewind to (checkpoint.dir is not set)");
  dist::set_context("step " + std::to_string(t) + " loss-spike rewind");
  if (ckpt_->in_flight()) ckpt_->finish();  // the save in flight is of an earlier, good step
  folder = ckpt_->find_resume();
  WIOLA_CHECK(!folder.empty(), at, ": no checkpoint in ", run_.rc.checkpoint.dir,
              " to rewind to (none saved yet: checkpoint.every sets how often)");
  const std::string run_id = ckpt_->run_id();
  ResumeState st = ckpt_->resume(folder);
  WIOLA_CHECK(st.step < t && st.run_id == run_id, at, ": the newest checkpoint ", folder, " (step ", st.step,
              ") is not an earlier one of this run; cannot rewind");
  return st;
}

}  // namespace wiola
