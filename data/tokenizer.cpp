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

Tokenizer Tokenizer::from_json_text(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(origin, ": not a valid tokenizer.json (JSON parse error: ", e.what(), ")");
  }
  auto unsupported = [&](const std::string& what) -> void {
    fail(origin, ": unsupported tokenizer.json: ", what,
         " (only byte-level BPE of the GPT-2 kind is implemented)");
  };
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    fail(origin, ": not a tokenizer.json (no \"model\" object)");
  const json& m = j["model"];
  std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") unsupported("model.type is \"" + type + "\"");
  if (!m.contains("vocab") || !m["vocab"].is_object() || !m.contains("merges") || !m["merges"].is_array())
    fail(origin, ": model.vocab (object) or model.merges (array) missing");
  if (!is_null_or(m, "dropout", json()) && m["dropout"] != 0.0) unsupported("BPE dropout is set");
  if (!is_null_or(m, "continuing_subword_prefix", "")) unsupported("continuing_subword_prefix is set");
  if (!is_null_or(m, "end_of_word_suffix", "")) unsupported("end_of_word_suffix is set");
  if (m.value("byte_fallback", false)) unsupported("byte_fallback is true");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    unsupported("normalizer is " + j["normalizer"].value("type", std::string("set")));
  bool use_regex = true;
  {
    const json& p = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
    if (!p.is_object() || p.value("type", std::string()) != "ByteLevel")
      unsupported("pre_tokenizer is not ByteLevel (" + (p.is_object() ? p.value("type", std::string("?")) : std::string("null")) + ")");
    if (p.value("add_prefix_space", false)) unsupported("ByteLevel add_prefix_space is true");
    use_regex = p.value("use_regex", true);
  }
  if (j.contains("decoder") && !j["decoder"].is_null() && j["decoder"].value("type", std::string()) != "ByteLevel")
    unsupported("decoder is not ByteLevel");

  Tokenizer t;
  t.origin_ = origin;
  t.sha256_ = sha256_hex(text);
  TokenIndex vocab;
  int64_t max_id = -1;
  try {
    vocab.reserve(m["vocab"].size());
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      int64_t id = it.value().get<int64_t>();
      if (id < 0 || id >= (int64_t(1) << 31)) fail(origin, ": model.vocab id ", id, " out of range");
      vocab.emplace(it.key(), int32_t(id));
      max_id = std::max(max_id, id);
    }
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(m["merges"].size());
    for (const json& mj : m["merges"]) {
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
    t.bpe_ = std::make_unique<BpeModel>(std::move(vocab), merges, m.value("ignore_merges", false), origin);
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const json& a : j["added_tokens"]) {
        AddedToken tok{a.at("id").get<int32_t>(), a.at("content").get<std::string>(), a.value("special", false)};
        if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
          unsupported("added token \"" + tok.content + "\" has lstrip/rstrip/single_word");
        if (tok.content.empty()) fail(origin, ": an added token is empty");
        if (tok.id < 0) fail(origin, ": added token \"", tok.content, "\" has a negative id");
        max_id = std::max<int64_t>(max_id, tok.id);
        t.added_.push_back(std::move(tok));
      }
    }
  } catch (const json::exception& e) {
    fail(origin, ": malformed tokenizer.json: ", e.what());
  }
  if (!t.bpe_->has_all_bytes())
    unsupported("model.vocab lacks some of the 256 byte-level characters (not a byte-level BPE)");
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
