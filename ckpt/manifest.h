// The run-level parts of a checkpoint manifest (docs/checkpoints.md) that
// more than the trainer writes or reads: the run's identity (what may not
// change on a resume) and the data loader's position. The trainer's
// Checkpointer writes them at every save; `wiola import` (infer/hf_export)
// writes them into the checkpoint it makes from a Hugging Face folder.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "data/loader.h"

namespace wiola {

// What may not change on a resume (docs/checkpoints.md): the model, the
// global batch, the seeds and the data identity.
// `data` (the training loader) adds a blend's sources.
nlohmann::json run_identity(const RunConfig& rc, const DatasetInfo& di, const TokenLoader* data = nullptr);

// The loader state as a checkpoint manifest's "loader" object, and back
// (throws naming `where` on a missing or mistyped field).
nlohmann::json loader_state_to_json(const LoaderState& s);
LoaderState loader_state_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace wiola
