// A checkpoint's model on one process, for evaluation and generation: the
// fp32 parameters read from any layout's checkpoint (global-coordinate
// slices), a single-process Model in evaluation use, and the tokenizer the
// checkpoint carries. Model code stays backend-agnostic: the parameters go
// to the backend through Ops::upload.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace wiola::infer {

struct LoadOptions {
  std::string backend = "cpu";  // make_backend name
  int batch = 1;                // sequences per forward (Model micro-batch)
  std::string tokenizer;        // a tokenizer.json instead of the checkpoint's
  bool need_tokenizer = true;   // false: no tokenizer is loaded or required
  bool any_tokenizer = false;   // accept a --tokenizer whose SHA-256 differs from the training data's
  // Documents (data.documents, docs/model.md §2 "Documents"): the EOS id the
  // model splits windows at (ModelOptions::documents_eos); -1: off;
  // kTokenizerEos: the loaded tokenizer's.
  int32_t documents_eos = -1;
};
inline constexpr int32_t kTokenizerEos = -2;

// Whether the checkpoint's run trained with data.documents (its identity;
// false for checkpoints from before the key).
bool trained_with_documents(const nlohmann::json& manifest);

class LoadedModel {
 public:
  // `checkpoint`: a step folder or a checkpoint directory. Verifies the
  // files (size, hash, header) before reading. Throws wiola::Error naming the
  // checkpoint and the problem.
  LoadedModel(const std::string& checkpoint, const LoadOptions& opt);
  ~LoadedModel();

  Model<float>& model() { return *model_; }
  Ops<float>& ops() { return *ops_; }
  const ModelConfig& config() const { return cfg_; }
  const std::string& folder() const { return folder_; }
  const nlohmann::json& manifest() const { return manifest_; }
  bool has_tokenizer() const { return tok_.has_value(); }
  const Tokenizer& tokenizer() const;  // throws when none was loaded
  // What `tokenizer()` came from ("the checkpoint" or the --tokenizer path).
  const std::string& tokenizer_origin() const { return tok_origin_; }

 private:
  void load_tokenizer(const LoadOptions& opt);

  std::string folder_;
  nlohmann::json manifest_;
  ModelConfig cfg_;
  std::unique_ptr<Ops<float>> ops_;
  std::unique_ptr<Model<float>> model_;
  std::optional<Tokenizer> tok_;
  std::string tok_origin_;
};

// The tokenizer.json text a checkpoint folder carries (SHA-256 checked
// against its manifest), or "" when it carries none.
std::string checkpoint_tokenizer_text(const std::string& folder, const nlohmann::json& manifest);

// The training data's tokenizer SHA-256 as the checkpoint's identity records
// it ("" when unknown, e.g. an imported checkpoint).
std::string trained_tokenizer_sha(const nlohmann::json& manifest);

}  // namespace wiola::infer
