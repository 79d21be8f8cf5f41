#include "data/text_input.h"

#include <glob.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/byte_level.h"
#include "data/parquet_input.h"
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
  if (s == "parquet") return InputFormat::kParquet;
  fail("unknown input format '", s, "' (auto, text, jsonl, parquet)");
}

void skip_malformed(const MalformedInput& e, const DocReaderOptions& opt,
                    const std::function<void(const std::string&)>& on_skip, const char* skipped) {
  if (!opt.skip_bad) throw e;
  if (on_skip) on_skip(e.what() + std::string(skipped));
}

namespace {
bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}
void check_utf8(const std::string& path, uint64_t line_no, std::string_view s) {
  size_t bad = 0;
  if (!valid_utf8(s, &bad)) malformed(path, ":", line_no, ": invalid UTF-8 (byte ", bad + 1, " of the line)");
}
bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}
// Compression by file name suffix.
enum class Codec { kNone, kGzip, kZstd };
Codec codec_of(const std::string& path) {
  if (ends_with(path, ".gz")) return Codec::kGzip;
  if (ends_with(path, ".zst")) return Codec::kZstd;
  return Codec::kNone;
}

// A file's bytes, decompressed on the fly when its name ends in .gz (every
// member of a multi-member gzip file, as `cat a.gz b.gz` makes) or .zst
// (every frame); constant memory. Errors name the file, the line reached
// (`line`, kept by the reader) and the compressed and uncompressed offsets.
class ByteSource {
 public:
  explicit ByteSource(const std::string& path) : path_(path), codec_(codec_of(path)) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) fail(path, ": is a directory, expected a file");
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) fail(path, ": cannot open: ", std::strerror(errno));
    if (codec_ == Codec::kGzip) {
      if (inflateInit2(&zs_, 15 + 16) != Z_OK) {  // 16: gzip wrapper only
        std::fclose(f_);
        fail(path, ": cannot start gzip decompression");
      }
    } else if (codec_ == Codec::kZstd) {
      dctx_ = ZSTD_createDCtx();
      if (!dctx_) {
        std::fclose(f_);
        fail(path, ": cannot start zstd decompression");
      }
    }
    if (codec_ != Codec::kNone) in_.resize(size_t(1) << 17);
  }
  ~ByteSource() {
    if (codec_ == Codec::kGzip) inflateEnd(&zs_);
    if (dctx_) ZSTD_freeDCtx(dctx_);
    if (f_) std::fclose(f_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Up to n (> 0) bytes of content into buf; 0 only at the end.
  size_t read(char* buf, size_t n) {
    size_t got = 0;
    switch (codec_) {
      case Codec::kNone:
        got = std::fread(buf, 1, n, f_);
        raw_read_ += got;
        if (got < n && std::ferror(f_)) fail(path_, ": read error");
        break;
      case Codec::kGzip: got = read_gzip(buf, n); break;
      case Codec::kZstd: got = read_zstd(buf, n); break;
    }
    out_bytes_ += got;
    return got;
  }
  uint64_t raw_read() const { return raw_read_; }  // file bytes consumed so far

  uint64_t line = 0;

 private:
  // Refills the compressed input buffer (all of it consumed); false at end of file.
  size_t refill() {
    if (eof_) return 0;
    size_t got = std::fread(in_.data(), 1, in_.size(), f_);
    if (got < in_.size()) {
      if (std::ferror(f_)) fail(path_, ": read error");
      eof_ = true;
    }
    raw_read_ += got;
    return got;
  }
  [[noreturn]] void corrupt(const char* what, const std::string& detail, uint64_t unconsumed) {
    malformed(path_, ":", line + 1, ": ", what, detail.empty() ? "" : " (" + detail + ")", " at compressed byte ",
         raw_read_ - unconsumed, " of the file, after ", out_bytes_, " uncompressed bytes");
  }

  size_t read_gzip(char* buf, size_t n) {
    zs_.next_out = reinterpret_cast<Bytef*>(buf);
    zs_.avail_out = uInt(std::min<size_t>(n, 1u << 30));
    const uInt want = zs_.avail_out;
    for (;;) {
      if (zs_.avail_in == 0) {
        zs_.avail_in = uInt(refill());
        zs_.next_in = reinterpret_cast<Bytef*>(in_.data());
        if (zs_.avail_in == 0) {
          if (raw_read_ == 0) corrupt("not gzip data", "the file is empty", 0);
          if (in_member_) corrupt("truncated gzip data", "the file ends inside a gzip stream", 0);
          return 0;
        }
      }
      if (!in_member_) {  // another member follows the last one
        inflateReset(&zs_);
        in_member_ = true;
      }
      int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        in_member_ = false;
      } else if (rc == Z_MEM_ERROR) {
        fail(path_, ": out of memory decompressing gzip data");
      } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && zs_.avail_in == 0)) {
        corrupt("corrupt gzip data", zs_.msg ? zs_.msg : "error " + std::to_string(rc), zs_.avail_in);
      }
      if (zs_.avail_out < want) return want - zs_.avail_out;
    }
  }

  size_t read_zstd(char* buf, size_t n) {
    ZSTD_outBuffer out{buf, n, 0};
    for (;;) {
      if (zin_.pos == zin_.size) {
        zin_ = ZSTD_inBuffer{in_.data(), refill(), 0};
        if (zin_.size == 0) {
          if (raw_read_ == 0) corrupt("not zstd data", "the file is empty", 0);
          // Flush what the decoder still holds; a frame left open means truncation.
          size_t r = ZSTD_decompressStream(dctx_, &out, &zin_);
          if (ZSTD_isError(r)) corrupt("corrupt zstd data", ZSTD_getErrorName(r), 0);
          if (out.pos > 0) return out.pos;
          if (zstd_left_ != 0) corrupt("truncated zstd data", "the file ends inside a zstd frame", 0);
          return 0;
        }
      }
      size_t r = ZSTD_decompressStream(dctx_, &out, &zin_);
      if (ZSTD_isError(r)) corrupt("corrupt zstd data", ZSTD_getErrorName(r), zin_.size - zin_.pos);
      zstd_left_ = r;
      if (out.pos > 0) return out.pos;
    }
  }

  std::string path_;
  Codec codec_;
  std::FILE* f_ = nullptr;
  std::vector<char> in_;
  bool eof_ = false;
  uint64_t raw_read_ = 0, out_bytes_ = 0;
  z_stream zs_{};
  bool in_member_ = true;
  ZSTD_DCtx* dctx_ = nullptr;
  ZSTD_inBuffer zin_{nullptr, 0, 0};
  size_t zstd_left_ = 1;  // 0 right after a frame ends
};

// std::getline over a ByteSource: false when no line is left; `newline`
// says whether the line ended in '\n' (the last one may not).
class LineReader {
 public:
  explicit LineReader(ByteSource& src) : src_(src), buf_(size_t(1) << 16) {}
  bool next(std::string& line) {
    line.clear();
    for (;;) {
      if (pos_ == len_) {
        if (!eof_) {
          len_ = src_.read(buf_.data(), buf_.size());
          pos_ = 0;
          eof_ = len_ == 0;
        }
        if (eof_) return !line.empty();
      }
      const char* s = buf_.data() + pos_;
      const void* nl = std::memchr(s, '\n', len_ - pos_);
      if (nl) {
        const size_t k = size_t(static_cast<const char*>(nl) - s);
        line.append(s, k);
        pos_ += k + 1;
        return true;
      }
      line.append(s, len_ - pos_);
      pos_ = len_;
    }
  }

 private:
  ByteSource& src_;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  bool eof_ = false;
};
}  // namespace

std::string strip_compression_suffix(const std::string& path) {
  if (ends_with(path, ".gz")) return path.substr(0, path.size() - 3);
  if (ends_with(path, ".zst")) return path.substr(0, path.size() - 4);
  return path;
}

InputFormat format_of(const std::string& path, const DocReaderOptions& opt) {
  if (opt.format != InputFormat::kAuto) return opt.format;
  const std::string name = strip_compression_suffix(path);
  if (ends_with(name, ".jsonl") || ends_with(name, ".json") || ends_with(name, ".ndjson")) return InputFormat::kJsonl;
  if (ends_with(path, ".parquet")) return InputFormat::kParquet;
  return InputFormat::kText;
}

namespace {

// One file's documents out of a ByteSource, its consumed bytes reported in
// steps of 1 MiB, and its malformed parts failed or skipped (--skip-bad).
class DocumentReader {
 public:
  DocumentReader(const std::string& path, const DocReaderOptions& opt,
                 const std::function<void(std::string&&)>& on_doc, const std::function<void(uint64_t)>& on_bytes,
                 const std::function<void(const std::string&)>& on_skip)
      : path_(path), opt_(opt), on_doc_(on_doc), on_bytes_(on_bytes), on_skip_(on_skip), src_(path) {}

  void read(InputFormat fmt) {
    try {
      if (fmt == InputFormat::kJsonl) read_jsonl();
      else if (opt_.doc_per_file) read_whole_file();
      else read_text();
    } catch (const MalformedInput& e) {
      skip(e, "; skipped the rest of the file");
    }
    on_bytes_(src_.raw_read() - reported_);
  }

 private:
  // The next line (false at the end), numbered for errors.
  bool next_line(std::string& line) {
    if (!lines_.next(line)) return false;
    src_.line = ++line_no_;
    if (src_.raw_read() - reported_ >= (1u << 20)) {
      on_bytes_(src_.raw_read() - reported_);
      reported_ = src_.raw_read();
    }
    return true;
  }
  void skip(const MalformedInput& e, const char* skipped) { skip_malformed(e, opt_, on_skip_, skipped); }

  // One object per line with a string field; blank lines ignored.
  void read_jsonl() {
    std::string line;
    while (next_line(line)) {
      try {
        std::string text = jsonl_text(line);
        if (!text.empty()) on_doc_(std::move(text));
      } catch (const MalformedInput& e) {
        skip(e, "; skipped the line");
      }
    }
  }
  std::string jsonl_text(const std::string& line) {
    check_utf8(path_, line_no_, line);
    if (is_blank(line)) return {};
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      malformed(path_, ":", line_no_, ": not valid JSON (", e.what(), ")");
    }
    if (!j.is_object() || !j.contains(opt_.text_field) || !j[opt_.text_field].is_string())
      malformed(path_, ":", line_no_, ": no string field \"", opt_.text_field, "\"");
    return j[opt_.text_field].get<std::string>();
  }

  // Runs of non-blank lines joined by '\n'; a document with a malformed line
  // is skipped whole.
  void read_text() {
    std::string line, doc;
    bool bad = false;
    while (next_line(line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (is_blank(line)) {
        if (!doc.empty() && !bad) on_doc_(std::move(doc));
        doc.clear();
        bad = false;
        continue;
      }
      try {
        check_utf8(path_, line_no_, line);
      } catch (const MalformedInput& e) {
        skip(e, "; skipped its document");
        bad = true;
      }
      if (!doc.empty()) doc += '\n';
      doc += line;
    }
    if (!doc.empty() && !bad) on_doc_(std::move(doc));
  }

  // --doc-per-file: the whole file, trailing newlines dropped.
  void read_whole_file() {
    std::string doc;
    char chunk[1 << 16];
    for (size_t n; (n = src_.read(chunk, sizeof chunk)) > 0;) doc.append(chunk, n);
    size_t bad = 0;
    if (!valid_utf8(doc, &bad)) malformed(path_, ": invalid UTF-8 at byte offset ", bad);
    while (!doc.empty() && (doc.back() == '\n' || doc.back() == '\r')) doc.pop_back();
    if (!is_blank(doc)) on_doc_(std::move(doc));
  }

  const std::string& path_;
  const DocReaderOptions& opt_;
  const std::function<void(std::string&&)>& on_doc_;
  const std::function<void(uint64_t)>& on_bytes_;
  const std::function<void(const std::string&)>& on_skip_;
  ByteSource src_;
  LineReader lines_{src_};
  uint64_t line_no_ = 0, reported_ = 0;  // reported_: file bytes given to on_bytes
};

}  // namespace

void read_documents(const std::string& path, const DocReaderOptions& opt,
                    const std::function<void(std::string&&)>& on_doc,
                    const std::function<void(uint64_t)>& on_bytes,
                    const std::function<void(const std::string&)>& on_skip) {
  const InputFormat fmt = format_of(path, opt);
  if (fmt == InputFormat::kParquet) {
    read_parquet_documents(path, opt, on_doc, on_bytes, on_skip);
    return;
  }
  DocumentReader(path, opt, on_doc, on_bytes, on_skip).read(fmt);
}

}  // namespace wiola
