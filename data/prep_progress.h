// Resumable prep (docs/data.md, "Resuming an interrupted prep"): while it
// runs, `wiola prep` writes its shards into DIR/.prep-partial/ and, after
// each one, progress.json (atomically: temp file + rename) recording the
// prep's identity (inputs, options, tokenizer) and, per split, the shards
// written and where the split's token stream stands in them. A prep killed
// at any point and rerun with the same identity continues after the last
// shard recorded; the documents before it are re-read (for the document
// count, the split and --dedup) but not tokenized again.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "data/manifest.h"

namespace wiola {

inline constexpr const char* kPrepPartialDir = ".prep-partial";
inline constexpr const char* kPrepProgressName = "progress.json";

// Where one split's token stream stands in its written shards.
struct SplitResume {
  uint64_t docs_written = 0;    // documents of the split whose EOS is in a written shard
  uint64_t partial_tokens = 0;  // tokens of the split's next document already in a shard
};

struct PrepProgress {
  Manifest shards;  // tokenizer and splits with the shards written (paths in the partial folder)
  std::map<std::string, SplitResume> resume;  // by split
};

// Writes `partial_dir`/progress.json (temp + rename): the identity (a JSON
// object's text), `m`'s tokenizer and splits, and `resume`.
void save_prep_progress(const std::string& partial_dir, const std::string& identity_json, const Manifest& m,
                        const std::map<std::string, SplitResume>& resume);

// The progress in `partial_dir`: nullopt when there is none. Throws naming
// the first difference when it was saved under another identity.
std::optional<PrepProgress> load_prep_progress(const std::string& partial_dir, const std::string& identity_json);

}  // namespace wiola
