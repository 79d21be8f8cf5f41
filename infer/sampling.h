// Choosing the next token from a row of logits: greedy (temperature 0) or
// sampling with temperature, top-k and top-p (nucleus). The random numbers
// are counter-based (seed, sequence, position), so a prompt's continuation
// does not depend on which other prompts share its batch.
#pragma once

#include <cstdint>

namespace wiola::infer {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax, lowest id on a tie)
  int top_k = 0;             // keep the k most likely ids (0: all)
  double top_p = 1.0;        // keep the smallest set whose probability reaches p (1: all)
  uint64_t seed = 0;
  // Throws wiola::Error naming the option that is out of range.
  void validate() const;
  bool greedy() const { return temperature == 0.0; }
};

// Index of the largest of logits[0, V) (the lowest on a tie).
int32_t argmax(const float* logits, int V);

// The next token for `sequence` at `position` from logits[0, V).
int32_t sample_token(const float* logits, int V, const SamplingOptions& opt, uint64_t sequence,
                     uint64_t position);

// Uniform [0, 1) from (seed, sequence, position): splitmix64 counters.
double counter_uniform(uint64_t seed, uint64_t sequence, uint64_t position);

}  // namespace wiola::infer
