// The sharded checkpoint format (docs/checkpoints.md): what one rank writes,
// the manifest that ties the files together, and the reader that loads any
// layout's share from any other layout's files (resharding).
//
// A checkpoint is the folder DIR/step-NNNNNNNN holding one HDF5 file per
// writing rank (rank-RRRRR.h5) and manifest.json. Tensors are stored as
// slices in *global* coordinates: a slice is a rectangle [r0, r0+nr) x
// [c0, c0+nc) of the tensor's global [rows, cols] shape (vectors: cols = 1),
// stored as the 2-D dataset /KIND/NAME/K with attribute `offset` = [r0, c0]
// (KIND: param, exp_avg, exp_avg_sq). Every element of a tensor is in exactly
// one slice of one file; the manifest lists every slice by file, so a reader
// opens only the files that hold what it needs and reads only the
// intersection (an HDF5 hyperslab).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/params.h"

namespace wiola::ckpt {

inline constexpr const char* kFormat = "wiola-checkpoint-1";
inline constexpr const char* kKinds[3] = {"param", "exp_avg", "exp_avg_sq"};
// The kinds a checkpoint stores: its manifest's "kinds" (an imported model
// holds "param" only: weights, no optimizer state), else all three. A
// malformed "kinds" throws wiola::Error naming `where`.
std::vector<std::string> stored_kinds(const nlohmann::json& manifest, const std::string& where);
// The largest element count of one tensor a manifest may declare (2^48):
// far above any model, low enough that no size or slice end overflows.
inline constexpr int64_t kMaxElements = int64_t(1) << 48;
bool holds_optimizer(const nlohmann::json& manifest);

// The tokenizer a checkpoint carries (manifest: "tokenizer": {"file", "sha256"}).
inline constexpr const char* kTokenizerFile = "tokenizer.json";

// A rectangle of a tensor in global coordinates, and where the same elements
// sit in one rank's local (TP-sliced) entry: local rows lr0.., local cols
// lc0.. map one to one onto global rows r0.., cols c0.. .
struct Slice {
  int64_t r0 = 0, c0 = 0, nr = 0, nc = 0;  // global
  int64_t lr0 = 0, lc0 = 0;                // local
  int64_t size() const { return nr * nc; }
};

// The slices covering entry-relative local flat elements [a, b) of `e`
// (a run of a ZeRO shard may start and end inside a row): rows whose global
// indices are consecutive and column runs that are consecutive in both
// numberings merge into one rectangle.
std::vector<Slice> slices_of(const ParamEntry& e, size_t a, size_t b);

// Copy between an entry's local flat values and a slice's row-major data.
// `local` holds the entry's elements from entry-relative index `a` on (the
// slice must lie in what it holds).
void gather_slice(const ParamEntry& e, const Slice& s, const float* local, int64_t a, float* out);
void scatter_slice(const ParamEntry& e, const Slice& s, const float* in, float* local, int64_t a);

// One tensor's share in one rank file: its slices and their data, row-major,
// concatenated in slice order.
struct TensorPiece {
  std::string kind, name;
  int64_t rows = 0, cols = 1;  // global shape
  std::vector<Slice> slices;
  std::vector<float> data;
};

// Identity of one rank file, written as root attributes and repeated in the
// manifest, so a file from another rank, step or run is refused by name.
struct FileHeader {
  std::string run_id;
  int64_t step = 0;
  int rank = 0, tp = 0, pp = 0, dp = 0;  // writer's world rank and grid coordinates
};

struct FileRecord {
  std::string name;  // rank-RRRRR.h5, relative to the checkpoint folder
  FileHeader header;
  uint64_t bytes = 0;
  std::string xxh3;  // XXH3-64 of the whole file, hex
  nlohmann::json slices;  // {"KIND": {"NAME": [[r0, c0, nr, nc], ...]}}
};

// Writes path + ".tmp" (every dataset with an `xxh3` attribute of its data),
// fsyncs it, renames it to `path`, and returns its record (size and hash of
// the bytes on disk). HDF5 builds the file in memory (each piece's data is
// released once written) and the bytes are then copied to disk, so no disk
// error reaches HDF5 (with HDF5 1.10 one that did could not be recovered
// from). Throws wiola::Error naming the path and what failed (disk full,
// permission...), with the .tmp file removed.
FileRecord write_rank_file(const std::string& path, const FileHeader& h, std::vector<TensorPiece> pieces);

// ---- failures on purpose (tests) -------------------------------------------------
// The stages of a save, in order: on every writing rank the temporary
// folder, then its rank file (created on disk, written, synced and closed,
// renamed into place); on rank 0 the commit (tokenizer.json,
// manifest.json, the folder renamed to step-N, `latest`).
inline constexpr const char* kSaveStages[] = {"mkdir",     "create",   "write",  "close",  "rename",
                                              "tokenizer", "manifest", "commit", "latest"};
// Test-only: the environment variable WIOLA_CKPT_FAIL_AT=STAGE[:STEPS[:RANK]]
// makes saves fail at STAGE with the error a full disk gives there (ENOSPC).
// STEPS: N (the save of step N) or N- (step N and later), default every
// save; RANK: that world rank only, default every rank. This throws that
// error, naming `path`, when the variable asks for it at (stage, step,
// rank). The variable is read here only; a malformed one throws
// wiola::Error naming it.
void fail_if_injected(const char* stage, int64_t step, int rank, const std::string& path);

// "step-00000400" and "rank-00003.h5": the names inside a checkpoint directory.
std::string step_name(int64_t step);
std::string rank_file(int rank);

// XXH3-64 of a file's bytes as 16 hex digits; throws naming an unreadable file.
std::string file_xxh3(const std::string& path);

// fsync a file or directory (directories: so a rename in it is durable).
void fsync_path(const std::string& path);

// ---- reading -------------------------------------------------------------------
// A checkpoint folder opened for reading: its manifest parsed and checked for
// internal consistency (every listed file and tensor, shapes, slices that
// tile each tensor exactly once). Throws wiola::Error naming the folder and
// the problem.
class Reader {
 public:
  explicit Reader(const std::string& folder);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& folder() const { return folder_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const std::vector<FileRecord>& files() const { return files_; }
  int64_t step() const;

  // Each file exists with the manifest's size and hash and its header names
  // the manifest's run, step and rank. Only files i with i % stride == offset
  // (the share of one rank when many verify). Returns the problems found,
  // one line each (empty: sound).
  std::vector<std::string> verify(int stride = 1, int offset = 0) const;

  bool has(const std::string& kind, const std::string& name) const;
  // Global shape of tensor `name`; throws if the checkpoint lacks it.
  std::pair<int64_t, int64_t> shape(const std::string& name) const;

  // Fills entry-relative local flat elements [a, b) of `e` (of this reader's
  // model; global shapes must agree) with KIND's values from whichever files
  // hold them: out[i - a] receives element i. Throws naming the tensor when
  // the checkpoint does not cover every element.
  void read(const std::string& kind, const ParamEntry& e, size_t a, size_t b, float* out);

 private:
  struct Stored {
    int file = 0;
    std::string dataset;
    int64_t r0 = 0, c0 = 0, nr = 0, nc = 0;
  };
  struct Tensor {
    int64_t rows = 0, cols = 1;
    std::map<std::string, std::vector<Stored>> by_kind;
  };
  int64_t open_file(int file);  // cached HDF5 handle

  std::string folder_;
  nlohmann::json manifest_;
  std::vector<FileRecord> files_;
  std::map<std::string, Tensor> tensors_;
  std::vector<int64_t> handles_;
};

// The checkpoint folders under `dir` (step-N with a manifest; with
// `incomplete`, also step-N folders that lack one), newest step first.
// Temporary folders of interrupted saves are never listed.
std::vector<std::string> list_checkpoints(const std::string& dir, bool incomplete = false);

// A checkpoint argument: a checkpoint folder itself, or a checkpoint
// directory (its `latest`, else its newest complete checkpoint). Throws
// naming the path when there is none.
std::string resolve_checkpoint(const std::string& path);

}  // namespace wiola::ckpt
