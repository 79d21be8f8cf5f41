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
        if (it == local[t].end()) local[t].emplace(std::string(p), 1);
        else ++it->second;
      }
      pos = e;
    }
  }
  for (auto& l : local)
    for (auto& [w, c] : l) total[w] += c;
}

inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// The words of every file, counted; fails on a file that is not UTF-8.
WordCounts count_file_words(const std::vector<std::string>& files, int threads, bool progress) {
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
  if (progress)
    std::fprintf(stderr, "train: %llu bytes, %zu distinct words\n", (unsigned long long)bytes, counts.size());
  return counts;
}

// The vocabulary being built: tokens by id, ids by token, and each byte's token.
struct Vocabulary {
  std::vector<std::string> id_to_tok;
  TokenIndex index;
  int32_t byte_tok[256];

  // The token's id, a new one if it is not there yet.
  int32_t add(const std::string& s) {
    auto it = index.find(s);
    if (it != index.end()) return it->second;
    const auto id = int32_t(id_to_tok.size());
    index.emplace(s, id);
    id_to_tok.push_back(s);
    return id;
  }
};

// Special tokens, then the 256 byte characters in code point order (as HF).
Vocabulary initial_vocabulary(const std::vector<std::string>& special_tokens) {
  Vocabulary v;
  for (const std::string& s : special_tokens) {
    WIOLA_CHECK(!v.index.count(s), "special token '", s, "' given twice");
    v.add(s);
  }
  std::vector<std::pair<uint32_t, uint8_t>> alphabet;
  for (int b = 0; b < 256; ++b) alphabet.emplace_back(byte_to_codepoint(uint8_t(b)), uint8_t(b));
  std::sort(alphabet.begin(), alphabet.end());
  for (auto [cp, b] : alphabet) v.byte_tok[b] = v.add(byte_char(b));
  return v;
}

// Words as symbol sequences with counts; pair counts, where each pair occurs,
// and a max-heap of pair counts (stale entries are skipped when popped).
class PairCounts {
 public:
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };

  PairCounts(WordCounts& counts, const int32_t (&byte_tok)[256]) {
    words_.reserve(counts.size());
    for (auto& [w, c] : counts) {
      std::vector<int32_t> syms;
      for (unsigned char ch : w) syms.push_back(byte_tok[ch]);
      words_.push_back(std::move(syms));
      wcount_.push_back(c);
    }
    counts.clear();
    for (uint32_t w = 0; w < words_.size(); ++w)
      for (size_t i = 0; i + 1 < words_[w].size(); ++i) {
        uint64_t k = pair_key(words_[w][i], words_[w][i + 1]);
        pc_[k] += int64_t(wcount_[w]);
        where_[k].push_back(w);
      }
    for (auto& [k, c] : pc_) heap_.push(Entry{c, k});
    stamp_.assign(words_.size(), 0);
  }

  // The most frequent pair and its count (count 0: none left).
  Entry best() {
    while (!heap_.empty()) {
      Entry top = heap_.top();
      heap_.pop();
      auto pit = pc_.find(top.key);
      int64_t actual = pit == pc_.end() ? 0 : pit->second;
      if (actual == top.count) return top;
      if (actual > 0) heap_.push(Entry{actual, top.key});
    }
    return Entry{0, 0};
  }

  // Replaces pair `key` by token `nid` in every word that holds it.
  void merge(uint64_t key, int32_t nid) {
    const int32_t a = int32_t(key >> 32), b = int32_t(uint32_t(key));
    ++round_;
    std::vector<uint32_t> ws = std::move(where_[key]);
    where_.erase(key);
    std::unordered_map<uint64_t, int64_t> delta;
    for (uint32_t w : ws) {
      if (stamp_[w] == round_) continue;
      stamp_[w] = round_;
      std::vector<int32_t>& s = words_[w];
      fresh_.clear();
      bool hit = false;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          fresh_.push_back(nid);
          ++i;
          hit = true;
        } else {
          fresh_.push_back(s[i]);
        }
      }
      if (!hit) continue;
      int64_t c = int64_t(wcount_[w]);
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= c;
      for (size_t i = 0; i + 1 < fresh_.size(); ++i) {
        uint64_t k = pair_key(fresh_[i], fresh_[i + 1]);
        delta[k] += c;
        if (fresh_[i] == nid || fresh_[i + 1] == nid) where_[k].push_back(w);
      }
      s.swap(fresh_);
    }
    for (auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& v = pc_[k];
      v += d;
      if (d > 0) heap_.push(Entry{v, k});
      if (v <= 0) pc_.erase(k);
    }
  }

 private:
  std::vector<std::vector<int32_t>> words_;
  std::vector<uint64_t> wcount_;
  std::unordered_map<uint64_t, int64_t> pc_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where_;
  std::priority_queue<Entry> heap_;
  std::vector<uint32_t> stamp_;  // the round that last visited each word
  uint32_t round_ = 0;
  std::vector<int32_t> fresh_;  // a word being rewritten
};

// Merges the most frequent pair until the vocabulary is full or the best
// pair is rarer than min_frequency; returns the merges in order.
std::vector<std::pair<int32_t, int32_t>> learn_merges(PairCounts& pairs, Vocabulary& vocab,
                                                      const BpeTrainOptions& opt) {
  std::vector<std::pair<int32_t, int32_t>> merges;
  while (vocab.id_to_tok.size() < opt.vocab_size) {
    const PairCounts::Entry top = pairs.best();
    if (top.count == 0) break;
    if (uint64_t(top.count) < std::max<uint64_t>(opt.min_frequency, 1)) break;
    int32_t a = int32_t(top.key >> 32), b = int32_t(uint32_t(top.key));
    const int32_t nid = vocab.add(vocab.id_to_tok[a] + vocab.id_to_tok[b]);
    merges.emplace_back(a, b);
    pairs.merge(top.key, nid);
    if (opt.progress && merges.size() % 2000 == 0)
      std::fprintf(stderr, "train: %zu merges, vocab %zu\n", merges.size(), vocab.id_to_tok.size());
  }
  return merges;
}

// The Hugging Face tokenizer.json (GPT-2 byte-level kind).
std::string tokenizer_json(const std::vector<std::string>& special_tokens, const std::vector<std::string>& id_to_tok,
                           const std::vector<std::pair<int32_t, int32_t>>& merges) {
  using ojson = nlohmann::ordered_json;
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  ojson added = ojson::array();
  for (size_t i = 0; i < special_tokens.size(); ++i)
    added.push_back({{"id", i},
                     {"content", special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  ojson v = ojson::object();
  for (size_t i = 0; i < id_to_tok.size(); ++i) v[id_to_tok[i]] = i;
  ojson mj = ojson::array();
  for (auto [a, b] : merges) mj.push_back(ojson::array({id_to_tok[a], id_to_tok[b]}));
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", v},
                {"merges", mj}};
  return j.dump(2);
}

}  // namespace

std::string train_bpe(const std::vector<std::string>& files, const BpeTrainOptions& opt) {
  WIOLA_CHECK(!files.empty(), "tokenizer train: no input files");
  int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  uint32_t base = uint32_t(opt.special_tokens.size()) + 256;
  WIOLA_CHECK(opt.vocab_size >= base, "vocab size ", opt.vocab_size, " is smaller than the ", base,
              " special and byte tokens");
  WordCounts counts = count_file_words(files, threads, opt.progress);
  Vocabulary vocab = initial_vocabulary(opt.special_tokens);
  PairCounts pairs(counts, vocab.byte_tok);
  const auto merges = learn_merges(pairs, vocab, opt);
  return tokenizer_json(opt.special_tokens, vocab.id_to_tok, merges);
}

}  // namespace wiola
