// `wiola ckpt`: look at, check and export sharded checkpoints (the format of
// ckpt/format.h) without a training job.
//
//   wiola ckpt inspect PATH [--tensors] [--json]
//   wiola ckpt verify PATH [--all]
//   wiola ckpt consolidate PATH OUT.h5 [--with-optimizer]
//   wiola ckpt diff A B [--tol R] [--tol-tensor R] [--with-optimizer] [--top N] [--json]
//
// PATH is a checkpoint folder (DIR/step-NNNNNNNN) or a checkpoint directory
// (its `latest`, else its newest complete checkpoint). Bad input is one line
// `wiola ckpt: error: ...` on stderr and exit status 1 (main's handler);
// verify exits 1 when a checkpoint is damaged, after one line per problem;
// diff exits 1 when the checkpoints differ beyond its bounds (bit for bit by
// default), after its report.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ckpt/format.h"
#include "ckpt/tools.h"
#include "launch/cli.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string human_bytes(uint64_t b) {
  char s[32];
  if (b < 1024) std::snprintf(s, sizeof s, "%llu B", (unsigned long long)b);
  else if (b < (1ull << 20)) std::snprintf(s, sizeof s, "%.1f KiB", double(b) / 1024);
  else if (b < (1ull << 30)) std::snprintf(s, sizeof s, "%.1f MiB", double(b) / (1 << 20));
  else std::snprintf(s, sizeof s, "%.2f GiB", double(b) / (1ull << 30));
  return s;
}

// A slice [r0, c0, nr, nc] as half-open global ranges; vectors by rows only.
std::string slice_text(const json& s, int64_t cols) {
  const int64_t r0 = s[0], c0 = s[1], nr = s[2], nc = s[3];
  std::string t = "[" + std::to_string(r0) + ":" + std::to_string(r0 + nr);
  if (cols > 1) t += ", " + std::to_string(c0) + ":" + std::to_string(c0 + nc);
  return t + "]";
}

std::string slices_text(const json& arr, int64_t cols) {
  std::string t;
  for (const json& s : arr) t += (t.empty() ? "" : " ") + slice_text(s, cols);
  return t;
}

// Prints a JSON scalar without quotes (strings) for the text report.
std::string plain(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

void print_summary(const json& s) {
  std::printf("checkpoint  %s\n", s["checkpoint"].get<std::string>().c_str());
  std::printf("step        %lld (tokens %lld, skipped steps %lld)\n", (long long)s["step"].get<int64_t>(),
              (long long)s["tokens"].get<int64_t>(), (long long)s["skipped"].get<int64_t>());
  std::printf("run id      %s\n", s["run_id"].get<std::string>().c_str());
  if (s.contains("model") && s["model"].is_object()) {
    std::string m;
    for (const auto& [k, v] : s["model"].items()) m += (m.empty() ? "" : ", ") + k + " " + plain(v);
    std::printf("model       %s\n", m.c_str());
  }
  if (s.contains("layout") && s["layout"].is_object()) {
    const json& l = s["layout"];
    std::string t;
    for (const char* k : {"tp", "pp", "dp"})
      if (l.contains(k)) t += (t.empty() ? "" : " x ") + std::string(k) + " " + plain(l[k]);
    if (l.contains("zero")) t += std::string(", ZeRO ") + (l["zero"].get<bool>() ? "on" : "off");
    if (l.contains("stages") && l["stages"].is_array()) {
      t += ", stages";
      for (const json& st : l["stages"]) t += " [" + plain(st[0]) + ", " + plain(st[1]) + ")";
    }
    std::printf("layout      %s\n", t.c_str());
  }
  if (s.contains("backend")) {
    std::string t = plain(s["backend"]);
    if (s.contains("precision") && s["precision"].is_object()) {
      t += "; precision:";
      for (const auto& [k, v] : s["precision"].items()) t += " " + k + " " + plain(v);
    }
    std::printf("backend     %s\n", t.c_str());
  }
  std::printf("files       %zu, %s\n", s["files"].size(), human_bytes(s["bytes"].get<uint64_t>()).c_str());
  for (const json& f : s["files"]) {
    const json& g = f["grid_coord"];
    std::printf("  %s  rank %d  tp %d pp %d dp %d  %llu bytes\n", f["name"].get<std::string>().c_str(),
                f["rank"].get<int>(), g["tp"].get<int>(), g["pp"].get<int>(), g["dp"].get<int>(),
                (unsigned long long)f["bytes"].get<uint64_t>());
  }
  std::printf("tensors     %lld, %lld parameters\n", (long long)s["tensors"].get<int64_t>(),
              (long long)s["parameters"].get<int64_t>());
  std::string el;
  for (const char* k : wiola::ckpt::kKinds) el += (el.empty() ? "" : ", ") + std::string(k) + " " + plain(s["elements"][k]);
  std::printf("elements    %s\n", el.c_str());
  if (!s.contains("tensor_list")) return;
  for (const json& t : s["tensor_list"]) {
    const int64_t rows = t["shape"][0], cols = t["shape"][1];
    if (cols > 1) std::printf("%s  [%lld, %lld]\n", t["name"].get<std::string>().c_str(), (long long)rows, (long long)cols);
    else std::printf("%s  [%lld]\n", t["name"].get<std::string>().c_str(), (long long)rows);
    for (const auto& [file, by_kind] : t["slices"].items()) {
      // The moments are stored exactly where the parameters are (the same
      // ZeRO ranges); one line per file unless a checkpoint says otherwise.
      bool same = by_kind.contains("param");
      for (const auto& [kind, arr] : by_kind.items()) same = same && arr == by_kind["param"];
      if (same) {
        std::printf("  %s  %s\n", file.c_str(), slices_text(by_kind["param"], cols).c_str());
        continue;
      }
      for (const auto& [kind, arr] : by_kind.items())
        std::printf("  %s %s  %s\n", file.c_str(), kind.c_str(), slices_text(arr, cols).c_str());
    }
  }
}

// One checkpoint: its problems, then OK or DAMAGED. Returns whether sound.
// A folder whose manifest.json is valid JSON of something else (a data
// manifest) is bad input, not a damaged checkpoint.
bool verify_one(const std::string& folder) {
  size_t kinds = 3;
  {
    std::ifstream in(fs::path(folder) / "manifest.json");
    const json mf = json::parse(in, nullptr, /*allow_exceptions=*/false);
    WIOLA_CHECK(mf.is_discarded() || (mf.is_object() && mf.value("format", "") == wiola::ckpt::kFormat),
                "'", folder, "' is not a checkpoint (its manifest.json is not a ", wiola::ckpt::kFormat,
                " manifest)");
    if (!mf.is_discarded()) kinds = wiola::ckpt::stored_kinds(mf, folder + "/manifest.json").size();
  }
  wiola::ckpt::VerifyStats st;
  const std::vector<std::string> problems = wiola::ckpt::verify_deep(folder, &st);
  for (const std::string& p : problems) std::printf("%s\n", p.c_str());
  if (problems.empty()) {
    std::printf("OK: %s: %d files, %lld tensors x %zu kind%s, %lld elements each, %lld datasets; every element "
                "stored once, every file and dataset checksum matches\n",
                folder.c_str(), st.files, (long long)st.tensors, kinds, kinds == 1 ? "" : "s", (long long)st.elements,
                (long long)st.datasets);
    return true;
  }
  std::printf("DAMAGED: %s: %zu problem%s\n", folder.c_str(), problems.size(), problems.size() == 1 ? "" : "s");
  return false;
}

int verify_all(const std::string& dir) {
  WIOLA_CHECK(fs::is_directory(dir), "checkpoint directory '", dir, "': no such directory");
  if (fs::exists(fs::path(dir) / "manifest.json")) return verify_one(dir) ? 0 : 1;  // one checkpoint
  const std::vector<std::string> all = wiola::ckpt::list_checkpoints(dir);
  WIOLA_CHECK(!all.empty(), "checkpoint directory '", dir, "' holds no complete checkpoint (step-N/manifest.json)");
  int damaged = 0;
  for (const std::string& c : all) damaged += verify_one(c) ? 0 : 1;
  // `latest` is what a resume starts from: it must name a complete one.
  std::ifstream latest(fs::path(dir) / "latest");
  std::string name;
  if (latest && std::getline(latest, name) && !fs::exists(fs::path(dir) / name / "manifest.json")) {
    std::printf("%s: names '%s', which is not a complete checkpoint\n", (fs::path(dir) / "latest").c_str(),
                name.c_str());
    ++damaged;
  }
  if (damaged == 0) std::printf("OK: %s: all %zu checkpoints sound\n", dir.c_str(), all.size());
  else std::printf("DAMAGED: %s: %d problem checkpoint%s of %zu\n", dir.c_str(), damaged, damaged == 1 ? "" : "s",
                   all.size());
  return damaged == 0 ? 0 : 1;
}


// `wiola ckpt diff`'s bounds: none (bit for bit), or norm-wise relative ones.
struct DiffBounds {
  double tol = -1;         // whole model, parameters; < 0: bit for bit
  double tol_tensor = -1;  // each tensor of each kind (default 10 x tol)
  bool exact() const { return tol < 0; }
};

// One side of a diff: folder, step, tokens, layout and backend.
std::string side_text(const json& s) {
  std::string t = s["checkpoint"].get<std::string>() + "  (step " + plain(s["step"]) + ", tokens " + plain(s["tokens"]);
  if (s.contains("layout") && s["layout"].is_object()) {
    const json& l = s["layout"];
    for (const char* k : {"tp", "pp", "dp"})
      if (l.contains(k)) t += std::string(k == std::string("tp") ? ", " : " x ") + k + " " + plain(l[k]);
  }
  if (s.contains("backend")) t += ", backend " + plain(s["backend"]);
  return t + ")";
}

bool tensor_within(const wiola::ckpt::TensorDiff& d, const DiffBounds& b) {
  return b.exact() ? d.differing == 0 : d.rel <= b.tol_tensor;
}

bool diff_within(const wiola::ckpt::DiffResult& r, const DiffBounds& b) {
  // Bit for bit: every tensor (model_rel is 0 then); else the model too.
  return (b.exact() || r.model_rel <= b.tol) &&
         std::all_of(r.tensors.begin(), r.tensors.end(), [&](const auto& d) { return tensor_within(d, b); });
}

json diff_json(const wiola::ckpt::DiffResult& r, const DiffBounds& b, bool same) {
  json tensors = json::array();
  for (const auto& d : r.tensors)
    tensors.push_back({{"kind", d.kind}, {"name", d.name}, {"elements", d.elements}, {"differing", d.differing},
                       {"max_abs", std::isfinite(d.max_abs) ? json(d.max_abs) : json("inf")},
                       {"rel", std::isfinite(d.rel) ? json(d.rel) : json("inf")}});
  return {{"a", r.summary_a["checkpoint"]}, {"b", r.summary_b["checkpoint"]},
          {"step", {r.summary_a["step"], r.summary_b["step"]}},
          {"tokens", {r.summary_a["tokens"], r.summary_b["tokens"]}},
          {"model_keys_differ", r.model_keys_differ},
          {"elements", r.elements}, {"differing", r.differing},
          {"model_rel", std::isfinite(r.model_rel) ? json(r.model_rel) : json("inf")},
          {"bounds", b.exact() ? json("exact") : json({{"tol", b.tol}, {"tol_tensor", b.tol_tensor}})},
          {"same", same}, {"tensors", std::move(tensors)}};
}

void print_diff(const wiola::ckpt::DiffResult& r, const DiffBounds& b, int top, bool same) {
  std::printf("a  %s\n", side_text(r.summary_a).c_str());
  std::printf("b  %s\n", side_text(r.summary_b).c_str());
  if (r.summary_a["step"] != r.summary_b["step"]) std::printf("note: the checkpoints are of different steps\n");
  if (!r.model_keys_differ.empty()) {
    std::string k;
    for (const auto& s : r.model_keys_differ) k += (k.empty() ? "" : ", ") + s;
    std::printf("note: model settings that differ (the tensors' shapes agree): %s\n", k.c_str());
  }
  std::map<std::string, std::pair<int, int>> per_kind;  // kind -> (identical, tensors)
  for (const auto& d : r.tensors) {
    per_kind[d.kind].second++;
    if (d.differing == 0) per_kind[d.kind].first++;
  }
  for (const auto& [kind, n] : per_kind)
    std::printf("%-10s %d of %d tensors bit-identical\n", kind.c_str(), n.first, n.second);
  std::printf("parameters %lld of %lld elements differ; whole model ||b-a||/||a|| = %.3e\n",
              (long long)r.differing, (long long)r.elements, r.model_rel);
  std::vector<const wiola::ckpt::TensorDiff*> order;
  for (const auto& d : r.tensors)
    if (d.differing > 0) order.push_back(&d);
  std::stable_sort(order.begin(), order.end(), [](auto* x, auto* y) { return x->rel > y->rel; });
  if (!order.empty()) {
    const size_t n = std::min(order.size(), size_t(std::max(top, 0)));
    std::printf("largest differences (%zu of %zu tensors that differ; rel = ||b-a||/||a||):\n", n, order.size());
    for (size_t i = 0; i < n; ++i) {
      const auto& d = *order[i];
      std::printf("  %-10s %-52s rel %.3e  max |b-a| %.3e  %lld of %lld differ%s\n", d.kind.c_str(),
                  d.name.c_str(), d.rel, d.max_abs, (long long)d.differing, (long long)d.elements,
                  tensor_within(d, b) ? "" : "  <- beyond the bound");
    }
  }
  if (b.exact()) std::printf("%s (bit for bit)\n", same ? "SAME" : "DIFFERENT");
  else
    std::printf("%s (whole model within %.1e: %s; each tensor within %.1e)\n", same ? "SAME" : "DIFFERENT", b.tol,
                r.model_rel <= b.tol ? "yes" : "no", b.tol_tensor);
}
}  // namespace

int wiola_cmd_ckpt(int argc, char** argv) {
  CLI::App app{"Inspect, verify and consolidate sharded checkpoints", "wiola ckpt"};
  app.require_subcommand(1);
  std::string path, out, path_b;
  bool tensors = false, as_json = false, all = false, with_opt = false;
  DiffBounds bounds;
  int top = 10;
  const char* path_help = "checkpoint folder (step-N) or checkpoint directory (its latest)";

  CLI::App* inspect = app.add_subcommand("inspect", "print what a checkpoint holds");
  inspect->add_option("PATH", path, path_help)->required();
  inspect->add_flag("--tensors", tensors, "also every tensor with its shape and its slices per file");
  inspect->add_flag("--json", as_json, "print the summary as JSON");

  CLI::App* verify = app.add_subcommand(
      "verify", "full integrity check (manifest, file sizes and hashes, dataset hashes, coverage); exit 1 if damaged");
  verify->add_option("PATH", path, path_help)->required();
  verify->add_flag("--all", all, "check every checkpoint of the directory PATH");

  CLI::App* consolidate = app.add_subcommand(
      "consolidate", "write one unsharded HDF5 file: /param/NAME (global shape), root attrs step, tokens, config");
  consolidate->add_option("PATH", path, path_help)->required();
  consolidate->add_option("OUT", out, "output .h5 (written to OUT.tmp, then renamed)")->required();
  consolidate->add_flag("--with-optimizer", with_opt, "also the AdamW moments: /exp_avg/NAME, /exp_avg_sq/NAME");

  CLI::App* diff = app.add_subcommand(
      "diff", "compare two checkpoints tensor by tensor, any layouts; exit 1 if they differ beyond the bounds");
  diff->add_option("A", path, "the reference: " + std::string(path_help))->required();
  diff->add_option("B", path_b, "the checkpoint compared with A")->required();
  diff->add_option("--tol", bounds.tol,
                   "allowed ||b-a||/||a|| of the whole model's parameters (default: bit for bit)")
      ->check(CLI::NonNegativeNumber);
  diff->add_option("--tol-tensor", bounds.tol_tensor, "allowed ||b-a||/||a|| of each tensor (default 10 x --tol)")
      ->check(CLI::NonNegativeNumber)
      ->needs("--tol");
  diff->add_flag("--with-optimizer", with_opt, "also compare the AdamW moments exp_avg and exp_avg_sq");
  diff->add_option("--top", top, "list this many of the tensors that differ most (default 10)")
      ->check(CLI::NonNegativeNumber);
  diff->add_flag("--json", as_json, "print the comparison as JSON (every tensor)");

  // CLI11 would call a stray word "a subcommand is required"; name it instead.
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string sub = argv[1];
    WIOLA_CHECK(sub == "inspect" || sub == "verify" || sub == "consolidate" || sub == "diff",
                "unknown subcommand '", sub, "' (inspect, verify, consolidate or diff)");
  }
  if (const int rc = wiola::cli::parse(app, argc, argv, "ckpt"); rc >= 0) return rc;

  if (verify->parsed()) {
    if (all) return verify_all(path);
    return verify_one(wiola::ckpt::resolve_checkpoint(path)) ? 0 : 1;
  }
  const std::string folder = wiola::ckpt::resolve_checkpoint(path);
  if (diff->parsed()) {
    if (bounds.tol >= 0 && bounds.tol_tensor < 0) bounds.tol_tensor = 10 * bounds.tol;
    const auto r = wiola::ckpt::diff(folder, wiola::ckpt::resolve_checkpoint(path_b), with_opt);
    const bool same = diff_within(r, bounds);
    if (as_json) std::printf("%s\n", diff_json(r, bounds, same).dump(1).c_str());
    else print_diff(r, bounds, top, same);
    return same ? 0 : 1;
  }
  if (inspect->parsed()) {
    const json s = wiola::ckpt::summary(wiola::ckpt::Reader(folder), tensors);
    if (as_json) std::printf("%s\n", s.dump(1).c_str());
    else print_summary(s);
    return 0;
  }
  const auto st = wiola::ckpt::consolidate(folder, out, with_opt);
  std::printf("wrote %s from %s (step %lld): %lld tensors, %lld parameters%s, %s\n", out.c_str(), folder.c_str(),
              (long long)st.step, (long long)st.tensors, (long long)st.elements,
              with_opt ? " with exp_avg and exp_avg_sq" : "", human_bytes(st.bytes).c_str());
  return 0;
}
