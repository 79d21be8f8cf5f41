#include "data/tasks.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "util/error.h"
#include "util/json.h"

namespace wiola {

namespace {

std::string text_field(const nlohmann::json& j, const char* key, const std::string& where) {
  WIOLA_CHECK(j.contains(key), where, ": no \"", key, "\"");
  WIOLA_CHECK(j[key].is_string(), where, ": \"", key, "\" is not a string");
  return j[key].get<std::string>();
}

TaskItem parse_item(const nlohmann::json& j, const std::string& where) {
  WIOLA_CHECK(j.is_object(), where, ": not a JSON object");
  TaskItem it;
  it.context = text_field(j, "context", where);
  WIOLA_CHECK(!it.context.empty(), where, ": \"context\" is empty (an empty context is not supported)");
  WIOLA_CHECK(j.contains("choices") && j["choices"].is_array(), where, ": \"choices\" is not an array of strings");
  for (const auto& c : j["choices"]) {
    WIOLA_CHECK(c.is_string(), where, ": \"choices\" is not an array of strings");
    it.choices.push_back(c.get<std::string>());
  }
  WIOLA_CHECK(it.choices.size() >= 2, where, ": ", it.choices.size(), " choices (at least 2 are needed)");
  WIOLA_CHECK(j.contains("gold"), where, ": no \"gold\"");
  it.gold = json_int<int>(j["gold"], where + ": \"gold\"");
  WIOLA_CHECK(it.gold >= 0 && size_t(it.gold) < it.choices.size(), where, ": \"gold\" is ", it.gold,
              ", not an index of the ", it.choices.size(), " choices");
  return it;
}

// Characters (Unicode code points) of UTF-8 text: Python's len(str), what
// lm-evaluation-harness divides by.
double characters(const std::string& s) {
  return double(std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

}  // namespace

TaskFile read_task_file(const std::string& path) {
  std::ifstream f(path);
  WIOLA_CHECK(f, path, ": cannot be read (a task file: one JSON object per line)");
  TaskFile t;
  t.path = path;
  std::string line, named;
  for (int no = 1; std::getline(f, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(where, ": not JSON (", e.what(), ")");
    }
    t.items.push_back(parse_item(j, where));
    if (j.contains("task")) {
      const std::string name = text_field(j, "task", where);
      WIOLA_CHECK(named.empty() || name == named, where, ": \"task\" is \"", name, "\", earlier lines say \"", named,
                  "\" (one task per file)");
      named = name;
    }
  }
  WIOLA_CHECK(!t.items.empty(), path, ": no items");
  t.name = named.empty() ? std::filesystem::path(path).stem().string() : named;
  return t;
}

std::vector<TaskFile> read_task_files(const std::vector<std::string>& paths) {
  std::vector<TaskFile> out;
  std::map<std::string, int> seen;
  for (const std::string& p : paths) {
    out.push_back(read_task_file(p));
    if (const int n = ++seen[out.back().name]; n > 1) {
      out.back().name += ':';
      out.back().name += std::to_string(n);
    }
  }
  return out;
}

std::vector<TaskRequest> task_requests(const TaskFile& task, const Tokenizer& tok, int T) {
  std::vector<TaskRequest> out;
  for (size_t i = 0; i < task.items.size(); ++i) {
    const TaskItem& it = task.items[i];
    // lm-evaluation-harness's _encode_pair: the context's trailing spaces
    // belong to the continuation.
    const size_t keep = it.context.find_last_not_of(' ') + 1;
    const std::string context = it.context.substr(0, keep), spaces = it.context.substr(keep);
    const std::vector<int32_t> ctx = tok.encode(context);
    for (const std::string& choice : it.choices) {
      std::vector<int32_t> whole = tok.encode(context + spaces + " " + choice);
      // As lm-evaluation-harness: the tokens after as many as the context's own.
      WIOLA_CHECK(whole.size() > ctx.size() && !ctx.empty(), task.path, ": item ", i + 1,
                  ": context + choice encode to no more tokens than the context alone");
      const size_t n = std::min(whole.size(), size_t(T) + 1);
      TaskRequest r;
      r.window.assign(whole.end() - std::ptrdiff_t(n), whole.end());
      r.scored = int(std::min(whole.size() - ctx.size(), n - 1));
      out.push_back(std::move(r));
    }
  }
  return out;
}

void fill_task_row(const TaskRequest& req, int T, int32_t* row) {
  const size_t n = req.window.size();
  std::copy(req.window.begin(), req.window.end(), row);
  std::fill(row + n, row + T + 1, req.window.back());
}

double task_loglik(const TaskRequest& req, const float* token_losses) {
  const int n = int(req.window.size());
  double ll = 0;
  for (int p = n - 1 - req.scored; p < n - 1; ++p) ll -= double(token_losses[p]);
  return ll;
}

TaskScores score_task(const TaskFile& task, const std::vector<double>& loglik) {
  TaskScores s;
  s.name = task.name;
  size_t k = 0;
  for (const TaskItem& it : task.items) {
    size_t best = 0, best_norm = 0;
    for (size_t c = 0; c < it.choices.size(); ++c) {
      WIOLA_CHECK(k + c < loglik.size(), "score_task: fewer log-likelihoods than choices of ", task.path);
      const double ll = loglik[k + c], norm = ll / std::max(characters(it.choices[c]), 1.0);
      if (ll > loglik[k + best]) best = c;  // the first of equal ones, as numpy's argmax
      if (norm > loglik[k + best_norm] / std::max(characters(it.choices[best_norm]), 1.0)) best_norm = c;
    }
    s.gold_loglik += loglik[k + size_t(it.gold)];
    s.acc += best == size_t(it.gold) ? 1 : 0;
    s.acc_norm += best_norm == size_t(it.gold) ? 1 : 0;
    k += it.choices.size();
  }
  s.items = int64_t(task.items.size());
  s.acc /= double(s.items);
  s.acc_norm /= double(s.items);
  s.gold_loglik /= double(s.items);
  return s;
}

}  // namespace wiola
