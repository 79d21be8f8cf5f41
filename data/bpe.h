// Byte-level BPE model: vocabulary, ranked merges and the merge loop of
// Hugging Face `tokenizers` (models/bpe/word.rs: a heap of (rank, position)
// candidates, lowest rank first, leftmost on ties, stale entries skipped).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace wiola {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  BpeModel() = default;
  // vocab: byte-level token string -> id. merges: pairs of byte-level token
  // strings, rank = position. Throws wiola::Error (prefixed by `origin`) when a
  // merge names a token that is not in the vocabulary.
  BpeModel(TokenIndex vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           bool ignore_merges, const std::string& origin);

  // Appends the ids of one pre-tokenized word (raw bytes).
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

  const TokenIndex& vocab() const { return vocab_; }
  size_t num_merges() const { return num_merges_; }
  int32_t byte_id(uint8_t b) const { return byte_id_[b]; }
  bool has_all_bytes() const;

 private:
  struct MergeValue {
    uint32_t rank;
    int32_t new_id;
  };
  // Open-addressing map (a,b) -> MergeValue.
  const MergeValue* find_merge(int32_t a, int32_t b) const {
    uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t mask = keys_.size() - 1;
    size_t h = size_t((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
    while (true) {
      if (keys_[h] == key) return &vals_[h];
      if (keys_[h] == kEmpty) return nullptr;
      h = (h + 1) & mask;
    }
  }
  static constexpr uint64_t kEmpty = ~0ull;

  TokenIndex vocab_;
  std::vector<uint64_t> keys_{kEmpty};
  std::vector<MergeValue> vals_{MergeValue{}};
  size_t num_merges_ = 0;
  int32_t byte_id_[256];
  bool ignore_merges_ = false;
};

}  // namespace wiola
