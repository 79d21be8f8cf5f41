// HDF5 token shards (docs/model.md §6): dataset /tokens, 1-D, uint16 when the
// vocabulary has at most 65536 ids else uint32, chunked, shuffle + deflate +
// Fletcher-32 checksum per chunk (so corrupt data is an error, not garbage);
// attributes vocab_size, eos_id, tokenizer_sha256, num_tokens, num_documents
// (and format = "wiola-tokens-1"). Documents are separated by eos_id.
// The HDF5 library here is the serial build (not thread-safe): every HDF5
// call in wiola_data holds hdf5_mutex(). HDF5's own error printing is off;
// failures come back as wiola::Error naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace wiola {

std::mutex& hdf5_mutex();

struct ShardMeta {
  uint32_t vocab_size = 0;
  uint32_t eos_id = 0;
  std::string tokenizer_sha256;
  uint64_t num_tokens = 0;
  uint64_t num_documents = 0;
};

struct ShardWriteOptions {
  uint64_t chunk_tokens = 16384;  // HDF5 chunk: the unit a random read decompresses
  int deflate_level = 4;          // 0 = no compression (shuffle stays on)
};

// Writes a complete shard: to `path` + ".tmp", then renames it to `path`, so
// `path` never names a half-written file. meta.num_tokens must equal n.
void write_shard(const std::string& path, const int32_t* tokens, uint64_t n, const ShardMeta& meta,
                 const ShardWriteOptions& opt = {});

// An open shard; reads hyperslabs of /tokens. Construction validates the
// file (HDF5, dataset, rank, dtype, attributes) and throws wiola::Error
// naming the file and the problem. `chunk_cache_bytes`: HDF5's cache of
// decompressed chunks for /tokens (filled as chunks are read; a chunk larger
// than it is decompressed on every read).
class ShardReader {
 public:
  explicit ShardReader(const std::string& path, size_t chunk_cache_bytes = size_t(4) << 20);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const ShardMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return meta_.num_tokens; }
  // tokens[start, start+count) as int32; checks every id < vocab_size.
  void read(uint64_t start, uint64_t count, int32_t* out) const;

 private:
  std::string path_;
  ShardMeta meta_;
  int64_t file_ = -1, dset_ = -1;
};

}  // namespace wiola
