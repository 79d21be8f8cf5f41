// Encoding throughput of wiola's tokenizer on a text file, line by line (as
// `wiola tokenizer encode`): one thread (best of --repeat) and all threads.
// bench/tokenizer_bench.py runs this next to Hugging Face `tokenizers`.
//   wiola_tokenizer_speed TOKENIZER TEXT [REPEAT]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/text_input.h"
#include "data/tokenizer.h"
#include "util/error.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER TEXT [REPEAT]\n", argv[0]);
    return 2;
  }
  try {
    int repeat = argc > 3 ? std::atoi(argv[3]) : 3;
    std::string text = wiola::read_file(argv[2]);
    std::vector<std::string_view> lines;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t e = text.find('\n', pos);
      if (e == std::string::npos) e = text.size();
      lines.emplace_back(text.data() + pos, e - pos);
      pos = e + 1;
    }
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    wiola::Tokenizer tok = wiola::Tokenizer::load(argv[1]);
    double load_s = std::chrono::duration<double>(clock::now() - t0).count();
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeat; ++r) {
      // A fresh tokenizer each round: the word cache starts cold, as HF's does.
      wiola::Tokenizer cold = wiola::Tokenizer::load(argv[1]);
      std::vector<int32_t> ids;
      auto t1 = clock::now();
      tokens = 0;
      for (std::string_view l : lines) {
        ids.clear();
        cold.encode(l, ids, true);
        tokens += ids.size();
      }
      best = std::min(best, std::chrono::duration<double>(clock::now() - t1).count());
    }
    int threads = omp_get_max_threads();
    auto t2 = clock::now();
    size_t tokens_mt = 0;
#pragma omp parallel for schedule(dynamic, 256) reduction(+ : tokens_mt)
    for (size_t i = 0; i < lines.size(); ++i) tokens_mt += tok.encode(lines[i]).size();
    double mt = std::chrono::duration<double>(clock::now() - t2).count();
    double mb = double(text.size()) / 1e6;
    std::printf("bytes %zu\nlines %zu\ntokens %zu\nload_s %.3f\n", text.size(), lines.size(), tokens, load_s);
    std::printf("one_thread_s %.4f\none_thread_MBps %.2f\n", best, mb / best);
    std::printf("threads %d\nall_threads_MBps %.2f\n", threads, mb / mt);
    if (tokens_mt != tokens) std::printf("warning: token counts differ (%zu vs %zu)\n", tokens, tokens_mt);
  } catch (const wiola::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
