#include "data/byte_level.h"

namespace wiola {
namespace {
struct Tables {
  uint32_t b2c[256];
  int c2b[512];
  std::array<std::string, 256> chars;
  Tables() {
    for (int& v : c2b) v = -1;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      b2c[b] = printable ? uint32_t(b) : uint32_t(256 + n++);
      c2b[b2c[b]] = b;
      append_utf8(chars[b], b2c[b]);
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}
}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return tables().b2c[b]; }
int codepoint_to_byte(uint32_t cp) { return cp < 512 ? tables().c2b[cp] : -1; }
const std::string& byte_char(uint8_t b) { return tables().chars[b]; }

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += byte_char(c);
  return out;
}

bool byte_level_to_bytes(std::string_view s, std::string& out) {
  bool ok = true;
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    uint32_t cp = next_codepoint(s, i);
    int b = codepoint_to_byte(cp);
    if (b < 0) {
      ok = false;
      out.append(s.substr(start, i - start));
    } else {
      out += char(b);
    }
  }
  return ok;
}

bool valid_utf8(std::string_view s, size_t* bad) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // Fast path: 8 ASCII bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      if (bad) *bad = i;
      return false;
    }
    if (i + len > n) {
      if (bad) *bad = i;
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) {
        if (bad) *bad = i;
        return false;
      }
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      if (bad) *bad = i;
      return false;
    }
    i += len;
  }
  return true;
}

uint32_t next_codepoint(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned c = p[i];
  if (c < 0x80) return p[i++];
  size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
  i += len;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace wiola
