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

// `bytes` (n little-endian uint32 token ids) as a content hash: 16 hex digits.
std::string token_hash_hex(uint64_t xxh3);

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
