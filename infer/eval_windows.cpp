// The windows `wiola eval` scores (infer/eval_windows.h).
#include "infer/eval_windows.h"

#include <toml++/toml.h>

#include <algorithm>
#include <iterator>

#include "util/error.h"

namespace wiola::infer {

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

WindowPlan split_windows(const TokenLoader& loader, int T, int64_t training_samples) {
  const uint64_t N = loader.info().num_tokens, S = loader.info().num_samples;
  WindowPlan p;
  if (training_samples > 0) {
    p.count = training_samples;
    p.window = [&loader, S, T](int64_t i, int32_t* out) {
      loader.read_tokens((uint64_t(i) % S) * uint64_t(T), uint64_t(T) + 1, out);
      return T + 1;
    };
    p.what = "the training run's validation windows";
    return p;
  }
  const uint64_t tail = N - S * uint64_t(T);
  p.count = int64_t(S) + (tail >= 2 ? 1 : 0);
  p.window = [&loader, N, T](int64_t i, int32_t* out) {
    const uint64_t start = uint64_t(i) * uint64_t(T), n = std::min<uint64_t>(uint64_t(T) + 1, N - start);
    loader.read_tokens(start, n, out);
    return int(n);
  };
  p.what = "the whole split";
  return p;
}

WindowPlan text_windows(const std::vector<int32_t>& ids, int T) {
  WIOLA_CHECK(ids.size() >= 2, "--text: the text encodes to ", ids.size(), " token(s); at least 2 are needed");
  WindowPlan p;
  const uint64_t N = ids.size();
  p.count = int64_t((N - 2) / uint64_t(T) + 1);
  p.window = [&ids, N, T](int64_t i, int32_t* out) {
    const uint64_t start = uint64_t(i) * uint64_t(T), n = std::min<uint64_t>(uint64_t(T) + 1, N - start);
    std::copy_n(ids.begin() + std::ptrdiff_t(start), n, out);
    return int(n);
  };
  p.what = "the text";
  return p;
}

void save_first_window(Model<float>& model, const std::vector<int32_t>& ids, const std::string& logits_npy,
                       const std::string& ids_npy) {
  const int T = model.config().T, V = model.config().V, B = model.options().micro_batch;
  const int n = int(std::min<size_t>(ids.size(), size_t(T)));
  std::vector<int32_t> in(size_t(B) * T, ids[size_t(n - 1)]);
  std::copy_n(ids.begin(), n, in.begin());
  const std::vector<float> logits = model.forward_logits(in.data(), false);
  if (!logits_npy.empty()) write_npy(logits_npy, logits.data(), {n, V});
  if (!ids_npy.empty()) write_npy(ids_npy, ids.data(), {n});
}

}  // namespace wiola::infer
