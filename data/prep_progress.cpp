#include "data/prep_progress.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/json.h"

namespace fs = std::filesystem;

namespace wiola {

void save_prep_progress(const std::string& partial_dir, const std::string& identity_json, const Manifest& m,
                        const std::map<std::string, SplitResume>& resume) {
  nlohmann::ordered_json prep;
  prep["identity"] = nlohmann::ordered_json::parse(identity_json);
  for (const auto& [split, r] : resume)
    prep["resume"][split] = {{"docs_written", r.docs_written}, {"partial_tokens", r.partial_tokens}};
  Manifest p = m;
  p.extra_json = prep.dump();
  write_manifest((fs::path(partial_dir) / kPrepProgressName).string(), p);  // temp + rename
}

namespace {

std::string shortened(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 160 ? s.substr(0, 160) + "..." : s;
}

// The first difference between two identities, as "key: now X, then Y".
std::string first_difference(const nlohmann::json& now, const nlohmann::json& then) {
  for (const auto& [key, v] : now.items()) {
    const nlohmann::json t = then.contains(key) ? then[key] : nlohmann::json();
    if (v == t) continue;
    if (v.is_array() && t.is_array())
      for (size_t i = 0; i < std::max(v.size(), t.size()); ++i) {
        const nlohmann::json a = i < v.size() ? v[i] : nlohmann::json(), b = i < t.size() ? t[i] : nlohmann::json();
        if (a != b) return key + "[" + std::to_string(i) + "]: now " + shortened(a) + ", then " + shortened(b);
      }
    return key + ": now " + shortened(v) + ", then " + shortened(t);
  }
  return "format of the progress record";
}

}  // namespace

std::optional<PrepProgress> load_prep_progress(const std::string& partial_dir, const std::string& identity_json) {
  const std::string path = (fs::path(partial_dir) / kPrepProgressName).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  PrepProgress p;
  p.shards = read_manifest(path);
  try {
    const nlohmann::json prep = nlohmann::json::parse(p.shards.extra_json);
    const nlohmann::json now = nlohmann::json::parse(identity_json);
    if (prep.at("identity") != now)
      fail(partial_dir, " holds an interrupted prep of other inputs or options (", first_difference(now, prep["identity"]),
           "); rerun with the same ones to resume it, or add --fresh to discard it");
    for (const auto& [split, r] : prep.at("resume").items())
      p.resume[split] = SplitResume{json_int<uint64_t>(r.at("docs_written"), path + ": docs_written"),
                                    json_int<uint64_t>(r.at("partial_tokens"), path + ": partial_tokens")};
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed prep progress record (", e.what(), "); add --fresh to discard it");
  }
  return p;
}

}  // namespace wiola
