#include "data/text_input.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/byte_level.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace wiola {

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path, ": is a directory, expected a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, ": cannot open: ", std::strerror(errno));
  std::string s;
  f.seekg(0, std::ios::end);
  auto size = f.tellg();
  if (size < 0) fail(path, ": cannot read");
  s.resize(size_t(size));
  f.seekg(0);
  f.read(s.data(), std::streamsize(s.size()));
  if (!f) fail(path, ": read error");
  return s;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> out;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, fs::directory_options::follow_directory_symlink, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file()) found.push_back(it->path().string());
      if (ec) fail(in, ": cannot list directory: ", ec.message());
      if (found.empty()) fail(in, ": directory holds no files");
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (fs::exists(in, ec)) {
      out.push_back(in);
    } else if (in.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      int rc = ::glob(in.c_str(), 0, nullptr, &g);
      if (rc != 0 || g.gl_pathc == 0) {
        globfree(&g);
        fail(in, ": pattern matches no files");
      }
      std::vector<std::string> found;
      for (size_t i = 0; i < g.gl_pathc; ++i)
        if (!fs::is_directory(g.gl_pathv[i], ec)) found.push_back(g.gl_pathv[i]);
      globfree(&g);
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else {
      fail(in, ": no such file or directory");
    }
  }
  std::vector<std::string> uniq;
  for (auto& s : out)
    if (std::find(uniq.begin(), uniq.end(), s) == uniq.end()) uniq.push_back(s);
  return uniq;
}

InputFormat parse_input_format(const std::string& s) {
  if (s == "auto") return InputFormat::kAuto;
  if (s == "text" || s == "txt") return InputFormat::kText;
  if (s == "jsonl") return InputFormat::kJsonl;
  fail("unknown input format '", s, "' (auto, text, jsonl)");
}

namespace {
bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}
void check_utf8(const std::string& path, uint64_t line_no, std::string_view s) {
  size_t bad = 0;
  if (!valid_utf8(s, &bad)) fail(path, ":", line_no, ": invalid UTF-8 (byte ", bad + 1, " of the line)");
}
bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}
}  // namespace

void read_documents(const std::string& path, const DocReaderOptions& opt,
                    const std::function<void(std::string&&)>& on_doc,
                    const std::function<void(uint64_t)>& on_bytes) {
  InputFormat fmt = opt.format;
  if (fmt == InputFormat::kAuto)
    fmt = (ends_with(path, ".jsonl") || ends_with(path, ".json") || ends_with(path, ".ndjson")) ? InputFormat::kJsonl
                                                                                                 : InputFormat::kText;
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path, ": is a directory, expected a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, ": cannot open: ", std::strerror(errno));
  if (fmt == InputFormat::kText && opt.doc_per_file) {
    std::stringstream ss;
    ss << f.rdbuf();
    if (f.bad()) fail(path, ": read error");
    std::string doc = ss.str();
    on_bytes(doc.size());
    size_t bad = 0;
    if (!valid_utf8(doc, &bad)) fail(path, ": invalid UTF-8 at byte offset ", bad);
    while (!doc.empty() && (doc.back() == '\n' || doc.back() == '\r')) doc.pop_back();
    if (!is_blank(doc)) on_doc(std::move(doc));
    return;
  }
  std::string line, doc;
  uint64_t line_no = 0, pending = 0;
  while (std::getline(f, line)) {
    ++line_no;
    pending += line.size() + (f.eof() ? 0 : 1);  // the last line may lack its newline
    if (pending >= (1u << 20)) {
      on_bytes(pending);
      pending = 0;
    }
    check_utf8(path, line_no, line);
    if (fmt == InputFormat::kJsonl) {
      if (is_blank(line)) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        fail(path, ":", line_no, ": not valid JSON (", e.what(), ")");
      }
      if (!j.is_object() || !j.contains(opt.text_field) || !j[opt.text_field].is_string())
        fail(path, ":", line_no, ": no string field \"", opt.text_field, "\"");
      std::string text = j[opt.text_field].get<std::string>();
      if (!text.empty()) on_doc(std::move(text));
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (is_blank(line)) {
      if (!doc.empty()) on_doc(std::move(doc));
      doc.clear();
      continue;
    }
    if (!doc.empty()) doc += '\n';
    doc += line;
  }
  if (f.bad()) fail(path, ": read error");
  if (!doc.empty()) on_doc(std::move(doc));
  on_bytes(pending);
}

}  // namespace wiola
