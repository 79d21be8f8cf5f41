// A Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2, Wiola):
// added/special tokens are cut out first (leftmost-longest, as HF does even
// with add_special_tokens=False), the rest is split by the GPT-2 pattern, each
// piece's bytes are merged by BPE. encode() gives HF's ids for any valid UTF-8;
// decode(encode(x)) == x. Thread-safe: each thread keeps its own word cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/bpe.h"

namespace wiola {

class PreTokenizer;

struct AddedToken {
  int32_t id;
  std::string content;
  bool special = true;
};

class Tokenizer {
 public:
  // Loads `path`; throws wiola::Error naming the file when it is missing,
  // not JSON, or of a kind this code does not implement.
  static Tokenizer load(const std::string& path);
  // From the JSON text; `origin` names it in errors. sha256 is of `json_text`.
  static Tokenizer from_json_text(const std::string& json_text, const std::string& origin);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Appends the ids of `text`. parse_special: cut out added tokens written in
  // the text (HF behaviour); false treats them as plain text. Throws on
  // invalid UTF-8 (naming the byte offset).
  void encode(std::string_view text, std::vector<int32_t>& out, bool parse_special = true) const;
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Inverse of encode (special tokens come back as their text). Throws on an
  // id that is not in the vocabulary.
  std::string decode(const int32_t* ids, size_t n) const;
  std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), ids.size()); }

  // Ids are integers below this (the largest vocabulary the embedding and
  // the shards' uint32 tokens are meant for; it bounds what a file can make
  // us allocate).
  static constexpr int64_t kMaxVocab = int64_t(1) << 24;
  uint32_t vocab_size() const { return vocab_size_; }  // max id + 1
  int32_t token_to_id(std::string_view token) const;   // added tokens or vocab (byte-level spelling); -1
  // The end-of-document id: "<eos>", "</s>", "<|endoftext|>" or "<|end_of_text|>"; -1 if none.
  int32_t eos_id() const { return eos_id_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  const BpeModel& model() const { return *bpe_; }
  const std::string& sha256() const { return sha256_; }  // of the JSON file's bytes
  const std::string& origin() const { return origin_; }

 private:
  Tokenizer();
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  int64_t read_json(const nlohmann::json& j, const std::string& origin, bool& use_regex);
  struct Workspace;
  Workspace& workspace() const;

  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<PreTokenizer> pre_;
  std::vector<AddedToken> added_;  // sorted by content length, longest first
  uint32_t added_first_bytes_[8] = {};  // bitset of first bytes of added tokens
  std::vector<std::string> id_bytes_;  // id -> raw bytes ("" + !id_valid_ for gaps)
  std::vector<uint8_t> id_valid_;
  uint32_t vocab_size_ = 0;
  int32_t eos_id_ = -1;
  std::string sha256_, origin_;
  uint64_t uid_ = 0;
};

}  // namespace wiola
