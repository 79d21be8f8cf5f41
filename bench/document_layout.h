// The benchmarks' packed documents (bench/attention_bench.cpp's
// BM_attention_documents on the CPU, wiola_kernel_bench's "attention
// documents" row on the GPU): one layout for both, so that their ratios
// describe the same windows.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace wiola::bench {

// doc_start [B, T] (AttnKeys::doc_start) of windows holding documents of
// random lengths with mean about mean_len (1 + an exponential of that mean,
// seeded: the same layout every run), one stream of lengths across the B
// windows' rows in order.
inline std::vector<int32_t> random_documents(int B, int T, int mean_len, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> len(1.0 / mean_len);
  std::vector<int32_t> starts(size_t(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0, start = 0, next = int(len(rng)) + 1; t < T; ++t) {
      if (t == next) start = t, next = t + int(len(rng)) + 1;
      starts[size_t(b) * T + t] = start;
    }
  return starts;
}

// The (query tile, key tile) pairs of `tile` rows that plain self-attention
// visits over doc_start [B, T] (nullptr: one causal document per window):
// query tile q sees the key tiles from its first row's document start to its
// last row (the CUDA kernels' loops, forward and backward alike).
inline long attention_tiles_visited(int B, int T, const int32_t* doc_start, int tile = 64) {
  long n = 0;
  for (int b = 0; b < B; ++b)
    for (int i0 = 0; i0 < T; i0 += tile) {
      const int first = doc_start ? doc_start[size_t(b) * T + i0] / tile : 0;
      n += i0 / tile - first + 1;
    }
  return n;
}

}  // namespace wiola::bench
