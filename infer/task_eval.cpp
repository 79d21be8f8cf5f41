#include "infer/task_eval.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "util/files.h"

namespace wiola::infer {

std::vector<double> task_logliks(Model<float>& model, const std::vector<TaskRequest>& requests) {
  const int B = model.options().micro_batch, T = model.config().T;
  std::vector<int32_t> tokens(size_t(B) * (T + 1));
  std::vector<double> out;
  out.reserve(requests.size());
  for (size_t i0 = 0; i0 < requests.size(); i0 += size_t(B)) {
    const size_t nb = std::min(requests.size() - i0, size_t(B));
    for (size_t b = 0; b < size_t(B); ++b)
      fill_task_row(requests[i0 + (b < nb ? b : 0)], T, tokens.data() + b * size_t(T + 1));
    model.eval_loss(tokens.data());
    const std::vector<float> losses = model.token_losses();
    for (size_t b = 0; b < nb; ++b) out.push_back(task_loglik(requests[i0 + b], losses.data() + b * size_t(T)));
  }
  return out;
}

TaskResult evaluate_task(Model<float>& model, const TaskFile& task, const Tokenizer& tok) {
  TaskResult r;
  r.loglik = task_logliks(model, task_requests(task, tok, model.config().T));
  r.scores = score_task(task, r.loglik);
  return r;
}

void write_task_logliks(const std::string& path, const std::vector<TaskFile>& tasks,
                        const std::vector<TaskResult>& results) {
  std::string text;
  for (size_t t = 0; t < tasks.size(); ++t) {
    size_t k = 0;
    for (size_t i = 0; i < tasks[t].items.size(); ++i) {
      const size_t n = tasks[t].items[i].choices.size();
      const std::vector<double> ll(results[t].loglik.begin() + std::ptrdiff_t(k),
                                   results[t].loglik.begin() + std::ptrdiff_t(k + n));
      text += nlohmann::json{{"task", tasks[t].name}, {"item", i}, {"gold", tasks[t].items[i].gold}, {"loglik", ll}}
                  .dump() +
              "\n";
      k += n;
    }
  }
  write_text_atomic(path, text);
}

}  // namespace wiola::infer
