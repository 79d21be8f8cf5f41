#include "infer/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "util/error.h"

namespace wiola::infer {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check_prompts(const std::vector<std::vector<int32_t>>& prompts, const ModelConfig& cfg, int B) {
  WIOLA_CHECK(!prompts.empty(), "no prompt to decode");
  WIOLA_CHECK(int(prompts.size()) == B, prompts.size(), " prompts for a model built for batches of ", B);
  for (size_t b = 0; b < prompts.size(); ++b) {
    WIOLA_CHECK(!prompts[b].empty(), "prompt ", b + 1, " is empty (it encodes to no token)");
    WIOLA_CHECK(int(prompts[b].size()) <= cfg.T, "prompt ", b + 1, " has ", prompts[b].size(),
                " tokens, more than the model's context of ", cfg.T, " (model.seq_len)");
    for (int32_t id : prompts[b])
      WIOLA_CHECK(id >= 0 && id < cfg.V, "prompt ", b + 1, ": token id ", id, " outside the vocabulary [0, ", cfg.V, ")");
  }
}

// Per-sequence progress through one batched decode.
struct Decoder {
  const std::vector<std::vector<int32_t>>& prompts;
  const GenerateOptions& opt;
  const GenerateCallbacks& cb;
  std::vector<Completion> out;
  std::vector<bool> done;
  int active;

  Decoder(const std::vector<std::vector<int32_t>>& p, const GenerateOptions& o, const GenerateCallbacks& c)
      : prompts(p), opt(o), cb(c), out(p.size()), done(p.size(), false), active(int(p.size())) {}

  void finish(size_t b, StopReason why) {
    out[b].stop = why;
    done[b] = true;
    --active;
    if (cb.on_done) cb.on_done(int(b), out[b]);
  }
  // Logits row `row` [V] predicts position `pos` of every sequence; those
  // past their prompt choose a token there.
  void choose(const std::vector<float>& logits, int V, int pos) {
    for (size_t b = 0; b < prompts.size(); ++b) {
      if (done[b] || pos < int(prompts[b].size())) continue;
      if (opt.max_new_tokens == 0) {
        finish(b, StopReason::MaxNewTokens);
        continue;
      }
      const int32_t id = sample_token(logits.data() + b * size_t(V), V, opt.sampling, opt.first_index + b, uint64_t(pos));
      out[b].tokens.push_back(id);
      if (cb.on_token) cb.on_token(int(b), id);
      if (id == opt.eos_id) finish(b, StopReason::Eos);
      else if (int(out[b].tokens.size()) >= opt.max_new_tokens) finish(b, StopReason::MaxNewTokens);
    }
  }
  // The id every sequence is fed at position `pos` (a finished one repeats
  // its last: its results are ignored).
  int32_t input(size_t b, int pos) const {
    const auto& p = prompts[b];
    if (pos < int(p.size())) return p[size_t(pos)];
    return out[b].tokens.empty() ? p.back() : out[b].tokens.back();
  }
};

// Last-position rows [B, V] of logits [B, n, V].
std::vector<float> last_rows(const std::vector<float>& logits, int B, int n, int V) {
  std::vector<float> r(size_t(B) * V);
  for (int b = 0; b < B; ++b)
    std::copy_n(logits.begin() + (ptrdiff_t(b) * n + n - 1) * V, V, r.begin() + ptrdiff_t(b) * V);
  return r;
}
}  // namespace

const char* stop_name(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::MaxNewTokens: return "max_new_tokens";
    case StopReason::Context: return "context";
  }
  return "?";
}

std::vector<Completion> generate(Model<float>& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& opt, const GenerateCallbacks& cb, GenerateStats* stats) {
  const ModelConfig& cfg = model.config();
  const int B = model.options().micro_batch, V = cfg.V, T = cfg.T;
  check_prompts(prompts, cfg, B);
  opt.sampling.validate();
  WIOLA_CHECK(opt.max_new_tokens >= 0, "max new tokens must be >= 0");
  Decoder dec(prompts, opt, cb);
  KvCache<float> cache = model.make_cache(T);

  // Prefill: the positions every prompt has, in one chunk.
  size_t p0 = prompts[0].size();
  for (const auto& p : prompts) p0 = std::min(p0, p.size());
  std::vector<int32_t> ids(size_t(B) * p0);
  for (int b = 0; b < B; ++b) std::copy_n(prompts[size_t(b)].begin(), p0, ids.begin() + ptrdiff_t(b) * p0);
  auto t0 = Clock::now();
  std::vector<float> rows = last_rows(model.forward_cached(ids.data(), int(p0), cache), B, int(p0), V);
  if (stats) stats->prefill_s = seconds_since(t0);
  t0 = Clock::now();

  // One position at a time: choose at `pos`, then feed it.
  int pos = int(p0);
  for (;;) {
    dec.choose(rows, V, pos);
    if (dec.active == 0) break;
    if (pos == T) {  // positions 0..T-1 are all in the cache
      for (size_t b = 0; b < prompts.size(); ++b)
        if (!dec.done[b]) dec.finish(b, StopReason::Context);
      break;
    }
    std::vector<int32_t> next(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) next[size_t(b)] = dec.input(size_t(b), pos);
    rows = model.forward_cached(next.data(), 1, cache);
    ++pos;
  }
  if (stats) {
    stats->decode_s = seconds_since(t0);
    stats->positions = cache.len;
    stats->prompt_tokens = stats->new_tokens = 0;
    for (size_t b = 0; b < prompts.size(); ++b) {
      stats->prompt_tokens += int64_t(prompts[b].size());
      stats->new_tokens += int64_t(dec.out[b].tokens.size());
    }
  }
  return std::move(dec.out);
}

GreedyCheck check_greedy(Model<float>& model, const std::vector<std::vector<int32_t>>& prompts,
                         const std::vector<Completion>& out, double tie) {
  const ModelConfig& cfg = model.config();
  const int B = model.options().micro_batch, V = cfg.V, T = cfg.T;
  check_prompts(prompts, cfg, B);
  WIOLA_CHECK(out.size() == prompts.size(), "one completion per prompt");
  // Inputs [B, T]: prompt + completion, cut to T and padded with its last
  // id (the model is causal: padding after a position cannot change it).
  std::vector<int32_t> in(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    std::vector<int32_t> s = prompts[size_t(b)];
    s.insert(s.end(), out[size_t(b)].tokens.begin(), out[size_t(b)].tokens.end());
    for (int t = 0; t < T; ++t) in[size_t(b) * T + size_t(t)] = s[std::min(size_t(t), s.size() - 1)];
  }
  const std::vector<float> logits = model.forward_logits(in.data(), false);
  GreedyCheck r;
  for (int b = 0; b < B; ++b) {
    const int len = int(prompts[size_t(b)].size());
    const auto& gen = out[size_t(b)].tokens;
    for (size_t j = 0; j < gen.size(); ++j) {
      const int pos = len + int(j);  // predicted from logits row pos - 1
      const float* row = logits.data() + (size_t(b) * T + size_t(pos - 1)) * V;
      const int32_t best = argmax(row, V);
      float second = -INFINITY;
      for (int v = 0; v < V; ++v)
        if (v != best) second = std::max(second, row[v]);
      ++r.positions;
      if (double(row[best]) - double(second) < tie) ++r.exempt;
      else if (best == gen[j]) ++r.equal;
      else if (r.differ++ == 0)
        r.first_difference = "sequence " + std::to_string(b + 1) + ", position " + std::to_string(pos) +
                             ": decoded " + std::to_string(gen[j]) + ", full forward's argmax " + std::to_string(best);
    }
  }
  return r;
}

}  // namespace wiola::infer
