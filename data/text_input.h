// Corpus input for prep and tokenizer training: expand paths (files, globs,
// directories, recursively, sorted), and read documents from plain text
// (blank-line separated, or one document per file) or JSONL (a text field),
// each optionally compressed: a name ending in .gz (gzip, multi-member too)
// or .zst (zstd, any number of frames) is decompressed as it is read.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace wiola {

// Whole file; throws wiola::Error naming it when missing or unreadable.
std::string read_file(const std::string& path);

// Files, directories (all regular files below, sorted) and glob patterns ->
// sorted unique file list. Throws when a path or pattern matches nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

enum class InputFormat { kAuto, kText, kJsonl };
InputFormat parse_input_format(const std::string& s);

struct DocReaderOptions {
  InputFormat format = InputFormat::kAuto;  // auto: .jsonl/.json/.ndjson (+ .gz/.zst) -> JSONL, else text
  bool doc_per_file = false;                // text: the whole file is one document
  std::string text_field = "text";          // JSONL
};

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
void read_documents(const std::string& path, const DocReaderOptions& opt,
                    const std::function<void(std::string&&)>& on_doc,
                    const std::function<void(uint64_t)>& on_bytes);

}  // namespace wiola
