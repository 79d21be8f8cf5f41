// `wiola eval`: loss and perplexity of a checkpoint over a data split or a
// text file (docs/inference.md).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt/format.h"
#include "data/loader.h"
#include "data/text_input.h"
#include "infer/evaluate.h"
#include "infer/loaded_model.h"
#include "kernels/backend.h"
#include "launch/cli.h"
#include "util/error.h"
#include "util/files.h"

namespace {

namespace infer = wiola::infer;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string checkpoint, data, split = "val", text, tokenizer, backend = "cpu", logits_out, ids_out;
  bool as_training = false, any_tokenizer = false, as_json = false;
  int batch = 8, threads = 0;
  int64_t max_windows = 0;
};

// The windows to score and how to read them.
struct Plan {
  int64_t count = 0;
  infer::WindowSource window;
  std::string what;  // for the report
};

// What the training run's validation used (its recorded config): the first
// eval_batches global batches of the split in index order (no shuffle), in
// micro-batches of train.micro_batch.
struct TrainingEval {
  int64_t samples = 0;
  int micro_batch = 1;
  std::string split_source;
};
TrainingEval training_eval(const nlohmann::json& manifest, const std::string& where) {
  WIOLA_CHECK(manifest.contains("config") && manifest["config"].is_string(), where, ": records no training config");
  const toml::table t = toml::parse(manifest["config"].get<std::string>());
  const int64_t eval_batches = t["train"]["eval_batches"].value_or(int64_t(0));
  const int64_t mb = t["train"]["micro_batch"].value_or(int64_t(0));
  const int64_t ga = t["train"]["grad_accum"].value_or(int64_t(1));
  const int64_t dp = t["parallel"]["dp"].value_or(int64_t(1));
  WIOLA_CHECK(eval_batches > 0 && mb > 0, where, ": the training run had no validation (train.eval_every = 0)");
  const auto* blend = t["data"]["blend"].as_array();
  WIOLA_CHECK(!blend || blend->empty(), where, ": the training run validated on a blend of ", blend ? blend->size() : 0,
              " sources; --as-training reproduces the validation of one source (evaluate each with --data instead)");
  return {eval_batches * mb * ga * dp, int(mb), t["data"]["path"].value_or(std::string())};
}

Plan data_plan(const wiola::TokenLoader& ld, const Args& a, int T, int64_t train_samples) {
  const uint64_t N = ld.info().num_tokens, S = ld.info().num_samples;
  Plan p;
  if (a.as_training) {  // the loader's samples, wrapping into the next epoch as training did
    p.count = train_samples;
    p.window = [&ld, S, T](int64_t i, int32_t* out) {
      ld.read_tokens((uint64_t(i) % S) * uint64_t(T), uint64_t(T) + 1, out);
      return T + 1;
    };
    p.what = "the training run's validation windows";
    return p;
  }
  // Every sample, then the tail they leave (so every token but the first is a target once).
  const uint64_t tail = N - S * uint64_t(T);
  p.count = int64_t(S) + (tail >= 2 ? 1 : 0);
  p.window = [&ld, S, N, T](int64_t i, int32_t* out) {
    const uint64_t start = uint64_t(i) * uint64_t(T), n = std::min<uint64_t>(uint64_t(T) + 1, N - start);
    ld.read_tokens(start, n, out);
    (void)S;
    return int(n);
  };
  p.what = "the whole split";
  return p;
}

Plan text_plan(const std::vector<int32_t>& ids, int T) {
  WIOLA_CHECK(ids.size() >= 2, "--text: the text encodes to ", ids.size(), " token(s); at least 2 are needed");
  Plan p;
  const uint64_t N = ids.size();
  p.count = int64_t((N - 2) / uint64_t(T) + 1);  // windows of T+1 overlapping by one token
  p.window = [&ids, N, T](int64_t i, int32_t* out) {
    const uint64_t start = uint64_t(i) * uint64_t(T), n = std::min<uint64_t>(uint64_t(T) + 1, N - start);
    std::copy_n(ids.begin() + std::ptrdiff_t(start), n, out);
    return int(n);
  };
  p.what = "the text";
  return p;
}

// The logits of the first window's inputs (for comparisons with other
// implementations, e.g. the Hugging Face export).
void save_first_logits(wiola::Model<float>& model, const std::vector<int32_t>& ids, const Args& a) {
  const int T = model.config().T, V = model.config().V, B = model.options().micro_batch;
  const int n = int(std::min<size_t>(ids.size(), size_t(T)));
  std::vector<int32_t> in(size_t(B) * T, ids[size_t(n - 1)]);
  std::copy_n(ids.begin(), n, in.begin());
  const std::vector<float> logits = model.forward_logits(in.data(), false);
  if (!a.logits_out.empty()) infer::write_npy(a.logits_out, logits.data(), {n, V});
  if (!a.ids_out.empty()) infer::write_npy(a.ids_out, ids.data(), {n});
}

void report(const infer::EvalTotals& r, const Plan& p, const Args& a, const std::string& folder, double secs) {
  if (a.as_json) {
    const nlohmann::json j = {{"checkpoint", folder}, {"windows", r.windows}, {"targets", r.targets},
                              {"loss", r.mean()}, {"perplexity", r.perplexity()}, {"loss_sum", r.loss_sum},
                              {"what", p.what}, {"seconds", secs}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("wiola eval: %s: %lld windows, %lld targets: loss %.6f, perplexity %.4f (%.1f s, %.0f tokens/s)\n",
                p.what.c_str(), (long long)r.windows, (long long)r.targets, r.mean(), r.perplexity(), secs,
                secs > 0 ? double(r.targets) / secs : 0.0);
  }
}

}  // namespace

int wiola_cmd_eval(int argc, char** argv) {
  CLI::App app{"Loss and perplexity of a checkpoint (ATM off)", "wiola eval"};
  Args a;
  app.add_option("--checkpoint", a.checkpoint, "checkpoint folder (step-N) or checkpoint directory")->required();
  auto* data = app.add_option("--data", a.data, "prep output: manifest.json, its folder, or one .h5 shard");
  auto* text = app.add_option("--text", a.text, "a UTF-8 text file, tokenized with the checkpoint's tokenizer");
  data->excludes(text);
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
  app.add_option("--backend", a.backend, "op backend: cpu, cpu-opaque, cpu-bf16; cuda, cuda-fp32 in CUDA builds")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: OpenMP default)");
  app.add_flag("--json", a.as_json, "print the result as one JSON line");
  if (int rc = wiola::cli::parse(app, argc, argv, "eval"); rc >= 0) return rc;
  WIOLA_CHECK(data->count() || text->count(), "give --data MANIFEST or --text FILE");
  WIOLA_CHECK(!a.as_training || data->count(), "--as-training needs --data");
  WIOLA_CHECK((a.logits_out.empty() && a.ids_out.empty()) || text->count(), "--save-logits/--save-ids need --text");
  WIOLA_CHECK(a.batch >= 1 && a.max_windows >= 0, "--batch must be positive, --max-windows >= 0");
  if (a.threads > 0) wiola::set_cpu_threads(a.threads);

  // The batch comes from the training run when reproducing its figure.
  const std::string folder = wiola::ckpt::resolve_checkpoint(a.checkpoint);
  TrainingEval te;
  if (a.as_training) {
    wiola::ckpt::Reader r(folder);
    te = training_eval(r.manifest(), folder + "/manifest.json");
    a.batch = te.micro_batch;
  }
  infer::LoadedModel lm(folder, {a.backend, a.batch, a.tokenizer, text->count() > 0, a.any_tokenizer});
  const int T = lm.config().T;

  std::unique_ptr<wiola::TokenLoader> loader;
  std::vector<int32_t> ids;
  Plan plan;
  if (data->count()) {
    loader = std::make_unique<wiola::TokenLoader>(a.data, a.split, T, 1, 0, 1, 0, false, false);
    loader->expect(uint32_t(lm.config().V), a.any_tokenizer ? "" : infer::trained_tokenizer_sha(lm.manifest()));
    plan = data_plan(*loader, a, T, te.samples);
  } else {
    ids = lm.tokenizer().encode(wiola::read_file(a.text));
    plan = text_plan(ids, T);
    if (!a.logits_out.empty() || !a.ids_out.empty()) save_first_logits(lm.model(), ids, a);
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
