#include "ckpt/manifest.h"

#include <toml++/toml.h>

#include <sstream>

#include "util/error.h"
#include "util/json.h"

namespace wiola {

nlohmann::json run_identity(const RunConfig& rc, const DatasetInfo& di, const TokenLoader* data) {
  // The [model] table exactly as the effective config writes it.
  const toml::table t = toml::parse(run_config_to_toml(rc));
  std::ostringstream js;
  js << toml::json_formatter{*t["model"].as_table()};
  nlohmann::json id = {{"model", nlohmann::json::parse(js.str())},
                       {"global_batch", rc.global_batch()},
                       {"train.seed", rc.train.seed},
                       {"data.seed", rc.data.seed >= 0 ? uint64_t(rc.data.seed) : rc.train.seed},
                       {"data.shuffle", rc.data.shuffle},
                       {"data.documents", rc.data.documents},
                       {"data.tokenizer_sha256", di.tokenizer_sha256},
                       {"data.train_tokens", di.num_tokens},
                       {"data.train_documents", di.num_documents}};
  // The documents' order too, where the data's manifest records its content
  // hash (wiola prep writes it; manifests from before it lack it).
  if (!di.content_xxh3.empty()) id["data.train_xxh3"] = di.content_xxh3;
  // A blend: each source by its size and share, in order (not by its path:
  // the data may move between a run and its resume; the share, not the
  // weight, decides the stream).
  if (data && data->num_sources() > 1)
    for (size_t k = 0; k < data->num_sources(); ++k) {
      nlohmann::json s = {{"share", data->source_share(k)},
                          {"train_tokens", data->source_info(k).num_tokens},
                          {"train_documents", data->source_info(k).num_documents}};
      if (!data->source_info(k).content_xxh3.empty()) s["train_xxh3"] = data->source_info(k).content_xxh3;
      id["data.blend"].push_back(std::move(s));
    }
  return id;
}

nlohmann::json loader_state_to_json(const LoaderState& s) {
  nlohmann::json j = {{"seed", s.seed}, {"epoch", s.epoch}, {"samples_consumed", s.samples_consumed}};
  for (const SourceCursor& c : s.blend)
    j["blend"].push_back({{"epoch", c.epoch}, {"samples_consumed", c.samples_consumed}, {"drawn", c.drawn}});
  return j;
}

LoaderState loader_state_from_json(const nlohmann::json& j, const std::string& where) {
  LoaderState s;
  s.seed = json_int<uint64_t>(j.at("seed"), where + ".seed");
  s.epoch = json_int<uint64_t>(j.at("epoch"), where + ".epoch");
  s.samples_consumed = json_int<uint64_t>(j.at("samples_consumed"), where + ".samples_consumed");
  if (j.contains("blend")) {
    WIOLA_CHECK(j["blend"].is_array() && j["blend"].size() >= 2, where,
                ".blend: expected an array of at least "
                "two source cursors");
    for (size_t k = 0; k < j["blend"].size(); ++k) {
      const nlohmann::json& c = j["blend"][k];
      const std::string at = where + ".blend[" + std::to_string(k) + "]";
      s.blend.push_back({json_int<uint64_t>(c.at("epoch"), at + ".epoch"),
                         json_int<uint64_t>(c.at("samples_consumed"), at + ".samples_consumed"),
                         json_int<uint64_t>(c.at("drawn"), at + ".drawn")});
    }
  }
  return s;
}

}  // namespace wiola
