// Offline tools over the checkpoint format of ckpt/format.h, behind
// `wiola ckpt inspect | verify | consolidate`: a summary of a checkpoint, a
// full integrity check, and one unsharded HDF5 file of the whole model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/format.h"
#include "model/config.h"

namespace wiola::ckpt {

// The model a checkpoint holds, from the effective config its manifest
// records. Only its [model] table is read: the backend of another build or a
// data path that is gone does not matter here. Throws naming the manifest.
ModelConfig model_config(const Reader& r);

// What `wiola ckpt inspect` shows, as JSON: step, tokens, run id, layout,
// backend and precision, the files (name, rank, grid coordinate, bytes,
// hash), the number of tensors, the parameter count and the elements stored
// per kind; with `tensors`, also "tensor_list": every tensor in model order
// with its global shape and its slices per file and kind
// ([r0, c0, nr, nc], global coordinates).
nlohmann::json summary(const Reader& r, bool tensors);

struct VerifyStats {
  int files = 0;
  int64_t tensors = 0, datasets = 0;
  int64_t elements = 0;  // per kind
};

// Everything `wiola ckpt verify` checks in checkpoint folder `folder`, one
// line per problem naming the file (empty: sound):
//   - the manifest is valid and self-consistent (Reader's constructor);
//   - every element of every kind of every tensor is in exactly one slice
//     (a coverage map: holes and overlaps with where they are);
//   - every file has the manifest's size, XXH3 and header (Reader::verify);
//   - every dataset the manifest lists is there with its shape and `offset`,
//     and its data matches its own `xxh3` attribute; no file holds a dataset
//     the manifest does not list.
// Holds one tensor's coverage map and one dataset at a time.
std::vector<std::string> verify_deep(const std::string& folder, VerifyStats* stats = nullptr);

struct ConsolidateStats {
  int64_t step = 0;
  int64_t tensors = 0;   // written, per kind
  int64_t elements = 0;  // per kind
  uint64_t bytes = 0;    // of the output file
};

// One unsharded HDF5 file `out` of checkpoint `folder` (which must pass
// Reader::verify): every tensor at /param/NAME as a full array of its global
// shape (matrices [rows, cols], vectors 1-D), NAME the docs/model.md §3 name;
// with `with_optimizer` also /exp_avg/NAME and /exp_avg_sq/NAME. Root
// attributes: format ("wiola-consolidated-1"), run_id, step, tokens and
// config (the effective TOML). Read tensor by tensor (one tensor in memory),
// written to out + ".tmp" and renamed. Throws naming the path and the
// problem; nothing is left at `out` then.
ConsolidateStats consolidate(const std::string& folder, const std::string& out, bool with_optimizer);

inline constexpr const char* kConsolidatedFormat = "wiola-consolidated-1";

// How one tensor of one kind differs between two checkpoints (b against a).
struct TensorDiff {
  std::string kind, name;
  int64_t elements = 0;
  int64_t differing = 0;  // elements whose bits differ
  double max_abs = 0;     // max |b - a| (inf where one side is not finite)
  double rel = 0;         // ||b - a||_2 / ||a||_2 (0 if identical; inf where not finite)
  double sq_diff = 0, sq_ref = 0;  // the sums behind rel
};

struct DiffResult {
  std::string folder_a, folder_b;
  nlohmann::json summary_a, summary_b;  // summary(reader, false) of each
  std::vector<std::string> model_keys_differ;  // [model] settings that differ (shapes agree)
  std::vector<TensorDiff> tensors;             // model order, kind by kind
  // Over the parameters (kind "param") of the whole model.
  double model_rel = 0;
  int64_t elements = 0, differing = 0;
};

// Checkpoint folder b against folder a, tensor by tensor, whatever either's
// layout (each tensor rebuilt to its global shape from its slices): bits,
// largest difference and the norm-wise relative difference. Both must pass
// Reader::verify and hold the same tensors with the same shapes (throws naming
// the first that does not); with `with_optimizer` also the AdamW moments (both
// must hold them). One tensor of each side in memory at a time.
DiffResult diff(const std::string& folder_a, const std::string& folder_b, bool with_optimizer);

}  // namespace wiola::ckpt
