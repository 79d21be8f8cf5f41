// `wiola eval`: loss and perplexity of a checkpoint over a data split or a
// text file (docs/inference.md).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ckpt/format.h"
#include "ckpt/tools.h"
#include "data/loader.h"
#include "data/text_input.h"
#include "infer/eval_windows.h"
#include "infer/evaluate.h"
#include "infer/loaded_model.h"
#include "infer/task_eval.h"
#include "kernels/backend.h"
#include "launch/cli.h"
#include "util/error.h"
#include "util/files.h"

namespace {

namespace infer = wiola::infer;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string checkpoint, data, split = "val", text, tokenizer, backend = "cpu", logits_out, ids_out;
  std::vector<std::string> tasks;
  std::string tasks_out;
  std::string documents = "auto";  // auto: as the checkpoint's run trained (data.documents)
  bool as_training = false, any_tokenizer = false, as_json = false;
  int batch = 8, threads = 0;
  int64_t max_windows = 0;
};

void report(const infer::EvalTotals& r, const infer::WindowPlan& p, const Args& a, const std::string& folder,
            double secs) {
  if (a.as_json) {
    const nlohmann::json j = {
        {"checkpoint", folder},         {"windows", r.windows},   {"targets", r.targets}, {"loss", r.mean()},
        {"perplexity", r.perplexity()}, {"loss_sum", r.loss_sum}, {"what", p.what},       {"seconds", secs}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("wiola eval: %s: %lld windows, %lld targets: loss %.6f, perplexity %.4f (%.1f s, %.0f tokens/s)\n",
                p.what.c_str(), (long long)r.windows, (long long)r.targets, r.mean(), r.perplexity(), secs,
                secs > 0 ? double(r.targets) / secs : 0.0);
  }
}

// --tasks: each file's acc and acc_norm (docs/inference.md "Downstream tasks").
int eval_tasks(const Args& a, const std::string& folder, const infer::LoadOptions& lo) {
  const std::vector<wiola::TaskFile> tasks = wiola::read_task_files(a.tasks);
  infer::LoadedModel lm(folder, lo);
  std::vector<infer::TaskResult> results;
  nlohmann::json all = nlohmann::json::array();
  for (const wiola::TaskFile& t : tasks) {
    const auto t0 = Clock::now();
    results.push_back(infer::evaluate_task(lm.model(), t, lm.tokenizer()));
    const wiola::TaskScores& s = results.back().scores;
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    all.push_back({{"task", s.name},
                   {"file", t.path},
                   {"items", s.items},
                   {"acc", s.acc},
                   {"acc_norm", s.acc_norm},
                   {"gold_loglik", s.gold_loglik},
                   {"seconds", secs}});
    if (!a.as_json)
      std::printf("wiola eval: task %s: %lld items: acc %.4f, acc_norm %.4f (%.1f s)\n", s.name.c_str(),
                  (long long)s.items, s.acc, s.acc_norm, secs);
  }
  if (a.as_json) std::printf("%s\n", nlohmann::json{{"checkpoint", lm.folder()}, {"tasks", all}}.dump().c_str());
  if (!a.tasks_out.empty()) infer::write_task_logliks(a.tasks_out, tasks, results);
  return 0;
}

}  // namespace

int wiola_cmd_eval(int argc, char** argv) {
  CLI::App app{"Loss and perplexity of a checkpoint (ATM off)", "wiola eval"};
  Args a;
  app.add_option("--checkpoint", a.checkpoint, "checkpoint folder (step-N) or checkpoint directory")->required();
  auto* data = app.add_option("--data", a.data, "prep output: manifest.json, its folder, or one .h5 shard");
  auto* text = app.add_option("--text", a.text, "a UTF-8 text file, tokenized with the checkpoint's tokenizer");
  auto* tasks = app.add_option("--tasks", a.tasks,
                               "multiple-choice task files (JSONL, comma-separated): acc and acc_norm of each")
                    ->delimiter(',');
  data->excludes(text);
  tasks->excludes(data)->excludes(text);
  app.add_option("--tasks-out", a.tasks_out, "--tasks: each item's choice log-likelihoods as JSONL");
  app.add_option("--split", a.split, "split of --data")->capture_default_str();
  app.add_flag("--as-training", a.as_training,
               "the training run's validation figure: its windows, micro-batch and loss sum (--data)");
  app.add_option("--batch", a.batch, "windows per forward (--as-training: the run's micro-batch)")
      ->capture_default_str();
  app.add_option("--max-windows", a.max_windows, "score only the first N windows (0: all)");
  app.add_option("--save-logits", a.logits_out, "--text: the first window's logits as float32 .npy [n, V]");
  app.add_option("--save-ids", a.ids_out, "--text: the first window's token ids as int32 .npy [n]");
  app.add_option("--tokenizer", a.tokenizer, "tokenizer.json to use instead of the checkpoint's (--text)");
  app.add_flag("--any-tokenizer", a.any_tokenizer, "accept data or a tokenizer other than the training data's");
  app.add_option("--backend", a.backend, "op backend: cpu, cpu-opaque, cpu-bf16; cuda, cuda-fp32 in CUDA builds")
      ->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: OpenMP default)");
  app.add_flag("--json", a.as_json, "print the result as one JSON line");
  app.add_option("--documents", a.documents,
                 "score windows as their documents (docs/model.md §2): auto (as the checkpoint's run trained), "
                 "on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  if (int rc = wiola::cli::parse(app, argc, argv, "eval"); rc >= 0) return rc;
  WIOLA_CHECK(data->count() || text->count() || tasks->count(), "give --data MANIFEST, --text FILE or --tasks FILES");
  WIOLA_CHECK(a.tasks_out.empty() || tasks->count(), "--tasks-out needs --tasks");
  WIOLA_CHECK(!a.as_training || data->count(), "--as-training needs --data");
  WIOLA_CHECK((a.logits_out.empty() && a.ids_out.empty()) || text->count(), "--save-logits/--save-ids need --text");
  WIOLA_CHECK(a.batch >= 1 && a.max_windows >= 0, "--batch must be positive, --max-windows >= 0");
  if (a.threads > 0) wiola::set_cpu_threads(a.threads);

  const std::string folder = wiola::ckpt::resolve_checkpoint(a.checkpoint);
  const wiola::ckpt::Reader ck(folder);
  const bool documents = a.documents == "on" || (a.documents == "auto" && infer::trained_with_documents(ck.manifest()));
  if (tasks->count()) {
    infer::LoadOptions lo{a.backend, a.batch, a.tokenizer, true, a.any_tokenizer};
    if (documents) lo.documents_eos = infer::kTokenizerEos;
    return eval_tasks(a, folder, lo);
  }
  // The batch comes from the training run when reproducing its figure.
  infer::TrainingEval te;
  if (a.as_training) {
    te = infer::training_eval(ck.manifest(), folder + "/manifest.json");
    a.batch = te.micro_batch;
  }
  const int T = wiola::ckpt::model_config(ck).T;
  std::unique_ptr<wiola::TokenLoader> loader;
  if (data->count()) loader = std::make_unique<wiola::TokenLoader>(a.data, a.split, T, 1, 0, 1, 0, false, false);
  // A run trained with data.documents is scored with them (docs/model.md §2
  // "Documents"; --documents on/off overrides): split at the data's EOS id,
  // or the tokenizer's for --text.
  infer::LoadOptions lo{a.backend, a.batch, a.tokenizer, text->count() > 0, a.any_tokenizer};
  if (documents) lo.documents_eos = loader ? int32_t(loader->info().eos_id) : infer::kTokenizerEos;
  infer::LoadedModel lm(folder, lo);

  std::vector<int32_t> ids;
  infer::WindowPlan plan;
  if (data->count()) {
    loader->expect(uint32_t(lm.config().V), a.any_tokenizer ? "" : infer::trained_tokenizer_sha(lm.manifest()));
    plan = infer::split_windows(*loader, T, a.as_training ? te.samples : 0);
  } else {
    ids = lm.tokenizer().encode(wiola::read_file(a.text));
    plan = infer::text_windows(ids, T);
    if (!a.logits_out.empty() || !a.ids_out.empty()) infer::save_first_window(lm.model(), ids, a.logits_out, a.ids_out);
  }
  if (a.max_windows > 0) plan.count = std::min(plan.count, a.max_windows);

  const auto t0 = Clock::now();
  auto last = t0;
  const auto progress = [&](const infer::EvalTotals& r) {
    const auto now = Clock::now();
    if (a.as_json || now - last < std::chrono::seconds(2)) return;
    last = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    const double eta = s / double(r.windows) * double(plan.count - r.windows);
    std::fprintf(stderr, "  %lld/%lld windows, loss %.4f, %.0f tokens/s, ETA %.0f s\n", (long long)r.windows,
                 (long long)plan.count, r.mean(), double(r.targets) / s, eta);
  };
  const infer::EvalTotals r = infer::evaluate_windows(lm.model(), plan.count, plan.window, progress);
  report(r, plan, a, lm.folder(), std::chrono::duration<double>(Clock::now() - t0).count());
  return 0;
}
