// The ByteLevel pre-tokenizer's split: the GPT-2 pattern run by PCRE2 (JIT,
// UTF mode), so pieces are exactly those Hugging Face `tokenizers` makes with
// Oniguruma. `\s` is spelled out as the Unicode White_Space set, which is what
// Oniguruma's \s matches (PCRE2's own \s would also take U+180E).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace wiola {

// The pattern as written in GPT-2 / Hugging Face (for documentation).
extern const char* const kGpt2SplitPattern;

class PreTokenizer {
 public:
  explicit PreTokenizer(bool use_regex = true);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Per-thread matching state (PCRE2 match data).
  class Scratch {
   public:
    Scratch();
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    void* match_data;
  };

  // Appends the pieces of `text` (valid UTF-8) to `out`; they tile the text.
  void split(std::string_view text, std::vector<std::string_view>& out, Scratch& scratch) const;

 private:
  bool use_regex_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace wiola
