// KV-cached decoding of a batch of prompts (ATM off, as in evaluation;
// docs/inference.md). Prompts of different lengths share one cache without
// padding: every sequence is at the same position at every step, and a
// sequence whose prompt is shorter starts sampling while a longer one is
// still being fed its prompt. Positions never exceed the model's context:
// a sequence holds at most T + 1 tokens (T inputs predict position T).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "infer/sampling.h"
#include "model/model.h"

namespace wiola::infer {

struct GenerateOptions {
  SamplingOptions sampling;
  int max_new_tokens = 128;
  int32_t eos_id = -1;  // stop a sequence when it samples this id (-1: never)
  // Index of prompts[0] among all prompts: prompt i samples from random
  // stream first_index + i, so its continuation does not depend on the
  // batch it was decoded in.
  uint64_t first_index = 0;
};

enum class StopReason { Eos, MaxNewTokens, Context };
const char* stop_name(StopReason r);

struct Completion {
  std::vector<int32_t> tokens;  // generated ids (the eos that stopped it included)
  StopReason stop = StopReason::MaxNewTokens;
};

struct GenerateStats {
  int64_t prompt_tokens = 0, new_tokens = 0;  // summed over the batch
  int64_t positions = 0;                      // forward positions run (per sequence)
  double prefill_s = 0, decode_s = 0;
};

// Called as each token is chosen (sequence index, id) and when a sequence
// stops (sequence index, its completion); either may be empty.
struct GenerateCallbacks {
  std::function<void(int, int32_t)> on_token;
  std::function<void(int, const Completion&)> on_done;
};

// Decodes every prompt (host ids; model micro-batch == prompts.size(), the
// whole layer range). Throws naming the prompt when one is empty or longer
// than the context T.
std::vector<Completion> generate(Model<float>& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& opt, const GenerateCallbacks& cb = {},
                                 GenerateStats* stats = nullptr);

// The check of docs/inference.md: every greedily generated token equals the
// argmax of the full forward (no cache) over prompt + completion at its
// position. Positions whose top-2 logits are closer than `tie` are exempt.
struct GreedyCheck {
  int64_t positions = 0, equal = 0, exempt = 0, differ = 0;
  std::string first_difference;  // where, when differ > 0
};
GreedyCheck check_greedy(Model<float>& model, const std::vector<std::vector<int32_t>>& prompts,
                         const std::vector<Completion>& out, double tie = 1e-4);

}  // namespace wiola::infer
