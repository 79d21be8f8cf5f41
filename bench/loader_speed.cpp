// Loader throughput: samples/s of TokenLoader::next_batch with prefetch on
// and off, on a prep output (manifest) or shard.
//   wiola_loader_speed SOURCE [T=2048] [GLOBAL_BATCH=8] [BATCHES=200]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "data/loader.h"
#include "util/error.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SOURCE [T] [GLOBAL_BATCH] [BATCHES]\n", argv[0]);
    return 2;
  }
  int T = argc > 2 ? std::atoi(argv[2]) : 2048;
  int G = argc > 3 ? std::atoi(argv[3]) : 8;
  int batches = argc > 4 ? std::atoi(argv[4]) : 200;
  try {
    for (bool prefetch : {false, true}) {
      wiola::TokenLoader l(argv[1], "train", T, G, 0, 1, 1, true, prefetch);
      std::vector<int32_t> buf(size_t(G) * size_t(T + 1));
      l.next_batch(buf.data());  // warm-up: permutation, first chunks
      auto t0 = std::chrono::steady_clock::now();
      for (int b = 0; b < batches; ++b) l.next_batch(buf.data());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("prefetch=%d T=%d G=%d: %.0f samples/s (%.1f M tokens/s), %llu samples/epoch\n", int(prefetch), T, G,
                  batches * G / s, batches * G * double(T) / s / 1e6, (unsigned long long)l.info().num_samples);
    }
    // With a simulated 20 ms training step, how long does next_batch wait?
    wiola::TokenLoader l(argv[1], "train", T, G, 0, 1, 2, true, true);
    std::vector<int32_t> buf(size_t(G) * size_t(T + 1));
    double waited = 0;
    for (int b = 0; b < 50; ++b) {
      auto t0 = std::chrono::steady_clock::now();
      l.next_batch(buf.data());
      waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::printf("with a 20 ms step: next_batch waited %.3f ms per step on average\n", waited / 50 * 1e3);
  } catch (const wiola::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
