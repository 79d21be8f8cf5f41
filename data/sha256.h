// SHA-256 (FIPS 180-4) of a byte string or a file, as lowercase hex. Used to
// pin the tokenizer a shard set was made with (manifest, shard attributes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace wiola {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex_digest();  // finishes; the object is spent afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// Throws wiola::Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace wiola
