// Multiple-choice task scores of a model on one process (`wiola eval
// --tasks`, docs/inference.md "Downstream tasks"): data/tasks.h's requests
// as rows of the model's micro-batch, evaluation forwards (ATM off), each
// choice's log-likelihood from the per-token cross-entropies.
#pragma once

#include <string>
#include <vector>

#include "data/tasks.h"
#include "model/model.h"

namespace wiola::infer {

// The log-likelihood of each request, in batches of the model's micro-batch
// (whole layer range; a short last batch is filled with copies of its
// first row, whose results are dropped).
std::vector<double> task_logliks(Model<float>& model, const std::vector<TaskRequest>& requests);

struct TaskResult {
  TaskScores scores;
  std::vector<double> loglik;  // per choice, item-major
};
TaskResult evaluate_task(Model<float>& model, const TaskFile& task, const Tokenizer& tok);

// Each item's choice log-likelihoods as JSONL (through a temporary name):
// {"task": NAME, "item": i, "gold": g, "loglik": [...]} per item.
void write_task_logliks(const std::string& path, const std::vector<TaskFile>& tasks,
                        const std::vector<TaskResult>& results);

}  // namespace wiola::infer
