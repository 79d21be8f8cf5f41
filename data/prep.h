// `wiola prep`: raw text -> HDF5 token shards + manifest (docs/model.md §6).
// A reader thread reads (decompresses, parses) the inputs in order, drops
// exact duplicates (--dedup) and assigns each document its split while the
// documents read before it are tokenized in parallel (OpenMP); each document
// is followed by the EOS id. Every round(1/val_fraction)-th kept document
// (exactly floor((d+1)·f) > floor(d·f) for document d) goes to the "val"
// split, the rest to "train". Each split is cut into shards of shard_tokens
// tokens (the last one shorter). The output is the same for any thread count.
// Shards are written into DIR/.prep-partial/ with a progress record after
// each (data/prep_progress.h), so a killed or interrupted prep rerun with the
// same inputs and options resumes and gives the same bytes; they are moved
// into place only after all input was read, manifest last, so the output
// folder never holds a manifest that names missing or partial shards. An
// error removes the partial folder; a signal (or kill -9) leaves it to resume.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/manifest.h"
#include "data/shard.h"
#include "data/text_input.h"

namespace wiola {

struct PrepOptions {
  std::vector<std::string> inputs;  // files, directories, globs
  std::string tokenizer_path;
  std::string output_dir;
  DocReaderOptions reader;
  uint64_t shard_tokens = 100'000'000;
  double val_fraction = 0.01;  // of documents, in [0, 1)
  int threads = 0;             // 0: all cores
  uint64_t batch_bytes = 0;    // text read ahead per tokenizing batch (0: 8 MB per thread); no effect on the output
  ShardWriteOptions shard;
  bool parse_special = false;  // recognise "<eos>" etc. written in the text
  bool progress = true;        // progress bar on stderr
  bool dedup = false;          // drop exact duplicate documents (data/doc_dedup.h)
  bool fresh = false;          // discard an interrupted prep of other inputs/options instead of refusing
  int test_kill_after_shards = 0;  // tests: SIGKILL this process after that many shards (0: never)
};

struct PrepResult {
  Manifest manifest;
  std::string manifest_path;
  uint64_t input_bytes = 0;
  double seconds = 0;
  uint64_t documents = 0;       // kept, in the shards
  uint64_t duplicates = 0;      // dropped by --dedup
  uint64_t bad_skipped = 0;     // malformed lines, rows or file tails skipped by --skip-bad
  uint64_t resumed_shards = 0;  // found written by an interrupted prep and kept
};

PrepResult run_prep(const PrepOptions& opt);

struct DataVerifyStats {
  int shards = 0;          // read
  uint64_t tokens = 0;     // read
  int hashes_checked = 0;  // shard and split content hashes compared
  int hashes_absent = 0;   // shards and splits whose manifest records none (an older prep)
};

// Everything `wiola prep --verify` checks of a prep output (its manifest.json
// or its folder), reading every token once: each shard of each split opens as
// a token shard (header, dtype, every id < vocab) made with the manifest's
// tokenizer and holding the manifest's counts; its content hash, and each
// split's over its shards in order, equal the manifest's where it records
// them (data/manifest.h). One line per problem naming the file (empty: sound).
// A manifest that cannot be read is one problem, not an exception.
std::vector<std::string> verify_data(const std::string& path, DataVerifyStats* stats = nullptr);

// Tokens held against the Chinchilla budget 20·N of each model size (docs/model.md §1).
void print_chinchilla_report(FILE* f, uint64_t train_tokens);

}  // namespace wiola
