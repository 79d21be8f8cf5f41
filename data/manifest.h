// The manifest prep writes beside the shards (manifest.json): tokenizer
// identity, per-split token/document counts and the shard list (paths
// relative to the manifest's folder). Written last, atomically.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace wiola {

// Content hashes (`xxh3`): the XXH3-64 of token ids as little-endian
// uint32, in order, as 16 lowercase hex digits, whatever dtype the shards
// store. A shard's covers its tokens; a split's covers its whole token
// stream, shard after shard, so two splits with the same documents in
// another order differ. Empty: the manifest predates them (optional on read).
struct ManifestShard {
  std::string file;  // as written (relative to the manifest's folder)
  std::string path;  // resolved
  uint64_t num_tokens = 0, num_documents = 0;
  std::string xxh3;
};

struct ManifestSplit {
  uint64_t num_tokens = 0, num_documents = 0;
  std::string xxh3;
  std::vector<ManifestShard> shards;
};

// An XXH3-64 value as a content hash's text: 16 lowercase hex digits.
std::string token_hash_hex(uint64_t xxh3);

// A content hash computed as the tokens stream by (int32 ids < 2^31, whose
// bytes on a little-endian host are the uint32 ones).
class TokenHash {
 public:
  TokenHash();
  ~TokenHash();
  TokenHash(const TokenHash&) = delete;
  TokenHash& operator=(const TokenHash&) = delete;
  void add(const int32_t* ids, size_t n);
  std::string hex() const;  // of everything added so far

 private:
  void* state_;  // XXH3_state_t
};

struct Manifest {
  std::string path;  // where it was read from / written to
  uint32_t vocab_size = 0;
  uint32_t eos_id = 0;
  std::string tokenizer_sha256, tokenizer_file;
  std::map<std::string, ManifestSplit> splits;
  std::string extra_json = "{}";  // free-form object stored under "prep"
};

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kManifestFormat = "wiola-manifest-1";

// Throws wiola::Error naming the file on a missing file, bad JSON or fields.
Manifest read_manifest(const std::string& path);
// Writes path + ".tmp" then renames.
void write_manifest(const std::string& path, const Manifest& m);

}  // namespace wiola
