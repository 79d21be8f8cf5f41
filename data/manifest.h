// The manifest prep writes beside the shards (manifest.json): tokenizer
// identity, per-split token/document counts and the shard list (paths
// relative to the manifest's folder). Written last, atomically.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace wiola {

struct ManifestShard {
  std::string file;  // as written (relative to the manifest's folder)
  std::string path;  // resolved
  uint64_t num_tokens = 0, num_documents = 0;
};

struct ManifestSplit {
  uint64_t num_tokens = 0, num_documents = 0;
  std::vector<ManifestShard> shards;
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
