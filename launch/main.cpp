// `wiola` — one binary, one subcommand per job.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/simd.h"
#include "util/env.h"
#include "util/error.h"

// Each subcommand lives in its own launch/cmd_*.cpp; argv[0] is its name.
int wiola_cmd_train(int argc, char** argv);
int wiola_cmd_bench(int argc, char** argv);
int wiola_cmd_tokenizer(int argc, char** argv);
int wiola_cmd_prep(int argc, char** argv);
int wiola_cmd_ckpt(int argc, char** argv);
int wiola_cmd_generate(int argc, char** argv);
int wiola_cmd_eval(int argc, char** argv);
int wiola_cmd_export(int argc, char** argv);
int wiola_cmd_import(int argc, char** argv);
int wiola_cmd_plan(int argc, char** argv);

namespace {
struct Sub {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
  bool computes = true;  // runs matrix products (on the CPU backend, or to calibrate)
};
const Sub kSubs[] = {
    {"train", wiola_cmd_train, "train a Wiola model from a TOML run config"},
    {"bench", wiola_cmd_bench, "benchmarks (bench step: fwd+bwd+AdamW)"},
    {"tokenizer", wiola_cmd_tokenizer, "encode / decode / train byte-level BPE", false},
    {"prep", wiola_cmd_prep, "tokenize text into HDF5 token shards", false},
    {"ckpt", wiola_cmd_ckpt, "inspect / verify / consolidate checkpoints", false},
    {"generate", wiola_cmd_generate, "generate text from a checkpoint (KV-cached)"},
    {"eval", wiola_cmd_eval, "loss and perplexity of a checkpoint on a split or a text"},
    {"export", wiola_cmd_export, "write a checkpoint as a Hugging Face transformers folder"},
    {"import", wiola_cmd_import, "a Hugging Face safetensors folder as a wiola checkpoint"},
    {"plan", wiola_cmd_plan, "predict step time, MFU and memory per layout; best layout and run time on a cluster"},
};

int usage(FILE* f) {
  std::fprintf(f, "usage: wiola <subcommand> [options]   (wiola --version: build and CPU)\n\nsubcommands:\n");
  for (const Sub& s : kSubs) std::fprintf(f, "  %-10s %s\n", s.name, s.help);
  std::fprintf(f, "\n'wiola <subcommand> --help' for its options.\n");
  return f == stdout ? 0 : 2;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s.empty() ? "none" : s;
}

// Version, how the binary was built and what it runs on here (docs/cpu.md).
int version() {
  namespace c = wiola::cpu;
  const bool env = !wiola::env_text("WIOLA_SIMD").empty();
  const std::string target = c::simd_target_name();  // applies WIOLA_SIMD: may throw
  const c::BlasState& blas = c::blas_state();        // selects the BLAS kernels: may throw
  std::printf("wiola %s\n", WIOLA_VERSION);
  std::printf("  build baseline  -march=%s\n", c::simd_build_march());
  std::printf("  SIMD compiled   %s\n", joined(c::simd_compiled_targets()).c_str());
  std::printf("  SIMD supported  %s\n", joined(c::simd_supported_targets()).c_str());
  std::printf("  CPU             %s\n", c::cpu_model_name().c_str());
  std::printf("  SIMD target     %s (%s)\n", target.c_str(), env ? "WIOLA_SIMD" : "best supported");
  std::printf("  BLAS            %s\n", blas.summary().c_str());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage(stderr);
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") return usage(stdout);
  if (cmd == "-V" || cmd == "--version") {
    try {
      return version();
    } catch (const wiola::Error& e) {
      std::fprintf(stderr, "wiola: error: %s\n", e.what());
      return 1;
    }
  }
  for (const Sub& s : kSubs) {
    if (cmd == s.name) {
      try {
        // OpenBLAS's kernels for this CPU (kernels/cpu/blas.h), chosen here
        // before MPI or anything else starts threads; the CPU backend's
        // constructor would otherwise.
        if (s.computes) wiola::cpu::blas_init();
        return s.fn(argc - 1, argv + 1);
      } catch (const wiola::Error& e) {
        std::fprintf(stderr, "wiola %s: error: %s\n", s.name, e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "wiola %s: internal error: %s\n", s.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "wiola: unknown subcommand '%s'\n", cmd.c_str());
  return usage(stderr);
}
