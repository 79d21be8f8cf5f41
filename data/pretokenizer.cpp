#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/pretokenizer.h"

#include <pcre2.h>

#include "util/error.h"

namespace wiola {

const char* const kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {
// Unicode White_Space (Oniguruma's \s in UTF-8 mode).
#define WS R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})"
const char* const kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)" WS R"(\p{L}\p{N}]+|[)" WS R"(]+(?![^)" WS
    R"(])|[)" WS R"(]+)";
#undef WS
}  // namespace

PreTokenizer::PreTokenizer(bool use_regex) : use_regex_(use_regex) {
  if (!use_regex_) return;
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("PCRE2 cannot compile the split pattern at ", off, ": ", reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  code_ = code;
}

PreTokenizer::~PreTokenizer() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

PreTokenizer::Scratch::Scratch() : match_data(pcre2_match_data_create(4, nullptr)) {}
PreTokenizer::Scratch::~Scratch() { pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data)); }

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out, Scratch& scratch) const {
  if (text.empty()) return;
  if (!use_regex_) {
    out.push_back(text);
    return;
  }
  auto* code = static_cast<pcre2_code*>(code_);
  auto* md = static_cast<pcre2_match_data*>(scratch.match_data);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, n = text.size();
  while (pos < n) {
    int rc = pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) {  // cannot happen: every character is \s, \p{L}, \p{N} or the rest
      out.push_back(text.substr(pos));
      return;
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    if (s > pos) out.push_back(text.substr(pos, s - pos));  // unmatched gap (Isolated split)
    if (e == s) {  // empty match: cannot happen with this pattern; step one byte to be safe
      ++e;
    }
    out.push_back(text.substr(s, e - s));
    pos = e;
  }
}

}  // namespace wiola
