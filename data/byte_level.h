// GPT-2 byte-level alphabet: every byte b maps to one printable Unicode
// character (printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100..U+0143 in byte order), so a token string in tokenizer.json spells
// its bytes. Plus strict UTF-8 validation (what Python's str accepts).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace wiola {

// Unicode code point that stands for byte b.
uint32_t byte_to_codepoint(uint8_t b);
// The byte a code point stands for, or -1 when it is not in the alphabet.
int codepoint_to_byte(uint32_t cp);
// UTF-8 spelling of byte b's character (1 or 2 bytes).
const std::string& byte_char(uint8_t b);
// Raw bytes -> byte-level string (what tokenizer.json stores).
std::string bytes_to_byte_level(std::string_view bytes);
// Byte-level string -> raw bytes. Returns false when a character is not in the
// alphabet (out receives what could be decoded, unknown characters as UTF-8).
bool byte_level_to_bytes(std::string_view s, std::string& out);

// Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF). On failure, *bad
// receives the byte offset of the first invalid sequence.
bool valid_utf8(std::string_view s, size_t* bad = nullptr);
// Decode one code point at s[i] of valid UTF-8; advances i.
uint32_t next_codepoint(std::string_view s, size_t& i);
void append_utf8(std::string& out, uint32_t cp);

}  // namespace wiola
