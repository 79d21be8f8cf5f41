#include "train/validator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/run_settings.h"
#include "train/schedule_runner.h"
#include "train/stage_schedule.h"
#include "train/train_data.h"
#include "util/error.h"

namespace wiola {

void run_evaluation_forwards(const StageSchedule& train, RankModel& model, RankComms& comms, int n, size_t mb_tokens,
                             const int32_t* tokens, const std::string& what, ScheduleObserver* observer) {
  const StageSchedule forwards = make_forward_schedule(train, n);
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  std::vector<StageChunk*> runs;
  for (auto& m : model.chunks) {
    chunks.push_back(std::make_unique<ModelChunk>(*m, false));
    runs.push_back(chunks.back().get());
  }
  ScheduleRunner runner(forwards, runs, *comms.link, mb_tokens, 0.0);
  if (observer) runner.add_observer(*observer);
  runner.run(0, what, tokens, false);
}

Validator::Validator(const RunSettings& run, const StageSchedule& schedule, RankModel& model, RankComms& comms,
                     const TrainData& data, WorldLoss world_loss)
    : run_(run), schedule_(schedule), model_(model), comms_(comms), data_(data), world_loss_(std::move(world_loss)) {}

void Validator::open(uint64_t data_seed) {
  const RunConfig& rc = run_.rc;
  const auto& par = rc.parallel;
  const std::vector<BlendSource> sources = rc.data_sources();
  auto open = [&](size_t k) {
    auto ld = std::make_unique<TokenLoader>(sources[k].path, "val", run_.T, run_.B * par.dp, run_.me.dp, par.dp,
                                            data_seed, false, false, size_t(rc.data.max_open_shards));
    const LoaderState start = ld->state();
    vals_.push_back({std::move(ld), start, k, data_.loader->source_share(k)});
  };
  if (sources.size() == 1) return open(0);
  for (size_t k = 0; k < sources.size(); ++k) {
    try {
      open(k);
    } catch (const Error& e) {
      if (run_.root())
        std::fprintf(stderr, "wiola train: warning: validation leaves out blend source %zu: %s\n", k + 1, e.what());
    }
  }
  WIOLA_CHECK(!vals_.empty(),
              "train.eval_every is set, but no source of data.blend has a usable \"val\" split "
              "(see the warnings above); set train.eval_every = 0");
}

bool Validator::due(int64_t t, int64_t last_step) const {
  return !vals_.empty() && (t % run_.rc.train.eval_every == 0 || t == last_step);
}

// The first eval_batches global batches of one validation source, forwards
// only, through the schedule runner (each batch through the global chunks in
// order, this rank's as they come; ATM off).
double Validator::loss_of(Source& v) {
  const int n = run_.rc.train.eval_batches * run_.m;
  const size_t mb = run_.mb_tokens();
  v.loader->restore(v.start);
  std::vector<int32_t> tokens(size_t(n) * mb);
  double counted = 0;  // documents: the targets that count (docs/model.md §2)
  for (int i = 0; i < n; ++i) {
    v.loader->next_batch(tokens.data() + size_t(i) * mb);
    counted += double(counted_targets(tokens.data() + size_t(i) * mb, run_.B, run_.T, run_.documents_eos));
  }
  run_evaluation_forwards(
      schedule_, model_, comms_, n, mb, tokens.data(),
      "evaluation" + (vals_.size() > 1 ? " of blend source " + std::to_string(v.source + 1) : std::string()));
  if (run_.documents_eos >= 0) {
    if (run_.rc.parallel.dp > 1)
      comms_.grid->dp().all_reduce(&counted, &counted, 1, dist::DType::F64, dist::ReduceOp::Sum);
    return world_loss_() / std::max(counted, 1.0);
  }
  return world_loss_() / (double(run_.rc.train.eval_batches) * run_.GB * run_.T);
}

double Validator::validate() {
  last_sources_.assign(run_.rc.data.blend.size(), std::nan(""));
  double sum = 0, shares = 0;
  for (Source& v : vals_) {
    const double loss = loss_of(v);
    if (!last_sources_.empty()) last_sources_[v.source] = loss;
    sum += v.share * loss;
    shares += v.share;
  }
  last_ = sum / shares;
  return last_;
}

}  // namespace wiola
