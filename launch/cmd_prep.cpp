// `wiola prep`: tokenize text into HDF5 token shards + manifest (docs/model.md §6);
// `wiola prep --verify PATH` checks such an output against its manifest.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/prep.h"
#include "launch/cli.h"
#include "util/error.h"
#include "util/test_hooks.h"

namespace {

// `wiola prep --verify PATH`: the problems, one a line, then OK or DAMAGED.
int verify_prep_output(const std::string& path) {
  wiola::DataVerifyStats st;
  const std::vector<std::string> problems = wiola::verify_data(path, &st);
  for (const std::string& p : problems) std::printf("%s\n", p.c_str());
  const std::string hashes = std::to_string(st.hashes_checked) + " content hashes match" +
                             (st.hashes_absent ? ", " + std::to_string(st.hashes_absent) +
                                                     " absent (a prep from before they were recorded)"
                                               : "");
  if (problems.empty()) {
    std::printf("OK: %s: %d shards, %llu tokens read; counts and %s\n", path.c_str(), st.shards,
                (unsigned long long)st.tokens, hashes.c_str());
    return 0;
  }
  std::printf("DAMAGED: %s: %zu problem%s\n", path.c_str(), problems.size(), problems.size() == 1 ? "" : "s");
  return 1;
}

}  // namespace

int wiola_cmd_prep(int argc, char** argv) {
  CLI::App app{"Tokenize text (plain text, JSONL or Parquet) into HDF5 token shards with a manifest", "wiola prep"};
  wiola::PrepOptions opt;
  std::string format = "auto", verify;
  bool no_progress = false;
  app.add_option("INPUT", opt.inputs, "text / JSONL / Parquet files, directories or globs");
  app.add_option("--tokenizer", opt.tokenizer_path, "Hugging Face tokenizer.json (byte-level BPE)");
  app.add_option("-o,--output", opt.output_dir, "output folder (shards + manifest.json)");
  app.add_option("--verify", verify,
                 "instead: check a prep output (its folder or manifest.json): every shard read through, its counts "
                 "and content hashes against the manifest; exit 1 naming each problem")
      ->excludes("INPUT", "--tokenizer", "--output");
  app.add_option("--format", format, "auto (.jsonl/.json/.ndjson -> jsonl, .parquet -> parquet), text, jsonl or parquet");
  app.add_flag("--doc-per-file", opt.reader.doc_per_file, "text: each file is one document (default: blank lines separate documents)");
  app.add_option("--text-field", opt.reader.text_field, "JSONL field / Parquet column holding the text");
  app.add_option("--shard-tokens", opt.shard_tokens, "tokens per shard (default 100000000)");
  app.add_option("--val-fraction", opt.val_fraction, "fraction of documents for the val split (default 0.01)");
  app.add_option("--threads", opt.threads, "tokenizer threads (0: all cores)");
  app.add_option("--chunk-tokens", opt.shard.chunk_tokens, "HDF5 chunk size in tokens (default 16384)");
  app.add_option("--compression", opt.shard.deflate_level, "deflate level 0-9 (default 4)")->check(CLI::Range(0, 9));
  app.add_flag("--parse-special", opt.parse_special, "recognise special-token text such as <eos> in the input");
  app.add_flag("--no-progress", no_progress, "no progress bar");
  app.add_flag("--dedup", opt.dedup, "drop exact duplicate documents (the first occurrence stays; counted in the manifest)");
  app.add_flag("--skip-bad", opt.reader.skip_bad,
               "skip malformed input (a text document with invalid UTF-8, a bad JSONL line or Parquet row, the rest "
               "of a corrupt file), counted and reported, instead of failing");
  app.add_flag("--fresh", opt.fresh,
               "discard an interrupted prep in the output folder instead of resuming it (needed when the inputs or "
               "options changed)");
  if (const int rc = wiola::cli::parse(app, argc, argv, "prep"); rc >= 0) return rc;
  if (!verify.empty()) return verify_prep_output(verify);
  for (const auto& [what, missing] : {std::pair{"INPUT", opt.inputs.empty()}, std::pair{"--tokenizer", opt.tokenizer_path.empty()},
                                      std::pair{"--output", opt.output_dir.empty()}})
    WIOLA_CHECK(!missing, what, " is required (or --verify PATH; see wiola prep --help)");
  opt.reader.format = wiola::parse_input_format(format);
  opt.progress = !no_progress;
  if (const wiola::TestHook kill(wiola::Hook::PrepKillAfterShards); kill.set()) {
    kill.fields(1, 1);
    opt.test_kill_after_shards = int(kill.integer(0, 1, INT32_MAX));
  }
  wiola::PrepResult r = wiola::run_prep(opt);
  const auto& m = r.manifest;
  const auto& tr = m.splits.at("train");
  const auto& va = m.splits.at("val");
  std::printf("wrote %s\n", r.manifest_path.c_str());
  std::printf("  input: %.2f MB in %.2f s = %.2f MB/s\n", r.input_bytes / 1e6, r.seconds,
              r.seconds > 0 ? r.input_bytes / 1e6 / r.seconds : 0.0);
  std::printf("  train: %llu tokens, %llu documents, %zu shard(s)\n", (unsigned long long)tr.num_tokens,
              (unsigned long long)tr.num_documents, tr.shards.size());
  std::printf("  val:   %llu tokens, %llu documents, %zu shard(s)\n", (unsigned long long)va.num_tokens,
              (unsigned long long)va.num_documents, va.shards.size());
  std::printf("  tokenizer sha256 %s, vocab %u, eos %u\n", m.tokenizer_sha256.c_str(), m.vocab_size, m.eos_id);
  if (r.resumed_shards) std::printf("  resumed: %llu shard(s) kept from the interrupted prep\n", (unsigned long long)r.resumed_shards);
  if (opt.dedup) std::printf("  dedup: %llu duplicate document(s) removed\n", (unsigned long long)r.duplicates);
  if (opt.reader.skip_bad)
    std::printf("  skip-bad: %llu malformed line(s)/row(s)/file tail(s) skipped\n", (unsigned long long)r.bad_skipped);
  wiola::print_chinchilla_report(stdout, tr.num_tokens);
  return 0;
}
