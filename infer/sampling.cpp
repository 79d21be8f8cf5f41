#include "infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "util/error.h"

namespace wiola::infer {

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

void SamplingOptions::validate() const {
  WIOLA_CHECK(std::isfinite(temperature) && temperature >= 0, "--temperature ", temperature, ": must be >= 0");
  WIOLA_CHECK(top_k >= 0, "--top-k ", top_k, ": must be >= 0 (0: no limit)");
  WIOLA_CHECK(top_p > 0 && top_p <= 1, "--top-p ", top_p, ": must be in (0, 1]");
}

double counter_uniform(uint64_t seed, uint64_t sequence, uint64_t position) {
  const uint64_t x = mix(mix(seed) ^ mix(sequence * 2 + 1) ^ mix(position * 2));
  return double(x >> 11) * 0x1.0p-53;
}

int32_t argmax(const float* logits, int V) {
  int32_t best = 0;
  for (int v = 1; v < V; ++v)
    if (logits[v] > logits[best]) best = v;
  return best;
}

int32_t sample_token(const float* logits, int V, const SamplingOptions& opt, uint64_t sequence,
                     uint64_t position) {
  if (opt.greedy()) return argmax(logits, V);
  // Candidates by descending logit (ties: lower id first), cut to top-k.
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const size_t k = opt.top_k > 0 ? std::min(size_t(opt.top_k), ids.size()) : ids.size();
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), by_logit);
  ids.resize(k);
  // Softmax of logits / temperature in double, from the largest.
  std::vector<double> p(k);
  const double top = double(logits[ids[0]]);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp((double(logits[ids[i]]) - top) / opt.temperature);
  // Nucleus: the shortest prefix whose probability reaches top_p (at least one id).
  size_t n = k;
  if (opt.top_p < 1.0) {
    double acc = 0;
    for (n = 0; n < k;) {
      acc += p[n++] / sum;
      if (acc >= opt.top_p) break;
    }
  }
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += p[i];
  const double u = counter_uniform(opt.seed, sequence, position) * kept;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[n - 1];
}

}  // namespace wiola::infer
