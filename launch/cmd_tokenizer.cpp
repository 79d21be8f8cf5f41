// `wiola tokenizer encode|decode|train`: byte-level BPE from the command line.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "data/bpe_trainer.h"
#include "data/text_input.h"
#include "data/tokenizer.h"
#include "launch/cli.h"
#include "util/error.h"
#include "util/files.h"

namespace {

// Reads all lines (newline stripped) of `path`, or stdin when empty / "-".
std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::string text;
  if (path.empty() || path == "-") {
    std::string line;
    while (std::getline(std::cin, line)) lines.push_back(std::move(line));
    return lines;
  }
  text = wiola::read_file(path);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t e = text.find('\n', pos);
    if (e == std::string::npos) e = text.size();
    lines.emplace_back(text, pos, e - pos);
    pos = e + 1;
  }
  return lines;
}

const char* name_of(const std::string& input) { return input.empty() || input == "-" ? "<stdin>" : input.c_str(); }

int run_encode(const std::string& tok_path, const std::string& input, bool no_special) {
  wiola::Tokenizer tok = wiola::Tokenizer::load(tok_path);
  std::vector<std::string> lines = read_lines(input);
  std::vector<std::string> out(lines.size());
  std::string error;
#pragma omp parallel for schedule(dynamic, 256)
  for (size_t i = 0; i < lines.size(); ++i) {
    try {
      std::vector<int32_t> ids;
      tok.encode(lines[i], ids, !no_special);
      std::string& s = out[i];
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k) s += ' ';
        s += std::to_string(ids[k]);
      }
    } catch (const wiola::Error& e) {
#pragma omp critical
      if (error.empty()) error = std::string(name_of(input)) + ":" + std::to_string(i + 1) + ": " + e.what();
    }
  }
  if (!error.empty()) throw wiola::Error(error);
  for (const std::string& s : out) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

int run_decode(const std::string& tok_path, const std::string& input) {
  wiola::Tokenizer tok = wiola::Tokenizer::load(tok_path);
  std::vector<std::string> lines = read_lines(input);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < lines.size(); ++i) {
    ids.clear();
    const char* p = lines[i].c_str();
    while (*p) {
      while (*p == ' ' || *p == '\t' || *p == '\r') ++p;
      if (!*p) break;
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(p, &end, 10);
      if (end == p || errno || v < 0 || v > INT32_MAX)
        wiola::fail(name_of(input), ":", i + 1, ": not a list of token ids");
      ids.push_back(int32_t(v));
      p = end;
    }
    std::string text;
    try {
      text = tok.decode(ids);
    } catch (const wiola::Error& e) {
      wiola::fail(name_of(input), ":", i + 1, ": ", e.what());
    }
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  }
  return 0;
}

}  // namespace

int wiola_cmd_tokenizer(int argc, char** argv) {
  CLI::App app{"Byte-level BPE tokenizer (Hugging Face tokenizer.json)", "wiola tokenizer"};
  app.require_subcommand(1);
  std::string tok_path, input, output;
  bool no_special = false;
  auto* enc = app.add_subcommand("encode", "one line of space-separated ids per input line (no special tokens added)");
  enc->add_option("--tokenizer", tok_path, "tokenizer.json")->required();
  enc->add_option("--input", input, "text file (default: stdin)");
  enc->add_flag("--no-parse-special", no_special, "treat special-token text (e.g. <eos>) as plain text");
  auto* dec = app.add_subcommand("decode", "inverse of encode: one text line per line of ids");
  dec->add_option("--tokenizer", tok_path, "tokenizer.json")->required();
  dec->add_option("--input", input, "file of ids (default: stdin)");
  wiola::BpeTrainOptions topt;
  std::vector<std::string> texts;
  auto* tr = app.add_subcommand("train", "train a byte-level BPE, write a Hugging Face tokenizer.json");
  tr->add_option("--vocab-size", topt.vocab_size, "vocabulary size incl. special tokens")->required();
  tr->add_option("--output", output, "tokenizer.json to write")->required();
  tr->add_option("--special-tokens", topt.special_tokens, "special tokens (ids 0..k-1)");
  tr->add_option("--min-frequency", topt.min_frequency, "stop when the best pair is rarer");
  tr->add_option("--threads", topt.threads, "threads (0: all cores)");
  tr->add_option("TEXT", texts, "text files, directories or globs")->required();
  if (const int rc = wiola::cli::parse(app, argc, argv, "tokenizer"); rc >= 0) return rc;
  if (enc->parsed()) return run_encode(tok_path, input, no_special);
  if (dec->parsed()) return run_decode(tok_path, input);
  topt.progress = true;
  std::string json = wiola::train_bpe(wiola::expand_inputs(texts), topt);
  wiola::write_text_atomic(output, json);
  wiola::Tokenizer check = wiola::Tokenizer::load(output);
  std::fprintf(stderr, "wrote %s: vocab %u, %zu merges, sha256 %s\n", output.c_str(), check.vocab_size(),
               check.model().num_merges(), check.sha256().c_str());
  return 0;
}
