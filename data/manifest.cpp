#include "data/manifest.h"

#include "util/files.h"

#include <xxhash.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/text_input.h"
#include "util/error.h"
#include "util/json.h"

namespace wiola {

std::string token_hash_hex(uint64_t xxh3) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", (unsigned long long)xxh3);
  return s;
}

static_assert(std::endian::native == std::endian::little, "token hashes assume a little-endian host");

TokenHash::TokenHash() : state_(XXH3_createState()) {
  WIOLA_CHECK(state_ && XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)) == XXH_OK,
              "cannot start a content hash (out of memory)");
}
TokenHash::~TokenHash() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void TokenHash::add(const int32_t* ids, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), ids, n * sizeof(int32_t));
}
std::string TokenHash::hex() const { return token_hash_hex(XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_))); }

namespace {

// An optional content hash: absent (older manifests) or 16 lowercase hex digits.
std::string optional_hash(const nlohmann::json& obj, const std::string& where) {
  if (!obj.contains("xxh3")) return "";
  const nlohmann::json& v = obj["xxh3"];
  const bool ok = v.is_string() && v.get<std::string>().size() == 16 &&
                  v.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos;
  WIOLA_CHECK(ok, where, ".xxh3: expected 16 lowercase hex digits, got ", v.dump());
  return v.get<std::string>();
}

}  // namespace

Manifest read_manifest(const std::string& path) {
  std::string text = read_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not a valid manifest (JSON parse error: ", e.what(), ")");
  }
  Manifest m;
  m.path = path;
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  try {
    if (!j.is_object() || j.value("format", std::string()) != kManifestFormat)
      fail(path, ": not a wiola manifest (format is not \"", kManifestFormat, "\")");
    const auto& t = j.at("tokenizer");
    m.vocab_size = json_int<uint32_t>(t.at("vocab_size"), path + ": tokenizer.vocab_size");
    m.eos_id = json_int<uint32_t>(t.at("eos_id"), path + ": tokenizer.eos_id");
    m.tokenizer_sha256 = t.at("sha256").get<std::string>();
    m.tokenizer_file = t.value("file", std::string());
    for (auto it = j.at("splits").begin(); it != j.at("splits").end(); ++it) {
      ManifestSplit s;
      const std::string split = path + ": splits." + it.key();
      s.num_tokens = json_int<uint64_t>(it.value().at("num_tokens"), split + ".num_tokens");
      s.num_documents = json_int<uint64_t>(it.value().at("num_documents"), split + ".num_documents");
      s.xxh3 = optional_hash(it.value(), split);
      for (const auto& sh : it.value().at("shards")) {
        ManifestShard e;
        e.file = sh.at("file").get<std::string>();
        e.path = (dir / e.file).string();
        e.num_tokens = json_int<uint64_t>(sh.at("num_tokens"), split + ": shard " + e.file + ": num_tokens");
        e.num_documents = json_int<uint64_t>(sh.at("num_documents"), split + ": shard " + e.file + ": num_documents");
        e.xxh3 = optional_hash(sh, split + ": shard " + e.file);
        s.shards.push_back(std::move(e));
      }
      m.splits[it.key()] = std::move(s);
    }
    if (j.contains("prep")) m.extra_json = j["prep"].dump();
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed manifest: ", e.what());
  }
  return m;
}

void write_manifest(const std::string& path, const Manifest& m) {
  nlohmann::ordered_json j;
  j["format"] = kManifestFormat;
  j["tokenizer"] = {{"file", m.tokenizer_file},
                    {"sha256", m.tokenizer_sha256},
                    {"vocab_size", m.vocab_size},
                    {"eos_id", m.eos_id}};
  j["dtype"] = m.vocab_size <= 65536 ? "uint16" : "uint32";
  nlohmann::ordered_json splits = nlohmann::ordered_json::object();
  for (const auto& [name, s] : m.splits) {
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (const auto& sh : s.shards) {
      nlohmann::ordered_json e = {{"file", sh.file}, {"num_tokens", sh.num_tokens}, {"num_documents", sh.num_documents}};
      if (!sh.xxh3.empty()) e["xxh3"] = sh.xxh3;
      shards.push_back(std::move(e));
    }
    nlohmann::ordered_json e = {{"num_tokens", s.num_tokens}, {"num_documents", s.num_documents}};
    if (!s.xxh3.empty()) e["xxh3"] = s.xxh3;
    e["shards"] = shards;
    splits[name] = std::move(e);
  }
  j["splits"] = splits;
  j["prep"] = nlohmann::ordered_json::parse(m.extra_json);
  write_text_atomic(path, j.dump(2) + "\n");
}

}  // namespace wiola
