#include "data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/byte_level.h"
#include "data/pretokenizer.h"
#include "data/sha256.h"
#include "util/error.h"

namespace wiola {
namespace {
std::atomic<uint64_t> g_next_uid{1};
using json = nlohmann::json;

bool is_null_or(const json& j, const char* key, const json& value) {
  return !j.contains(key) || j[key].is_null() || j[key] == value;
}
}  // namespace

// Per-thread state: PCRE2 match data and a cache word bytes -> ids.
struct Tokenizer::Workspace {
  uint64_t owner = 0;
  PreTokenizer::Scratch scratch;
  std::vector<std::string_view> pieces;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> arena;
  static constexpr size_t kMaxEntries = 1 << 20;
  static constexpr size_t kMaxWordBytes = 128;
};

Tokenizer::Tokenizer() : uid_(g_next_uid++) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer::Workspace& Tokenizer::workspace() const {
  thread_local std::unique_ptr<Workspace> ws;
  if (!ws || ws->owner != uid_) {
    ws = std::make_unique<Workspace>();
    ws->owner = uid_;
  }
  return *ws;
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, ": cannot open tokenizer file: ", std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail(path, ": read error");
  return from_json_text(ss.str(), path);
}

namespace {
[[noreturn]] void unsupported(const std::string& origin, const std::string& what) {
  fail(origin, ": unsupported tokenizer.json: ", what, " (only byte-level BPE of the GPT-2 kind is implemented)");
}

// The file is of the kind implemented (byte-level BPE, no normalizer, no
// dropout...); returns the pre-tokenizer's use_regex.
bool check_supported(const json& j, const std::string& origin) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    fail(origin, ": not a tokenizer.json (no \"model\" object)");
  const json& m = j["model"];
  std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") unsupported(origin, "model.type is \"" + type + "\"");
  if (!m.contains("vocab") || !m["vocab"].is_object() || !m.contains("merges") || !m["merges"].is_array())
    fail(origin, ": model.vocab (object) or model.merges (array) missing");
  if (!is_null_or(m, "dropout", json()) && m["dropout"] != 0.0) unsupported(origin, "BPE dropout is set");
  if (!is_null_or(m, "continuing_subword_prefix", "")) unsupported(origin, "continuing_subword_prefix is set");
  if (!is_null_or(m, "end_of_word_suffix", "")) unsupported(origin, "end_of_word_suffix is set");
  if (m.value("byte_fallback", false)) unsupported(origin, "byte_fallback is true");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    unsupported(origin, "normalizer is " + (j["normalizer"].is_object() ? j["normalizer"].value("type", std::string("set"))
                                                                          : j["normalizer"].dump()));
  const json& p = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  if (!p.is_object() || p.value("type", std::string()) != "ByteLevel")
    unsupported(origin, "pre_tokenizer is not ByteLevel (" + (p.is_object() ? p.value("type", std::string("?")) : p.dump()) + ")");
  if (p.value("add_prefix_space", false)) unsupported(origin, "ByteLevel add_prefix_space is true");
  if (j.contains("decoder") && !j["decoder"].is_null() &&
      !(j["decoder"].is_object() && j["decoder"].value("type", std::string()) == "ByteLevel"))
    unsupported(origin, "decoder is not ByteLevel");
  return p.value("use_regex", true);
}

// Ids index the embedding table: integers in [0, kMaxVocab).
int32_t read_id(const json& v, const std::string& origin, const char* kind, const std::string& token) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= Tokenizer::kMaxVocab)
    fail(origin, ": ", kind, " \"", token, "\" has id ", v.dump(), ", not an integer from 0 to ",
         Tokenizer::kMaxVocab - 1);
  return int32_t(v.get<int64_t>());
}

// model.vocab, and each id's token (ids are unique: two tokens on one id
// could not both decode).
TokenIndex read_vocab(const json& vocab_json, const std::string& origin,
                      std::unordered_map<int32_t, std::string_view>& token_of_id) {
  TokenIndex vocab;
  vocab.reserve(vocab_json.size());
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
    const int32_t id = read_id(it.value(), origin, "model.vocab token", it.key());
    auto [where, fresh] = token_of_id.emplace(id, it.key());
    if (!fresh) fail(origin, ": model.vocab gives id ", id, " to both \"", where->second, "\" and \"", it.key(), "\"");
    vocab.emplace(it.key(), id);
  }
  return vocab;
}

// model.merges, each "a b" or [a, b].
std::vector<std::pair<std::string, std::string>> read_merges(const json& merges_json, const std::string& origin) {
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (const json& mj : merges_json) {
    if (mj.is_string()) {
      const std::string& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail(origin, ": merge \"", s, "\" is not two tokens separated by one space");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (mj.is_array() && mj.size() == 2) {
      merges.emplace_back(mj[0].get<std::string>(), mj[1].get<std::string>());
    } else {
      fail(origin, ": a merge is neither \"a b\" nor [a, b]");
    }
  }
  return merges;
}

// added_tokens. One may repeat a vocabulary token under its id, but no id
// may stand for two texts (it would decode as only one of them).
std::vector<AddedToken> read_added(const json& j, const std::string& origin,
                                   const std::unordered_map<int32_t, std::string_view>& token_of_id) {
  std::vector<AddedToken> added;
  if (!j.contains("added_tokens") || !j["added_tokens"].is_array()) return added;
  for (const json& a : j["added_tokens"]) {
    const std::string content = a.at("content").get<std::string>();
    AddedToken tok{read_id(a.at("id"), origin, "added token", content), content, a.value("special", false)};
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
      unsupported(origin, "added token \"" + tok.content + "\" has lstrip/rstrip/single_word");
    if (tok.content.empty()) fail(origin, ": an added token is empty");
    auto v = token_of_id.find(tok.id);
    std::string v_bytes;
    if (v != token_of_id.end() && (!byte_level_to_bytes(v->second, v_bytes) || v_bytes != tok.content))
      fail(origin, ": added token \"", tok.content, "\" has id ", tok.id, ", which model.vocab gives to \"", v->second,
           "\"");
    for (const AddedToken& other : added)
      if (other.id == tok.id && other.content != tok.content)
        fail(origin, ": added tokens \"", other.content, "\" and \"", tok.content, "\" share id ", tok.id);
    added.push_back(std::move(tok));
  }
  return added;
}
}  // namespace

// Reads the parsed file into bpe_ and added_; returns the largest id and
// sets use_regex. Throws wiola::Error, or json::exception on a mistyped field.
int64_t Tokenizer::read_json(const json& j, const std::string& origin, bool& use_regex) {
  use_regex = check_supported(j, origin);
  const json& m = j["model"];
  std::unordered_map<int32_t, std::string_view> token_of_id;  // views into j
  TokenIndex vocab = read_vocab(m["vocab"], origin, token_of_id);
  bpe_ = std::make_unique<BpeModel>(std::move(vocab), read_merges(m["merges"], origin), m.value("ignore_merges", false),
                                    origin);
  if (!bpe_->has_all_bytes())
    unsupported(origin, "model.vocab lacks some of the 256 byte-level characters (not a byte-level BPE)");
  added_ = read_added(j, origin, token_of_id);
  int64_t max_id = -1;
  for (const auto& [id, token] : token_of_id) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& a : added_) max_id = std::max<int64_t>(max_id, a.id);
  return max_id;
}

Tokenizer Tokenizer::from_json_text(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(origin, ": not a valid tokenizer.json (JSON parse error: ", e.what(), ")");
  }
  Tokenizer t;
  t.origin_ = origin;
  t.sha256_ = sha256_hex(text);
  bool use_regex = true;
  int64_t max_id = -1;
  // Every field may hold the wrong JSON type: nlohmann's type errors become
  // one message naming the file (wiola::Error passes through unchanged).
  try {
    max_id = t.read_json(j, origin, use_regex);
  } catch (const json::exception& e) {
    fail(origin, ": malformed tokenizer.json: ", e.what());
  }
  t.pre_ = std::make_unique<PreTokenizer>(use_regex);
  std::stable_sort(t.added_.begin(), t.added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (const AddedToken& a : t.added_) {
    uint8_t b = uint8_t(a.content[0]);
    t.added_first_bytes_[b >> 5] |= 1u << (b & 31);
  }
  t.vocab_size_ = uint32_t(max_id + 1);
  t.id_bytes_.assign(t.vocab_size_, std::string());
  t.id_valid_.assign(t.vocab_size_, 0);
  for (const auto& [tok, id] : t.bpe_->vocab()) {
    std::string bytes;
    byte_level_to_bytes(tok, bytes);
    t.id_bytes_[id] = std::move(bytes);
    t.id_valid_[id] = 1;
  }
  for (const AddedToken& a : t.added_) {
    t.id_bytes_[a.id] = a.content;
    t.id_valid_[a.id] = 1;
  }
  for (const char* name : {"<eos>", "</s>", "<|endoftext|>", "<|end_of_text|>"}) {
    int32_t id = t.token_to_id(name);
    if (id >= 0) {
      t.eos_id_ = id;
      break;
    }
  }
  return t;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  auto it = bpe_->vocab().find(token);
  return it == bpe_->vocab().end() ? -1 : it->second;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  Workspace& ws = workspace();
  ws.pieces.clear();
  pre_->split(text, ws.pieces, ws.scratch);
  for (std::string_view piece : ws.pieces) {
    if (piece.size() > Workspace::kMaxWordBytes) {
      bpe_->encode_word(piece, out);
      continue;
    }
    auto it = ws.cache.find(piece);
    if (it != ws.cache.end()) {
      const int32_t* p = ws.arena.data() + it->second.first;
      out.insert(out.end(), p, p + it->second.second);
      continue;
    }
    size_t before = out.size();
    bpe_->encode_word(piece, out);
    if (ws.cache.size() >= Workspace::kMaxEntries) {
      ws.cache.clear();
      ws.arena.clear();
    }
    uint32_t off = uint32_t(ws.arena.size());
    ws.arena.insert(ws.arena.end(), out.begin() + before, out.end());
    ws.cache.emplace(std::string(piece), std::make_pair(off, uint32_t(out.size() - before)));
  }
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, bool parse_special) const {
  size_t bad = 0;
  if (!valid_utf8(text, &bad)) fail("invalid UTF-8 at byte offset ", bad);
  if (!parse_special || added_.empty()) {
    encode_plain(text, out);
    return;
  }
  // Leftmost-longest match of the added tokens (HF's AddedVocabulary).
  size_t seg = 0, i = 0, n = text.size();
  while (i < n) {
    uint8_t b = uint8_t(text[i]);
    if (added_first_bytes_[b >> 5] & (1u << (b & 31))) {
      const AddedToken* hit = nullptr;
      for (const AddedToken& a : added_)
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;  // sorted longest first
        }
      if (hit) {
        encode_plain(text.substr(seg, i - seg), out);
        out.push_back(hit->id);
        i += hit->content.size();
        seg = i;
        continue;
      }
    }
    ++i;
  }
  encode_plain(text.substr(seg), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  encode(text, out, parse_special);
  return out;
}

std::string Tokenizer::decode(const int32_t* ids, size_t n) const {
  std::string out;
  for (size_t k = 0; k < n; ++k) {
    int32_t id = ids[k];
    if (id < 0 || uint32_t(id) >= vocab_size_ || !id_valid_[id]) fail("token id ", id, " is not in the vocabulary");
    out += id_bytes_[id];
  }
  return out;
}

}  // namespace wiola
