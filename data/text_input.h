// Corpus input for prep and tokenizer training: expand paths (files, globs,
// directories, recursively, sorted), and read documents from plain text
// (blank-line separated, or one document per file) or JSONL (a text field),
// each optionally compressed: a name ending in .gz (gzip, multi-member too)
// or .zst (zstd, any number of frames) is decompressed as it is read; or
// from Parquet (a string column, row group by row group) when built with
// WIOLA_PARQUET (data/parquet_input.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "util/error.h"

namespace wiola {

// Input that is malformed (invalid UTF-8, a JSONL row that is not JSON or
// lacks the field, corrupt compressed data, an unreadable Parquet file):
// the error --skip-bad turns into a counted skip. Missing or unreadable
// files are plain wiola::Error.
class MalformedInput : public Error {
 public:
  using Error::Error;
};
template <class... Args>
[[noreturn]] void malformed(Args&&... args) {
  throw MalformedInput(detail::concat(std::forward<Args>(args)...));
}

// Whole file; throws wiola::Error naming it when missing or unreadable.
std::string read_file(const std::string& path);

// Files, directories (all regular files below, sorted) and glob patterns ->
// sorted unique file list. Throws when a path or pattern matches nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

enum class InputFormat { kAuto, kText, kJsonl, kParquet };
InputFormat parse_input_format(const std::string& s);

struct DocReaderOptions {
  InputFormat format = InputFormat::kAuto;  // auto: .jsonl/.json/.ndjson (+ .gz/.zst) -> JSONL,
                                            // .parquet -> Parquet, else text
  bool doc_per_file = false;                // text: the whole file is one document
  std::string text_field = "text";          // JSONL field, Parquet column
  bool skip_bad = false;                    // malformed input: skip (reported through on_skip), not fail
};

// The format `path` is read as under `opt` (never kAuto).
InputFormat format_of(const std::string& path, const DocReaderOptions& opt);

// `path` less a trailing .gz or .zst.
std::string strip_compression_suffix(const std::string& path);

// Calls on_doc(text) for each non-empty document of `path`, in order, and
// on_bytes(n) as file bytes are consumed (compressed bytes for a .gz/.zst
// file; they add up to the file size). Documents are checked to be UTF-8;
// errors name the file and line. Text documents: runs of lines separated by
// one or more blank (empty or whitespace-only) lines, joined with '\n'.
// .gz/.zst files are streamed (constant memory); corrupt or truncated
// compressed data is an error naming the file, the line reached and the
// compressed/uncompressed byte offsets.
// Malformed input throws MalformedInput naming the file and line (row);
// with opt.skip_bad it calls on_skip(that message) instead and goes on: a
// text line skips its document, a JSONL line or Parquet row itself, corrupt
// compressed data or an unreadable Parquet file the rest of the file.
void read_documents(const std::string& path, const DocReaderOptions& opt,
                    const std::function<void(std::string&&)>& on_doc,
                    const std::function<void(uint64_t)>& on_bytes,
                    const std::function<void(const std::string&)>& on_skip = {});

// A malformed part `e` of an input: rethrown, or with opt.skip_bad reported
// as on_skip(e's message + `skipped`, e.g. "; skipped the line").
void skip_malformed(const MalformedInput& e, const DocReaderOptions& opt,
                    const std::function<void(const std::string&)>& on_skip, const char* skipped);

}  // namespace wiola
