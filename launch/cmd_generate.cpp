// `wiola generate`: text from a checkpoint, KV-cached (docs/inference.md).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <fstream>
#include <string>
#include <vector>

#include "infer/generate.h"
#include "infer/loaded_model.h"
#include "kernels/backend.h"
#include "launch/cli.h"
#include "util/error.h"

namespace {

using wiola::infer::Completion;

struct Args {
  std::string checkpoint, prompt, prompts_file, tokenizer, backend = "cpu";
  wiola::infer::GenerateOptions gen;
  bool greedy = false, no_eos = false, any_tokenizer = false, check = false;
  int threads = 0, batch = 8;
};

// Holds back the bytes of a UTF-8 character split across tokens, so a
// stream never prints half a character.
class Utf8Stream {
 public:
  std::string push(const std::string& bytes) {
    pending_ += bytes;
    size_t cut = pending_.size(), i = pending_.size();
    // Back up over at most 3 continuation bytes to the last lead byte.
    while (i > 0 && pending_.size() - i < 4 && (uint8_t(pending_[i - 1]) & 0xC0) == 0x80) --i;
    if (i > 0) {
      const uint8_t lead = uint8_t(pending_[i - 1]);
      const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
      if (need > pending_.size() - (i - 1)) cut = i - 1;
    }
    std::string out = pending_.substr(0, cut);
    pending_.erase(0, cut);
    return out;
  }
  std::string flush() { return std::exchange(pending_, std::string()); }

 private:
  std::string pending_;
};

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  WIOLA_CHECK(in, path, ": cannot be read");
  std::vector<std::string> lines;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    WIOLA_CHECK(!line.empty(), path, ":", n, ": empty prompt (one prompt per line, no blank lines)");
    lines.push_back(line);
  }
  WIOLA_CHECK(!lines.empty(), path, ": no prompts in the file");
  return lines;
}

void print_stats(const wiola::infer::GenerateStats& s) {
  std::fprintf(stderr,
               "wiola generate: %lld new tokens in %.2f s (%.1f tokens/s); prompt %lld tokens in %.2f s (%.1f "
               "tokens/s)\n",
               (long long)s.new_tokens, s.decode_s, s.decode_s > 0 ? double(s.new_tokens) / s.decode_s : 0.0,
               (long long)s.prompt_tokens, s.prefill_s, s.prefill_s > 0 ? double(s.prompt_tokens) / s.prefill_s : 0.0);
}

void report_context(int T) {
  std::fprintf(stderr, "wiola generate: stopped at the model's context length (%d tokens)\n", T);
}

int report_greedy_check(wiola::Model<float>& model, const std::vector<std::vector<int32_t>>& ids,
                 const std::vector<Completion>& out) {
  const auto c = wiola::infer::check_greedy(model, ids, out);
  std::fprintf(stderr, "greedy check: %lld positions, %lld equal to the full forward's argmax, %lld exempt "
               "(top-2 logits within 1e-4), %lld differ%s%s\n",
               (long long)c.positions, (long long)c.equal, (long long)c.exempt, (long long)c.differ,
               c.differ ? "; first: " : "", c.first_difference.c_str());
  return c.differ == 0 ? 0 : 1;
}

// One prompt: the text streams to stdout as it is generated.
int run_one(const Args& a) {
  wiola::infer::LoadedModel lm(a.checkpoint, {a.backend, 1, a.tokenizer, true, a.any_tokenizer});
  const wiola::Tokenizer& tok = lm.tokenizer();
  const std::vector<std::vector<int32_t>> ids = {tok.encode(a.prompt)};
  WIOLA_CHECK(!ids[0].empty(), "--prompt: empty prompt");
  auto opt = a.gen;
  opt.eos_id = a.no_eos ? -1 : tok.eos_id();
  Utf8Stream stream;
  std::fputs(a.prompt.c_str(), stdout);
  wiola::infer::GenerateCallbacks cb;
  cb.on_token = [&](int, int32_t id) {
    if (id == opt.eos_id) return;
    std::fputs(stream.push(tok.decode(&id, 1)).c_str(), stdout);
    std::fflush(stdout);
  };
  wiola::infer::GenerateStats st;
  const auto out = wiola::infer::generate(lm.model(), ids, opt, cb, &st);
  std::fputs((stream.flush() + "\n").c_str(), stdout);
  std::fflush(stdout);
  if (out[0].stop == wiola::infer::StopReason::Context) report_context(lm.config().T);
  print_stats(st);
  return a.check ? report_greedy_check(lm.model(), ids, out) : 0;
}

// A file of prompts, decoded in batches; one JSON line per prompt as it
// stops. One model for every batch: a short last batch is filled up with
// copies of its first prompt, whose results are dropped.
int run_file(const Args& a) {
  const std::vector<std::string> texts = read_prompts(a.prompts_file);
  const size_t B = std::min(texts.size(), size_t(a.batch));
  wiola::infer::LoadedModel lm(a.checkpoint, {a.backend, int(B), a.tokenizer, true, a.any_tokenizer});
  const wiola::Tokenizer& tok = lm.tokenizer();
  auto opt = a.gen;
  opt.eos_id = a.no_eos ? -1 : tok.eos_id();
  int rc = 0;
  wiola::infer::GenerateStats total;
  for (size_t i0 = 0; i0 < texts.size(); i0 += B) {
    const size_t nb = std::min(texts.size() - i0, B);
    std::vector<std::vector<int32_t>> ids;
    for (size_t i = 0; i < nb; ++i) {
      ids.push_back(tok.encode(texts[i0 + i]));
      WIOLA_CHECK(!ids.back().empty(), a.prompts_file, ":", i0 + i + 1, ": the prompt encodes to no token");
    }
    ids.resize(B, ids[0]);
    opt.first_index = i0;
    wiola::infer::GenerateCallbacks cb;
    cb.on_done = [&](int b, const Completion& c) {
      if (size_t(b) >= nb) return;
      std::vector<int32_t> shown = c.tokens;
      if (c.stop == wiola::infer::StopReason::Eos) shown.pop_back();
      const nlohmann::ordered_json j = {{"index", i0 + size_t(b)}, {"prompt", texts[i0 + size_t(b)]},
                                {"completion", tok.decode(shown)}, {"new_tokens", c.tokens.size()},
                                {"stop", wiola::infer::stop_name(c.stop)}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      std::fflush(stdout);
    };
    wiola::infer::GenerateStats st;
    auto out = wiola::infer::generate(lm.model(), ids, opt, cb, &st);
    for (size_t b = nb; b < B; ++b) out[b].tokens.clear();  // fillers: not counted
    for (size_t b = 0; b < nb; ++b) total.new_tokens += int64_t(out[b].tokens.size());
    for (size_t b = 0; b < nb; ++b) total.prompt_tokens += int64_t(ids[b].size());
    total.decode_s += st.decode_s;
    total.prefill_s += st.prefill_s;
    if (a.check) rc |= report_greedy_check(lm.model(), ids, out);
  }
  print_stats(total);
  return rc;
}

}  // namespace

int wiola_cmd_generate(int argc, char** argv) {
  CLI::App app{"Generate text from a checkpoint (KV-cached decoding, ATM off)", "wiola generate"};
  Args a;
  app.add_option("--checkpoint", a.checkpoint, "checkpoint folder (step-N) or checkpoint directory")->required();
  auto* one = app.add_option("--prompt", a.prompt, "the prompt text; the continuation streams to stdout");
  auto* many = app.add_option("--prompts", a.prompts_file,
                              "a file with one prompt per line, decoded in batches; one JSON line per prompt");
  one->excludes(many);
  app.add_option("--max-new-tokens", a.gen.max_new_tokens, "tokens to generate at most per prompt")
      ->capture_default_str();
  app.add_option("--temperature", a.gen.sampling.temperature, "sampling temperature (0: greedy)")
      ->capture_default_str();
  app.add_option("--top-k", a.gen.sampling.top_k, "sample from the k most likely tokens (0: all)")
      ->capture_default_str();
  app.add_option("--top-p", a.gen.sampling.top_p, "nucleus sampling: the smallest set reaching probability p")
      ->capture_default_str();
  app.add_option("--seed", a.gen.sampling.seed, "seed of the sampling (counter-based per prompt and position)")
      ->capture_default_str();
  app.add_flag("--greedy", a.greedy, "argmax decoding (same as --temperature 0)");
  app.add_flag("--no-eos", a.no_eos, "do not stop at the end-of-document token");
  app.add_option("--batch", a.batch, "prompts decoded together (--prompts)")->capture_default_str();
  app.add_option("--tokenizer", a.tokenizer, "tokenizer.json to use instead of the checkpoint's");
  app.add_flag("--any-tokenizer", a.any_tokenizer, "accept a --tokenizer other than the training data's");
  app.add_option("--backend", a.backend, "op backend: cpu, cpu-opaque, cpu-bf16; cuda, cuda-fp32 in CUDA builds")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: OpenMP default)");
  app.add_flag("--check-greedy", a.check,
               "greedy only: compare every token with the argmax of the full forward; exit 1 on a difference");
  if (int rc = wiola::cli::parse(app, argc, argv, "generate"); rc >= 0) return rc;
  WIOLA_CHECK(one->count() || many->count(), "give --prompt TEXT or --prompts FILE");
  WIOLA_CHECK(!one->count() || !a.prompt.empty(), "--prompt: empty prompt");
  WIOLA_CHECK(a.batch >= 1, "--batch must be positive");
  if (a.greedy) a.gen.sampling.temperature = 0;
  a.gen.sampling.validate();
  WIOLA_CHECK(!a.check || a.gen.sampling.greedy(), "--check-greedy needs greedy decoding (--greedy)");
  if (a.threads > 0) wiola::set_cpu_threads(a.threads);
  return one->count() ? run_one(a) : run_file(a);
}
