#include "data/bpe_trainer.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "data/bpe.h"
#include "data/byte_level.h"
#include "data/pretokenizer.h"
#include "data/text_input.h"
#include "util/error.h"

namespace wiola {
namespace {

using WordCounts = std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>>;

// Counts the pre-tokenized pieces of `text`, split at line ends across threads.
void count_words(std::string_view text, const PreTokenizer& pre, int threads, WordCounts& total) {
  std::vector<size_t> cuts{0};
  size_t step = text.size() / size_t(threads) + 1;
  for (int t = 1; t < threads; ++t) {
    size_t c = std::max(cuts.back(), std::min(text.size(), size_t(t) * step));
    while (c < text.size() && text[c - 1] != '\n') ++c;
    cuts.push_back(c);
  }
  cuts.push_back(text.size());
  std::vector<WordCounts> local(threads);
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) {
    PreTokenizer::Scratch scratch;
    std::vector<std::string_view> pieces;
    std::string_view part = text.substr(cuts[t], cuts[t + 1] - cuts[t]);
    size_t pos = 0;
    while (pos < part.size()) {  // line by line, each with its '\n'
      size_t e = part.find('\n', pos);
      e = e == std::string_view::npos ? part.size() : e + 1;
      pieces.clear();
      pre.split(part.substr(pos, e - pos), pieces, scratch);
      for (std::string_view p : pieces) {
        auto it = local[t].find(p);
        if (it == local[t].end())
          local[t].emplace(std::string(p), 1);
        else
          ++it->second;
      }
      pos = e;
    }
  }
  for (auto& l : local)
    for (auto& [w, c] : l) total[w] += c;
}

inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace

std::string train_bpe(const std::vector<std::string>& files, const BpeTrainOptions& opt) {
  WIOLA_CHECK(!files.empty(), "tokenizer train: no input files");
  int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  uint32_t base = uint32_t(opt.special_tokens.size()) + 256;
  WIOLA_CHECK(opt.vocab_size >= base, "vocab size ", opt.vocab_size, " is smaller than the ", base,
              " special and byte tokens");
  PreTokenizer pre(true);
  WordCounts counts;
  uint64_t bytes = 0;
  for (const std::string& f : files) {
    std::string text = read_file(f);
    size_t bad = 0;
    if (!valid_utf8(text, &bad)) fail(f, ": invalid UTF-8 at byte offset ", bad);
    bytes += text.size();
    count_words(text, pre, threads, counts);
  }
  WIOLA_CHECK(!counts.empty(), "tokenizer train: the input files hold no text");
  if (opt.progress) std::fprintf(stderr, "train: %llu bytes, %zu distinct words\n", (unsigned long long)bytes, counts.size());

  // Vocabulary: special tokens, then the 256 byte characters in code point order (as HF).
  std::vector<std::string> id_to_tok;
  TokenIndex vocab;
  for (const std::string& s : opt.special_tokens) {
    WIOLA_CHECK(!vocab.count(s), "special token '", s, "' given twice");
    vocab.emplace(s, int32_t(id_to_tok.size()));
    id_to_tok.push_back(s);
  }
  std::vector<std::pair<uint32_t, uint8_t>> alphabet;
  for (int b = 0; b < 256; ++b) alphabet.emplace_back(byte_to_codepoint(uint8_t(b)), uint8_t(b));
  std::sort(alphabet.begin(), alphabet.end());
  int32_t byte_tok[256];
  for (auto [cp, b] : alphabet) {
    const std::string& s = byte_char(b);
    auto it = vocab.find(s);
    if (it != vocab.end()) {
      byte_tok[b] = it->second;
      continue;
    }
    byte_tok[b] = int32_t(id_to_tok.size());
    vocab.emplace(s, byte_tok[b]);
    id_to_tok.push_back(s);
  }

  // Words as symbol sequences with counts; pair counts and where each pair occurs.
  std::vector<std::vector<int32_t>> words;
  std::vector<uint64_t> wcount;
  words.reserve(counts.size());
  for (auto& [w, c] : counts) {
    std::vector<int32_t> syms;
    for (unsigned char ch : w) syms.push_back(byte_tok[ch]);
    words.push_back(std::move(syms));
    wcount.push_back(c);
  }
  counts.clear();
  std::unordered_map<uint64_t, int64_t> pc;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  for (uint32_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t k = pair_key(words[w][i], words[w][i + 1]);
      pc[k] += int64_t(wcount[w]);
      where[k].push_back(w);
    }
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Entry> heap;
  for (auto& [k, c] : pc) heap.push(Entry{c, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<uint32_t> stamp(words.size(), 0);
  uint32_t round = 0;
  std::vector<int32_t> fresh;
  while (id_to_tok.size() < opt.vocab_size && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    auto pit = pc.find(top.key);
    int64_t actual = pit == pc.end() ? 0 : pit->second;
    if (actual != top.count) {
      if (actual > 0) heap.push(Entry{actual, top.key});
      continue;
    }
    if (uint64_t(actual) < std::max<uint64_t>(opt.min_frequency, 1)) break;
    int32_t a = int32_t(top.key >> 32), b = int32_t(uint32_t(top.key));
    std::string merged = id_to_tok[a] + id_to_tok[b];
    int32_t nid;
    auto vit = vocab.find(merged);
    if (vit != vocab.end()) {
      nid = vit->second;
    } else {
      nid = int32_t(id_to_tok.size());
      vocab.emplace(merged, nid);
      id_to_tok.push_back(merged);
    }
    merges.emplace_back(a, b);
    ++round;
    std::vector<uint32_t> ws = std::move(where[top.key]);
    where.erase(top.key);
    std::unordered_map<uint64_t, int64_t> delta;
    for (uint32_t w : ws) {
      if (stamp[w] == round) continue;
      stamp[w] = round;
      std::vector<int32_t>& s = words[w];
      fresh.clear();
      bool hit = false;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          fresh.push_back(nid);
          ++i;
          hit = true;
        } else {
          fresh.push_back(s[i]);
        }
      }
      if (!hit) continue;
      int64_t c = int64_t(wcount[w]);
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= c;
      for (size_t i = 0; i + 1 < fresh.size(); ++i) {
        uint64_t k = pair_key(fresh[i], fresh[i + 1]);
        delta[k] += c;
        if (fresh[i] == nid || fresh[i + 1] == nid) where[k].push_back(w);
      }
      s.swap(fresh);
    }
    for (auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& v = pc[k];
      v += d;
      if (d > 0) heap.push(Entry{v, k});
      if (v <= 0) pc.erase(k);
    }
    if (opt.progress && merges.size() % 2000 == 0)
      std::fprintf(stderr, "train: %zu merges, vocab %zu\n", merges.size(), id_to_tok.size());
  }

  using ojson = nlohmann::ordered_json;
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  ojson added = ojson::array();
  for (size_t i = 0; i < opt.special_tokens.size(); ++i)
    added.push_back({{"id", i}, {"content", opt.special_tokens[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  ojson v = ojson::object();
  for (size_t i = 0; i < id_to_tok.size(); ++i) v[id_to_tok[i]] = i;
  ojson mj = ojson::array();
  for (auto [a, b] : merges) mj.push_back(ojson::array({id_to_tok[a], id_to_tok[b]}));
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},
                {"unk_token", nullptr},   {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", v},             {"merges", mj}};
  return j.dump(2);
}

}  // namespace wiola
