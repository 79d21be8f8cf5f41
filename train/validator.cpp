#include "train/validator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "dist/diagnostics.h"
#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/run_settings.h"
#include "train/stage_schedule.h"
#include "train/train_data.h"
#include "util/error.h"

namespace wiola {

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

// The first eval_batches global batches of one validation source.
double Validator::loss_of(Source& v) {
  const StageSchedule& s = schedule_;
  StageLink& link = *comms_.link;
  v.loader->restore(v.start);
  std::vector<int32_t> vb(run_.mb_tokens());
  const int n = run_.rc.train.eval_batches * run_.m;
  double counted = 0;  // documents: the targets that count (docs/model.md §2)
  for (int i = 0; i < n; ++i) {
    v.loader->next_batch(vb.data());
    counted += double(counted_targets(vb.data(), run_.B, run_.T, run_.documents_eos));
    dist::set_context("evaluation batch " + std::to_string(i) +
                      (vals_.size() > 1 ? " of blend source " + std::to_string(v.source + 1) : std::string()));
    // The batch through the global chunks in order, this rank's as they come.
    for (int c = 0; c < s.v; ++c) {
      Model<float>& model = *model_.chunks[size_t(c)];
      const int g = s.global_chunk(c);
      if (g > 0) link.recv(model.fwd_in(0), s.chunk_rank(g - 1), StageLink::tag(g, i, n, false));
      model.stage_forward(0, vb.data(), 0.0, false);
      if (g + 1 < s.n_global_chunks())
        link.send(model.fwd_out(0), s.chunk_rank(g + 1), StageLink::tag(g + 1, i, n, false));
    }
  }
  link.flush();
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
