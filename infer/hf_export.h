// `wiola export --format hf` and `wiola import` (docs/inference.md): a
// checkpoint as a Hugging Face transformers folder (safetensors with the
// tensor names of the model contract, config.json with the published
// Wiola-360M keys and an auto_map, the tokenizer, modeling_wiola.py), and
// such a folder back into a wiola checkpoint, bit for bit in fp32.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "infer/safetensors.h"
#include "model/config.h"

namespace wiola::infer {

struct ExportOptions {
  st::DType dtype = st::DType::F32;
  uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"
  std::string tokenizer;                     // when the checkpoint carries none
  bool any_tokenizer = false;
  bool force = false;                        // replace a non-empty OUT
};

struct ExportStats {
  std::string checkpoint;
  int64_t step = 0, tensors = 0, parameters = 0;
  int files = 0;        // safetensors files
  uint64_t bytes = 0;   // of the safetensors files
};

ExportStats export_hf(const std::string& checkpoint, const std::string& out, const ExportOptions& opt);

struct ImportOptions {
  int seq_len = 0;     // T; 0: max_position_embeddings
  bool force = false;  // replace checkpoints already in the output directory
};

struct ImportStats {
  std::string folder;  // the checkpoint written (CKDIR/step-00000000)
  ModelConfig model;
  int64_t tensors = 0, parameters = 0;
  std::string source_dtype;
  bool tokenizer = false;
};

ImportStats import_hf(const std::string& src, const std::string& ckdir, const ImportOptions& opt);

// The config.json of an export: the published Wiola-360M keys from `cfg`.
nlohmann::json hf_config_json(const ModelConfig& cfg, int32_t bos, int32_t eos, int32_t pad, st::DType dtype);
// The model config.json describes (throws naming the file and the key).
ModelConfig model_from_hf_config(const nlohmann::json& j, const std::string& where, int seq_len);

// The text of infer/hf/modeling_wiola.py, compiled in.
const char* modeling_wiola_py();

}  // namespace wiola::infer
