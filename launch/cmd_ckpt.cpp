// `wiola ckpt`: look at, check and export sharded checkpoints (the format of
// train/checkpoint.h) without a training job.
//
//   wiola ckpt inspect PATH [--tensors] [--json]
//   wiola ckpt verify PATH [--all]
//   wiola ckpt consolidate PATH OUT.h5 [--with-optimizer]
//
// PATH is a checkpoint folder (DIR/step-NNNNNNNN) or a checkpoint directory
// (its `latest`, else its newest complete checkpoint). Bad input is one line
// `wiola ckpt: error: ...` on stderr and exit status 1 (main's handler);
// verify exits 1 when a checkpoint is damaged, after one line per problem.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "train/checkpoint.h"
#include "train/checkpoint_tools.h"
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

}  // namespace

int wiola_cmd_ckpt(int argc, char** argv) {
  CLI::App app{"Inspect, verify and consolidate sharded checkpoints", "wiola ckpt"};
  app.require_subcommand(1);
  std::string path, out;
  bool tensors = false, as_json = false, all = false, with_opt = false;
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

  // CLI11 would call a stray word "a subcommand is required"; name it instead.
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string sub = argv[1];
    WIOLA_CHECK(sub == "inspect" || sub == "verify" || sub == "consolidate", "unknown subcommand '", sub,
                "' (inspect, verify or consolidate)");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "wiola ckpt: error: %s (see wiola ckpt --help)\n", e.what());
    return 1;
  }

  if (verify->parsed()) {
    if (all) return verify_all(path);
    return verify_one(wiola::ckpt::resolve_checkpoint(path)) ? 0 : 1;
  }
  const std::string folder = wiola::ckpt::resolve_checkpoint(path);
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
