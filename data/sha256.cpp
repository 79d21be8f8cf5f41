#include "data/sha256.h"

#include <openssl/err.h>
#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace wiola {
namespace {

EVP_MD_CTX* ctx_of(void* ctx) { return static_cast<EVP_MD_CTX*>(ctx); }

// Throws wiola::Error: "sha256: WHAT failed (OpenSSL: reason)", with the
// oldest error on OpenSSL's queue (the queue is emptied).
[[noreturn]] void openssl_fail(const char* what) {
  unsigned long code = ERR_get_error();
  char reason[256] = "no error reported";
  if (code != 0) ERR_error_string_n(code, reason, sizeof reason);
  ERR_clear_error();
  fail("sha256: ", what, " failed (OpenSSL: ", reason, ")");
}

}  // namespace

void Sha256::CtxFree::operator()(void* ctx) const { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx)); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) openssl_fail("EVP_MD_CTX_new");
  if (EVP_DigestInit_ex(ctx_of(ctx_.get()), EVP_sha256(), nullptr) != 1) openssl_fail("EVP_DigestInit_ex(SHA-256)");
}

void Sha256::update(const void* data, size_t n) {
  WIOLA_CHECK(ctx_, "sha256: update after hex_digest()");
  if (n == 0) return;
  if (EVP_DigestUpdate(ctx_of(ctx_.get()), data, n) != 1) openssl_fail("EVP_DigestUpdate");
}

std::string Sha256::hex_digest() {
  WIOLA_CHECK(ctx_, "sha256: hex_digest() called twice");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_of(ctx_.get()), md, &len) != 1) openssl_fail("EVP_DigestFinal_ex");
  ctx_.reset();
  WIOLA_CHECK(len == 32, "sha256: OpenSSL returned a ", len, "-byte digest, expected 32");
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 s;
  s.update(bytes.data(), bytes.size());
  return s.hex_digest();
}

std::string sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, ": cannot open: ", std::strerror(errno));
  std::unique_ptr<FILE, int (*)(FILE*)> guard(f, std::fclose);
  Sha256 s;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) s.update(buf.data(), n);
  if (std::ferror(f)) fail(path, ": read error");
  return s.hex_digest();
}

}  // namespace wiola
