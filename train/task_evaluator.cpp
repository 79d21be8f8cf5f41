#include "train/task_evaluator.h"

#include <algorithm>
#include <string>

#include "data/tokenizer.h"
#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/run_settings.h"
#include "train/schedule_runner.h"
#include "train/stage_schedule.h"
#include "train/train_data.h"
#include "train/validator.h"
#include "util/error.h"

namespace wiola {

namespace {

// Reads each forward of the head chunk's per-token cross-entropies.
class HeadLosses final : public ScheduleObserver {
 public:
  HeadLosses(const StageSchedule& s, RankModel& model, int n) : s_(s), model_(model), losses_(size_t(n)) {}
  void compute_ends(const dist::Action& a) override {
    if (a.op != dist::Op::Fwd || s_.global_chunk(a.chunk) != s_.n_global_chunks() - 1) return;
    losses_[size_t(a.micro)] = model_.chunks[size_t(a.chunk)]->token_losses();
  }
  const std::vector<float>& of(int micro) const { return losses_[size_t(micro)]; }

 private:
  const StageSchedule& s_;
  RankModel& model_;
  std::vector<std::vector<float>> losses_;
};

}  // namespace

TaskEvaluator::TaskEvaluator(const RunSettings& run, const StageSchedule& schedule, RankModel& model, RankComms& comms)
    : run_(run), schedule_(schedule), model_(model), comms_(comms) {}

void TaskEvaluator::open(const TrainData& data) {
  const std::string& file = data.loader->info().tokenizer_file;
  WIOLA_CHECK(!file.empty(), "train.eval_tasks: the data names no tokenizer file to encode the tasks with");
  const Tokenizer tok = Tokenizer::load(file);
  WIOLA_CHECK(tok.sha256() == data.loader->info().tokenizer_sha256, "train.eval_tasks: ", file,
              " changed since prep (its SHA-256 is not the data's)");
  try {
    tasks_ = read_task_files(run_.rc.train.eval_tasks);
    for (const TaskFile& t : tasks_) requests_.push_back(task_requests(t, tok, run_.T));
  } catch (const Error& e) {
    fail("train.eval_tasks: ", e.what());
  }
}

bool TaskEvaluator::due(int64_t t, int64_t last_step) const {
  const int every = run_.rc.train.eval_tasks_every;
  return !tasks_.empty() && ((every > 0 && t % every == 0) || t == last_step);
}

// In rounds of one training step's shape: each DP rank runs m micro-batches
// of B rows, rank j the round's rows [j·m·B, (j+1)·m·B) (so the stage
// link's tags and pending messages stay those of a step); rows past the
// last request repeat the first.
std::vector<double> TaskEvaluator::logliks(const std::vector<TaskRequest>& reqs) {
  const int B = run_.B, T = run_.T, m = run_.m;
  const size_t per_rank = size_t(B) * size_t(m), per_round = per_rank * size_t(run_.rc.parallel.dp);
  std::vector<double> ll(reqs.size(), 0.0);
  std::vector<int32_t> tokens(size_t(m) * run_.mb_tokens());
  for (size_t base = 0; base < reqs.size(); base += per_round) {
    const size_t first = base + size_t(run_.me.dp) * per_rank;
    for (size_t r = 0; r < per_rank; ++r)
      fill_task_row(reqs[first + r < reqs.size() ? first + r : 0], T, tokens.data() + r * size_t(T + 1));
    HeadLosses head(schedule_, model_, m);  // the forward schedule's chunks are the training one's
    run_evaluation_forwards(schedule_, model_, comms_, m, run_.mb_tokens(), tokens.data(), "task scores", &head);
    if (run_.me.tp != 0) continue;  // one rank of each TP group contributes
    for (size_t r = 0; r < per_rank && first + r < reqs.size(); ++r)
      if (const auto& l = head.of(int(r / size_t(B))); !l.empty())
        ll[first + r] = task_loglik(reqs[first + r], l.data() + (r % size_t(B)) * size_t(T));
  }
  model_.head().take_loss_sum();  // not a validation figure: dropped
  if (run_.world.size() > 1) run_.world.all_reduce(ll.data(), ll.size(), dist::ReduceOp::Sum);
  return ll;
}

const std::vector<TaskScores>& TaskEvaluator::evaluate() {
  last_.clear();
  for (size_t k = 0; k < tasks_.size(); ++k) last_.push_back(score_task(tasks_[k], logliks(requests_[k])));
  return last_;
}

}  // namespace wiola
