// Tuning tables of per-shape GEMM choices: see gemm_tuning.h.
#include "kernels/gemm_tuning.h"

#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cstdio>

#include "util/error.h"

namespace wiola {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "wiola-gemm-tuning";
constexpr int kVersion = 1;

json choice_json(const GemmChoice& c) {
  json j{{"algo", c.algo}};
  if (c.algo == "cublaslt") {
    json words = json::array();
    for (uint64_t w : c.lt_algo) {
      char buf[24];
      std::snprintf(buf, sizeof buf, "0x%016" PRIx64, w);
      words.push_back(buf);
    }
    j["lt_algo"] = words;
    j["config"] = c.config;
  }
  if (c.us > 0) j["us"] = c.us;
  if (!c.tried.empty()) j["tried"] = c.tried;
  return j;
}

GemmChoice choice_from(const json& j, const std::string& where) {
  GemmChoice c;
  c.algo = j.at("algo").get<std::string>();
  WIOLA_CHECK(c.algo == "cublas" || c.algo == "cublaslt", where, ": algo \"", c.algo,
              "\" is neither cublas nor cublaslt");
  if (c.algo == "cublaslt") {
    for (const auto& w : j.at("lt_algo")) c.lt_algo.push_back(std::stoull(w.get<std::string>(), nullptr, 16));
    WIOLA_CHECK(c.lt_algo.size() == 8, where, ": lt_algo has ", c.lt_algo.size(), " words, not 8");
    c.config = j.value("config", "");
  }
  c.us = j.value("us", 0.0);
  if (j.contains("tried")) c.tried = j["tried"].get<std::vector<std::string>>();
  return c;
}

json table_json(const GemmTable& t) {
  json ch = json::object();
  for (const auto& [k, c] : t.choices) ch[k] = choice_json(c);
  return {{"device", t.device}, {"choices", ch}};
}

json parse_file(const std::string& text, const std::string& origin) {
  if (text.empty()) return {{"format", kFormat}, {"version", kVersion}, {"tables", json::array()}};
  json f;
  try {
    f = json::parse(text);
  } catch (const std::exception& e) {
    fail(origin, ": not a GEMM tuning file (", e.what(), ")");
  }
  WIOLA_CHECK(f.is_object() && f.value("format", "") == kFormat && f.value("version", 0) == kVersion &&
                  f.contains("tables") && f["tables"].is_array(),
              origin, ": not a GEMM tuning file (", kFormat, " version ", kVersion, ")");
  return f;
}

}  // namespace

std::string GemmKey::str() const {
  char buf[192];
  std::snprintf(buf, sizeof buf, "%c%c %dx%dx%d ld %d/%d/%d %s>%s beta%d align%d", ta ? 'T' : 'N', tb ? 'T' : 'N', m,
                n, k, lda, ldb, ldc, dtype_name(ab), dtype_name(c), beta_zero ? 0 : 1, align);
  return buf;
}

std::string gemm_tuning_json(const GemmTable& t) { return merge_gemm_tuning("", t); }

GemmTable gemm_table_for(const std::string& text, const std::string& device, const std::string& origin,
                         std::string* why) {
  GemmTable t;
  t.device = device;
  const json f = parse_file(text, origin);
  std::string others;
  for (const auto& tj : f["tables"]) {
    const std::string dev = tj.value("device", "");
    if (dev != device) {
      others += (others.empty() ? "" : "; ") + dev;
      continue;
    }
    try {
      for (const auto& [k, c] : tj.at("choices").items()) t.choices[k] = choice_from(c, origin + ": " + k);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(origin, ": the table for ", device, " is malformed (", e.what(), ")");
    }
    return t;
  }
  if (why)
    *why = text.empty() ? origin + " is empty"
                        : origin + " has no table for " + device +
                              (others.empty() ? std::string(" (it has none)") : " (it has tables for: " + others + ")");
  return t;
}

std::string merge_gemm_tuning(const std::string& text, const GemmTable& t) {
  json f = parse_file(text, "the tuning file");
  json tables = json::array();
  for (const auto& tj : f["tables"])
    if (tj.value("device", "") != t.device) tables.push_back(tj);
  tables.push_back(table_json(t));
  f["tables"] = tables;
  return f.dump(1) + "\n";
}

}  // namespace wiola
