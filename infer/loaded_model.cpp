#include "infer/loaded_model.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "ckpt/format.h"
#include "ckpt/tools.h"
#include "data/sha256.h"
#include "data/text_input.h"
#include "kernels/backend.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace wiola::infer {

namespace {
// Every parameter of the whole model, host fp32, in the flat layout (padding
// zero).
std::vector<float> read_params(ckpt::Reader& r, const ParamLayout& layout) {
  std::vector<float> host(layout.total());
  for (const ParamEntry& e : layout.entries()) {
    WIOLA_CHECK(r.has("param", e.name), r.folder(), ": the checkpoint has no tensor ", e.name,
                " (a checkpoint of another architecture?)");
    const auto [rows, cols] = r.shape(e.name);
    WIOLA_CHECK(rows == e.grows && cols == e.gcols, r.folder(), ": ", e.name, " is [", rows, ", ", cols,
                "] in the checkpoint, [", e.grows, ", ", e.gcols, "] for its recorded config");
    r.read("param", e, 0, e.size(), host.data() + e.offset);
  }
  return host;
}
}  // namespace

std::string checkpoint_tokenizer_text(const std::string& folder, const nlohmann::json& manifest) {
  if (!manifest.contains("tokenizer")) return "";
  const auto& t = manifest["tokenizer"];
  WIOLA_CHECK(t.is_object() && t.contains("file") && t.contains("sha256"), folder,
              "/manifest.json: \"tokenizer\" must be {\"file\", \"sha256\"}");
  const std::string path = (fs::path(folder) / t["file"].get<std::string>()).string();
  std::string text = read_file(path);
  const std::string sha = sha256_hex(text);
  WIOLA_CHECK(sha == t["sha256"].get<std::string>(), path, ": sha256 ", sha, " but the manifest records ",
              t["sha256"].get<std::string>(), " (damaged checkpoint)");
  return text;
}

std::string trained_tokenizer_sha(const nlohmann::json& manifest) {
  if (manifest.contains("identity") && manifest["identity"].contains("data.tokenizer_sha256"))
    return manifest["identity"]["data.tokenizer_sha256"].get<std::string>();
  if (manifest.contains("tokenizer")) return manifest["tokenizer"].value("sha256", "");
  return "";
}

bool trained_with_documents(const nlohmann::json& manifest) {
  const nlohmann::json& id = manifest.value("identity", nlohmann::json::object());
  return id.contains("data.documents") && id["data.documents"].is_boolean() && id["data.documents"].get<bool>();
}

LoadedModel::LoadedModel(const std::string& checkpoint, const LoadOptions& opt) {
  WIOLA_CHECK(opt.batch >= 1, "batch must be positive");
  folder_ = ckpt::resolve_checkpoint(checkpoint);
  ckpt::Reader r(folder_);
  std::string problems;
  for (const auto& p : r.verify()) problems += (problems.empty() ? "" : "; ") + p;
  WIOLA_CHECK(problems.empty(), "checkpoint ", folder_, " is damaged: ", problems);
  manifest_ = r.manifest();
  cfg_ = ckpt::model_config(r);
  if (opt.need_tokenizer) load_tokenizer(opt);

  ops_ = make_backend<float>(opt.backend);
  ModelOptions mo;
  mo.micro_batch = opt.batch;
  mo.documents_eos = opt.documents_eos;
  if (opt.documents_eos == kTokenizerEos) {
    WIOLA_CHECK(tok_.has_value() && tok_->eos_id() >= 0, "checkpoint ", folder_,
                " trained with data.documents, but no tokenizer with an EOS id is loaded to find the documents");
    mo.documents_eos = tok_->eos_id();
  }
  model_ = std::make_unique<Model<float>>(*ops_, cfg_, ModelShard{}, nullptr, mo);
  const std::vector<float> host = read_params(r, model_->layout());
  ops_->upload(model_->params(), host.data(), host.size() * sizeof(float));
  model_->refresh_weights();
}

LoadedModel::~LoadedModel() = default;

const Tokenizer& LoadedModel::tokenizer() const {
  WIOLA_CHECK(tok_.has_value(), "no tokenizer loaded");
  return *tok_;
}

// The checkpoint's own tokenizer unless --tokenizer names one; a named one
// must be the training data's (SHA-256) unless any_tokenizer; its
// vocabulary must be the model's V, as training requires of the data.
void LoadedModel::load_tokenizer(const LoadOptions& opt) {
  if (opt.tokenizer.empty()) {
    const std::string text = checkpoint_tokenizer_text(folder_, manifest_);
    WIOLA_CHECK(!text.empty(), "checkpoint ", folder_,
                " carries no tokenizer (saved before checkpoints stored one, or the training data's tokenizer "
                "file was gone); pass --tokenizer FILE");
    tok_.emplace(Tokenizer::from_json_text(text, folder_ + "/" + ckpt::kTokenizerFile));
    tok_origin_ = "the checkpoint";
  } else {
    tok_.emplace(Tokenizer::load(opt.tokenizer));
    tok_origin_ = opt.tokenizer;
    const std::string want = trained_tokenizer_sha(manifest_);
    WIOLA_CHECK(opt.any_tokenizer || want.empty() || want == tok_->sha256(), opt.tokenizer,
                ": not the tokenizer this model was trained with (sha256 ", tok_->sha256().substr(0, 12),
                "…, the training data's ", want.substr(0, 12), "…); pass --any-tokenizer to use it anyway");
  }
  WIOLA_CHECK(tok_->vocab_size() == uint32_t(cfg_.V), tok_origin_, ": the tokenizer's vocabulary has ",
              tok_->vocab_size(), " ids, the model's ", cfg_.V, " (V): they do not belong together");
}

}  // namespace wiola::infer
