// SHA-256 (FIPS 180-4) of a byte string or a file, as lowercase hex. Used to
// pin the tokenizer a shard set was made with (manifest, shard attributes).
// The digest itself is OpenSSL's (libcrypto, EVP interface).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace wiola {

class Sha256 {
 public:
  Sha256();  // throws wiola::Error when OpenSSL cannot start a digest
  void update(const void* data, size_t n);
  std::string hex_digest();  // finishes; the object is spent afterwards

 private:
  struct CtxFree {
    void operator()(void* ctx) const;
  };
  std::unique_ptr<void, CtxFree> ctx_;  // OpenSSL's EVP_MD_CTX
};

std::string sha256_hex(std::string_view bytes);
// Throws wiola::Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace wiola
