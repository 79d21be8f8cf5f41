// What every `wiola` subcommand does with CLI11: parse, print --help, or
// turn a parse error into one "wiola NAME: error:" line.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>

namespace wiola::cli {

// -1: parsed, go on; otherwise the exit status to return (0 after --help).
inline int parse(CLI::App& app, int argc, char** argv, const char* name) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "wiola %s: error: %s (see wiola %s --help)\n", name, e.what(), name);
    return 1;
  }
  return -1;
}

}  // namespace wiola::cli
