// Multiple-choice task files and their scoring as lm-evaluation-harness does
// it (docs/inference.md "Downstream tasks"): a JSONL file of items (a
// context, its choices, the gold index), each choice's log-likelihood given
// the context, and the task's accuracy (`acc`: the choice of the largest
// log-likelihood is the gold one) and length-normalised accuracy
// (`acc_norm`: the largest log-likelihood per character of the choice's
// text). What runs the model is the caller's (infer/task_eval.h on one
// process, train/task_evaluator.h through the training layout); this part
// only makes the token windows and turns their log-likelihoods into scores.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace wiola {

class Tokenizer;

struct TaskItem {
  std::string context;
  std::vector<std::string> choices;
  int gold = 0;
};

struct TaskFile {
  std::string name;  // the lines' "task", else the file name without its extension
  std::string path;
  std::vector<TaskItem> items;
};

// One line per item: {"context": str, "choices": [str, ...], "gold": int,
// "task": str (optional, the same on every line)}; blank lines are skipped.
// Throws wiola::Error naming the file, the line and the problem.
TaskFile read_task_file(const std::string& path);
// Several files, their names unique (a repeated name gets ":2", ":3", ...).
std::vector<TaskFile> read_task_files(const std::vector<std::string>& paths);

// One choice to score: up to T + 1 token ids, of which the last `scored`
// are the continuation (its log-likelihood is that of these targets).
struct TaskRequest {
  std::vector<int32_t> window;
  int scored = 0;
};

// The requests of every item's choices in order (item-major), encoded as
// lm-evaluation-harness encodes a (context, continuation) pair: the
// continuation is " " + choice (the target delimiter), trailing spaces of the
// context move to it, context + continuation are encoded together and the
// tokens after the context's own encoding are the continuation's; a window
// longer than T + 1 loses tokens on the left.
std::vector<TaskRequest> task_requests(const TaskFile& task, const Tokenizer& tok, int T);

// Row `req` of a [B, T + 1] batch: its window, padded with its last id.
void fill_task_row(const TaskRequest& req, int T, int32_t* row);
// Its log-likelihood from the row's T per-target cross-entropies (nats).
double task_loglik(const TaskRequest& req, const float* token_losses);

struct TaskScores {
  std::string name;
  int64_t items = 0;
  double acc = 0, acc_norm = 0;  // means over the items
  double gold_loglik = 0;        // the gold choice's log-likelihood, mean over the items
};
// `loglik`: one per request of task_requests, in its order.
TaskScores score_task(const TaskFile& task, const std::vector<double>& loglik);

}  // namespace wiola
