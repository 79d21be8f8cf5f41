// `wiola export --format hf` and `wiola import`: a checkpoint as a Hugging
// Face transformers folder and back (docs/inference.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "infer/hf_export.h"
#include "launch/cli.h"
#include "util/error.h"

int wiola_cmd_export(int argc, char** argv) {
  CLI::App app{"Write a checkpoint as a Hugging Face transformers folder", "wiola export"};
  std::string checkpoint, out, format = "hf", dtype = "fp32", shard = "5GB";
  wiola::infer::ExportOptions opt;
  app.add_option("--checkpoint", checkpoint, "checkpoint folder (step-N) or checkpoint directory")->required();
  app.add_option("--format", format, "output format (hf)")->capture_default_str();
  app.add_option("OUT", out, "output folder (written under a temporary name, then renamed)")->required();
  app.add_option("--dtype", dtype, "weights as fp32 or bf16 (round to nearest even)")->capture_default_str();
  app.add_option("--max-shard-size", shard, "split model.safetensors above this size (KB, MB, GB)")
      ->capture_default_str();
  app.add_option("--tokenizer", opt.tokenizer, "tokenizer.json when the checkpoint carries none");
  app.add_flag("--any-tokenizer", opt.any_tokenizer, "accept a --tokenizer other than the training data's");
  app.add_flag("--force", opt.force, "replace OUT when it is not empty");
  if (int rc = wiola::cli::parse(app, argc, argv, "export"); rc >= 0) return rc;
  WIOLA_CHECK(format == "hf", "--format ", format, ": only hf (Hugging Face transformers) is supported");
  WIOLA_CHECK(dtype == "fp32" || dtype == "bf16", "--dtype ", dtype, ": fp32 or bf16");
  opt.dtype = dtype == "bf16" ? wiola::st::DType::BF16 : wiola::st::DType::F32;
  opt.max_shard_bytes = wiola::st::parse_size(shard);
  const auto s = wiola::infer::export_hf(checkpoint, out, opt);
  std::printf("wrote %s from %s (step %lld): %lld tensors, %lld parameters, %s, %d safetensors file%s, %.1f MB\n",
              out.c_str(), s.checkpoint.c_str(), (long long)s.step, (long long)s.tensors, (long long)s.parameters,
              dtype.c_str(), s.files, s.files == 1 ? "" : "s", double(s.bytes) / 1e6);
  std::printf("load it with: AutoModelForCausalLM.from_pretrained(\"%s\", trust_remote_code=True)\n", out.c_str());
  return 0;
}

int wiola_cmd_import(int argc, char** argv) {
  CLI::App app{"Turn a Hugging Face safetensors folder of a Wiola model into a wiola checkpoint", "wiola import"};
  std::string src, ckdir;
  wiola::infer::ImportOptions opt;
  app.add_option("SRC", src, "folder with config.json and model.safetensors (or the sharded index)")->required();
  app.add_option("--output", ckdir, "checkpoint directory to write (step-00000000 and latest)")->required();
  app.add_option("--seq-len", opt.seq_len, "context T (default: max_position_embeddings)");
  app.add_flag("--force", opt.force, "replace the checkpoints already in --output");
  if (int rc = wiola::cli::parse(app, argc, argv, "import"); rc >= 0) return rc;
  const auto s = wiola::infer::import_hf(src, ckdir, opt);
  std::printf("wrote %s from %s: %lld tensors, %lld parameters (%s), d=%d L=%d H=%d H_kv=%d V=%d T=%d, tokenizer %s\n",
              s.folder.c_str(), src.c_str(), (long long)s.tensors, (long long)s.parameters, s.source_dtype.c_str(),
              s.model.d, s.model.L, s.model.H, s.model.Hkv, s.model.V, s.model.T, s.tokenizer ? "included" : "none");
  std::printf("use it: wiola generate --checkpoint %s ..., or checkpoint.init_from = \"%s\"\n", ckdir.c_str(),
              ckdir.c_str());
  return 0;
}
