#include "infer/hf_export.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include <toml++/toml.h>

#include "ckpt/format.h"
#include "ckpt/manifest.h"
#include "ckpt/tools.h"
#include "config/run_config.h"
#include "data/sha256.h"
#include "data/text_input.h"
#include "data/tokenizer.h"
#include "infer/loaded_model.h"
#include "model/params.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace wiola::infer {

namespace {

// Shapes as stored: matrices [rows, cols], vectors 1-D.
std::vector<int64_t> st_shape(const ParamEntry& e) {
  return e.is_matrix() ? std::vector<int64_t>{e.grows, e.gcols} : std::vector<int64_t>{e.grows};
}

int32_t id_or(const Tokenizer& tok, const char* token, int32_t fallback) {
  const int32_t id = tok.token_to_id(token);
  return id >= 0 ? id : fallback;
}

json id_json(int32_t id) { return id >= 0 ? json(id) : json(nullptr); }

// The tokenizer text an export ships: the checkpoint's, or --tokenizer.
std::string export_tokenizer(const std::string& folder, const json& manifest, const ExportOptions& opt) {
  std::string text = checkpoint_tokenizer_text(folder, manifest);
  if (!opt.tokenizer.empty()) {
    text = read_file(opt.tokenizer);
    const std::string want = trained_tokenizer_sha(manifest), sha = sha256_hex(text);
    WIOLA_CHECK(opt.any_tokenizer || want.empty() || want == sha, opt.tokenizer,
                ": not the tokenizer this model was trained with (sha256 ", sha.substr(0, 12), "…, the training data's ",
                want.substr(0, 12), "…); pass --any-tokenizer to use it anyway");
  }
  WIOLA_CHECK(!text.empty(), "checkpoint ", folder, " carries no tokenizer; pass --tokenizer FILE");
  return text;
}

void write_tokenizer_files(const fs::path& dir, const std::string& text, const Tokenizer& tok, int T) {
  write_text_atomic((dir / "tokenizer.json").string(), text);
  ordered_json special = ordered_json::object();
  for (const auto& [key, token] : {std::pair{"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"unk_token", "<unk>"},
                                   {"pad_token", "<pad>"}})
    if (tok.token_to_id(token) >= 0) special[key] = token;
  if (!special.contains("eos_token") && tok.eos_id() >= 0) special["eos_token"] = tok.decode(std::vector<int32_t>{tok.eos_id()});
  ordered_json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", T},
                      {"add_bos_token", false}, {"add_eos_token", false}, {"clean_up_tokenization_spaces", false}};
  for (auto& [k, v] : special.items()) cfg[k] = v;
  write_text_atomic((dir / "tokenizer_config.json").string(), cfg.dump(2) + "\n");
  write_text_atomic((dir / "special_tokens_map.json").string(), special.dump(2) + "\n");
}

std::string model_card(const ModelConfig& cfg, const json& manifest, int64_t params, st::DType dtype) {
  std::ostringstream o;
  o << "---\nlibrary_name: transformers\ntags:\n- wiola\n---\n\n# Wiola (" << cfg.d << " wide, " << cfg.L
    << " layers, " << params << " parameters)\n\n"
    << "Exported by `wiola export --format hf` from checkpoint step " << manifest.value("step", int64_t(0))
    << " of wiola run `" << manifest.value("run_id", std::string()) << "` (" << manifest.value("tokens", int64_t(0))
    << " training tokens), " << st::dtype_name(dtype) << " weights.\n\n"
    << "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
    << "model = AutoModelForCausalLM.from_pretrained(\"PATH\", trust_remote_code=True)\n"
    << "tokenizer = AutoTokenizer.from_pretrained(\"PATH\")\n```\n\n"
    << "`modeling_wiola.py` implements the model (SRPE, GCLA with ATM in training, DSFF, WiolaRMSNorm, tied "
    << "embedding). Inputs must not be padded. Context: " << cfg.T << " tokens.\n";
  return o.str();
}

// Consecutive tensors (by name) into shards of at most `limit` bytes; a
// tensor larger than the limit gets a shard of its own.
std::vector<std::vector<const ParamEntry*>> plan_shards(std::vector<const ParamEntry*> all, size_t elem,
                                                        uint64_t limit) {
  std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->name < b->name; });
  std::vector<std::vector<const ParamEntry*>> out(1);
  uint64_t used = 0;
  for (const ParamEntry* e : all) {
    const uint64_t b = uint64_t(e->size()) * elem;
    if (!out.back().empty() && used + b > limit) {
      out.emplace_back();
      used = 0;
    }
    out.back().push_back(e);
    used += b;
  }
  return out;
}

// A folder written under a temporary name and renamed into place at the end.
fs::path begin_output(const std::string& out, bool force) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    WIOLA_CHECK(fs::is_directory(out, ec), out, ": exists and is not a folder");
    WIOLA_CHECK(force || fs::is_empty(out, ec), out, ": exists and is not empty (--force replaces it)");
  }
  const fs::path tmp = fs::path(out).lexically_normal().string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  WIOLA_CHECK(!ec, tmp.string(), ": cannot create: ", ec.message());
  return tmp;
}

void finish_output(const fs::path& tmp, const std::string& out) {
  std::error_code ec;
  fs::remove_all(out, ec);
  fs::rename(tmp, out, ec);
  WIOLA_CHECK(!ec, out, ": cannot move ", tmp.string(), " into place: ", ec.message());
}

}  // namespace

json hf_config_json(const ModelConfig& c, int32_t bos, int32_t eos, int32_t pad, st::DType dtype) {
  const char* dt = dtype == st::DType::BF16 ? "bfloat16" : "float32";
  ordered_json j = {{"architectures", {"WiolaForCausalLM"}},
                    {"auto_map", {{"AutoConfig", "modeling_wiola.WiolaConfig"},
                                  {"AutoModelForCausalLM", "modeling_wiola.WiolaForCausalLM"}}},
                    {"atm_enabled", c.atm},
                    {"atm_threshold", c.tau},
                    {"bos_token_id", id_json(bos)},
                    {"dsff_narrow_size", c.dA},
                    {"dsff_wide_size", c.dB},
                    {"dtype", dt},
                    {"eos_token_id", id_json(eos)},
                    {"gcla_gate_init", c.phi_init},
                    {"gcla_lookback", c.Lambda},
                    {"hidden_size", c.d},
                    {"initializer_range", c.init_std},
                    {"max_position_embeddings", c.T},
                    {"model_type", "wiola"},
                    {"num_attention_heads", c.H},
                    {"num_hidden_layers", c.L},
                    {"num_key_value_heads", c.Hkv},
                    {"pad_token_id", id_json(pad)},
                    {"rms_norm_eps", c.eps},
                    {"srpe_radial_amplitude", c.a_s},
                    {"srpe_radial_frequency", c.f_s},
                    {"srpe_spiral_divisor", c.k_s},
                    {"srpe_theta", c.theta0},
                    {"tie_word_embeddings", true},
                    {"torch_dtype", dt},
                    {"transformers_version", "4.46.3"},
                    {"use_cache", true},
                    {"vocab_size", c.V}};
  return json::parse(j.dump());  // (ordered on disk through the ordered_json dump below)
}

ExportStats export_hf(const std::string& checkpoint, const std::string& out, const ExportOptions& opt) {
  ExportStats stats;
  stats.checkpoint = ckpt::resolve_checkpoint(checkpoint);
  ckpt::Reader r(stats.checkpoint);
  std::string problems;
  for (const auto& p : r.verify()) problems += (problems.empty() ? "" : "; ") + p;
  WIOLA_CHECK(problems.empty(), "checkpoint ", stats.checkpoint, " is damaged: ", problems);
  const ModelConfig cfg = ckpt::model_config(r);
  const std::string tok_text = export_tokenizer(stats.checkpoint, r.manifest(), opt);
  const Tokenizer tok = Tokenizer::from_json_text(tok_text, stats.checkpoint + "/tokenizer.json");
  WIOLA_CHECK(tok.vocab_size() == uint32_t(cfg.V), "the tokenizer's vocabulary has ", tok.vocab_size(),
              " ids, the model's ", cfg.V, " (V): they do not belong together");
  const fs::path tmp = begin_output(out, opt.force);
  try {
    // Weights, tensor by tensor from the checkpoint.
    const ParamLayout layout(cfg, ModelShard{});
    std::vector<const ParamEntry*> all;
    for (const ParamEntry& e : layout.entries()) all.push_back(&e);
    const auto shards = plan_shards(all, st::dtype_size(opt.dtype), opt.max_shard_bytes);
    const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                     {"wiola_run_id", r.manifest().value("run_id", std::string())},
                                                     {"wiola_step", std::to_string(r.step())}};
    json weight_map = json::object();
    uint64_t total = 0;
    for (size_t k = 0; k < shards.size(); ++k) {
      const std::string name = shards.size() == 1 ? st::kSingleFile : st::shard_name(int(k) + 1, int(shards.size()));
      std::vector<st::TensorSpec> specs;
      for (const ParamEntry* e : shards[k]) {
        specs.push_back({e->name, st_shape(*e)});
        weight_map[e->name] = name;
        total += uint64_t(e->size()) * st::dtype_size(opt.dtype);
        stats.parameters += int64_t(e->size());
      }
      stats.bytes += st::write_file((tmp / name).string(), specs, opt.dtype, meta,
                                    [&](const st::TensorSpec& s, std::vector<float>& v) {
                                      const ParamEntry& e = layout.find(s.name);
                                      r.read("param", e, 0, e.size(), v.data());
                                    });
    }
    stats.files = int(shards.size());
    stats.tensors = int64_t(all.size());
    if (shards.size() > 1)
      write_text_atomic((tmp / st::kIndexFile).string(),
                        json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}).dump(2) + "\n");

    // The config, the generation defaults, the tokenizer, the code, a card.
    const int32_t bos = id_or(tok, "<bos>", -1), eos = tok.eos_id(), pad = id_or(tok, "<pad>", -1);
    ordered_json conf = ordered_json::parse(hf_config_json(cfg, bos, eos, pad, opt.dtype).dump());
    conf["wiola"] = {{"run_id", r.manifest().value("run_id", std::string())}, {"step", r.step()},
                     {"tokens", r.manifest().value("tokens", int64_t(0))}, {"tokenizer_sha256", tok.sha256()}};
    write_text_atomic((tmp / "config.json").string(), conf.dump(2) + "\n");
    ordered_json gen = {{"bos_token_id", id_json(bos)}, {"eos_token_id", id_json(eos)},
                        {"pad_token_id", id_json(pad)}, {"max_length", cfg.T}, {"transformers_version", "4.46.3"}};
    write_text_atomic((tmp / "generation_config.json").string(), gen.dump(2) + "\n");
    write_tokenizer_files(tmp, tok_text, tok, cfg.T);
    write_text_atomic((tmp / "modeling_wiola.py").string(), modeling_wiola_py());
    write_text_atomic((tmp / "README.md").string(), model_card(cfg, r.manifest(), stats.parameters, opt.dtype));
    stats.step = r.step();
    finish_output(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return stats;
}

// ---- import -----------------------------------------------------------------------------
namespace {

// Sizes must be given; the constants default to the published values.
ModelConfig model_from_hf_config_impl(const json& j, const std::string& where, int seq_len) {
  WIOLA_CHECK(j.is_object(), where, ": not a JSON object");
  if (j.contains("model_type"))
    WIOLA_CHECK(j["model_type"] == "wiola", where, ": model_type ", j["model_type"].dump(),
                " is not a Wiola model (\"wiola\")");
  const auto size = [&](const char* key) {
    WIOLA_CHECK(j.contains(key) && j[key].is_number_integer(), where, ": needs the integer ", key);
    return json_int<int>(j[key], where + ": " + key);
  };
  const auto real = [&](const char* key, double def) {
    if (!j.contains(key)) return def;
    WIOLA_CHECK(j[key].is_number(), where, ": ", key, " must be a number");
    return j[key].get<double>();
  };
  ModelConfig c;
  c.name = "hf-import";
  c.d = size("hidden_size");
  c.L = size("num_hidden_layers");
  c.H = size("num_attention_heads");
  c.Hkv = size("num_key_value_heads");
  c.dA = size("dsff_narrow_size");
  c.dB = size("dsff_wide_size");
  c.V = size("vocab_size");
  c.T = seq_len > 0 ? seq_len : size("max_position_embeddings");
  c.theta0 = real("srpe_theta", 10000.0);
  c.k_s = real("srpe_spiral_divisor", 8.0);
  c.a_s = real("srpe_radial_amplitude", 0.1);
  c.f_s = real("srpe_radial_frequency", 0.01);
  c.tau = real("atm_threshold", 0.92);
  c.atm = j.value("atm_enabled", true);
  c.Lambda = int(real("gcla_lookback", 2));
  c.phi_init = real("gcla_gate_init", -3.0);
  c.eps = real("rms_norm_eps", 1e-6);
  c.init_std = real("initializer_range", 0.02);
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return c;
}

// Every tensor of the model with its exact shape, nothing else (a tied
// lm_head.weight equal to the embedding is allowed): one error listing all.
void check_tensors(const st::Folder& f, const ParamLayout& layout, const std::string& src) {
  std::vector<std::string> problems;
  for (const ParamEntry& e : layout.entries()) {
    const st::TensorInfo* t = f.find(e.name);
    if (!t) {
      problems.push_back(e.name + ": missing");
      continue;
    }
    if (t->shape != st_shape(e)) {
      std::string have, want;
      for (int64_t s : t->shape) have += (have.empty() ? "" : ", ") + std::to_string(s);
      for (int64_t s : st_shape(e)) want += (want.empty() ? "" : ", ") + std::to_string(s);
      problems.push_back(e.name + ": shape [" + have + "] in the file, [" + want + "] for this config");
    }
  }
  for (const st::TensorInfo* t : f.tensors())
    if (!layout.try_find(t->name)) {
      if (t->name == "lm_head.weight" && layout.try_find("model.embed_tokens.weight") &&
          f.read(t->name) == f.read("model.embed_tokens.weight"))
        continue;  // tied: the same values
      problems.push_back(t->name + ": not a tensor of this model" +
                         (t->name == "lm_head.weight" ? " (differs from the embedding: Wiola's head is tied)" : ""));
    }
  if (problems.empty()) return;
  std::string list;
  const size_t show = std::min<size_t>(problems.size(), 8);
  for (size_t i = 0; i < show; ++i) list += "\n  " + problems[i];
  if (problems.size() > show) list += "\n  ... and " + std::to_string(problems.size() - show) + " more";
  fail(src, ": not this config's model (a checkpoint of another architecture or size?):", list);
}

// The preset whose numbers `c` has, or "" (the manifest names it; only the
// numbers decide whether a run may start from it).
std::string matching_preset(const ModelConfig& c) {
  for (const std::string& name : model_preset_names()) {
    ModelConfig p = model_preset(name);
    p.name = c.name;
    if (run_config_to_toml(RunConfig{"", "", p, {}, {}, {}, {}}) ==
        run_config_to_toml(RunConfig{"", "", c, {}, {}, {}, {}}))
      return name;
  }
  return "";
}

}  // namespace

ModelConfig model_from_hf_config(const json& j, const std::string& where, int seq_len) {
  return model_from_hf_config_impl(j, where, seq_len);
}

ImportStats import_hf(const std::string& src, const std::string& ckdir, const ImportOptions& opt) {
  ImportStats stats;
  const std::string conf_path = (fs::path(src) / "config.json").string();
  json conf;
  try {
    conf = json::parse(read_file(conf_path));
  } catch (const json::exception& e) {
    fail(conf_path, ": not JSON (", e.what(), ")");
  }
  const ModelConfig cfg = model_from_hf_config_impl(conf, conf_path, opt.seq_len);
  const st::Folder f(src);
  const ParamLayout layout(cfg, ModelShard{});
  check_tensors(f, layout, src);

  // The tokenizer, if the folder has one, must fit the model.
  std::string tok_text, tok_sha;
  const std::string tok_path = (fs::path(src) / "tokenizer.json").string();
  if (fs::exists(tok_path)) {
    tok_text = read_file(tok_path);
    const Tokenizer tok = Tokenizer::from_json_text(tok_text, tok_path);
    WIOLA_CHECK(tok.vocab_size() == uint32_t(cfg.V), tok_path, ": the tokenizer's vocabulary has ", tok.vocab_size(),
                " ids, the model's ", cfg.V, " (vocab_size): they do not belong together");
    tok_sha = tok.sha256();
  }

  // The run the checkpoint claims to come from: this model, defaults elsewhere.
  RunConfig rc;
  rc.model = cfg;
  rc.preset = matching_preset(cfg);
  DatasetInfo none{uint32_t(cfg.V), 0, tok_sha, 0, 0, 0};

  std::error_code ec;
  fs::create_directories(ckdir, ec);
  WIOLA_CHECK(!ec, ckdir, ": cannot create: ", ec.message());
  const auto there = ckpt::list_checkpoints(ckdir, true);
  WIOLA_CHECK(there.empty() || opt.force, ckdir, ": already holds checkpoints (", there.front(),
              "...); use an empty directory (--force replaces them)");
  for (const std::string& old : there) fs::remove_all(old, ec);
  const fs::path tmp = fs::path(ckdir) / (".tmp-" + ckpt::step_name(0));
  const fs::path final_dir = fs::path(ckdir) / ckpt::step_name(0);
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);

  std::random_device rd;
  char id[32];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), unsigned(std::time(nullptr)));
  ckpt::FileHeader h{id, 0, 0, 0, 0, 0};
  std::vector<ckpt::TensorPiece> pieces;
  for (const ParamEntry& e : layout.entries()) {
    ckpt::TensorPiece p{"param", e.name, e.grows, e.gcols, {ckpt::Slice{0, 0, e.grows, e.gcols, 0, 0}}, f.read(e.name)};
    pieces.push_back(std::move(p));
    stats.parameters += int64_t(e.size());
  }
  const ckpt::FileRecord rec = ckpt::write_rank_file((tmp / ckpt::rank_file(0)).string(), h, std::move(pieces));
  pieces.clear();

  std::string dtypes;
  for (const st::TensorInfo* t : f.tensors())
    if (dtypes.find(st::dtype_name(t->dtype)) == std::string::npos)
      dtypes += (dtypes.empty() ? "" : ",") + std::string(st::dtype_name(t->dtype));
  json tensors = json::object();
  for (const ParamEntry& e : layout.entries()) tensors[e.name] = {{"shape", {e.grows, e.gcols}}};
  json mf = {{"format", ckpt::kFormat}, {"run_id", id}, {"step", 0}, {"tokens", 0}, {"skipped", 0},
             {"applied_steps", 0}, {"kinds", {"param"}}, {"loader", loader_state_to_json(LoaderState{})},
             {"config", run_config_to_toml(rc)},
             {"layout", {{"tp", 1}, {"pp", 1}, {"dp", 1}, {"zero", false}, {"stages", {{0, cfg.L}}}}},
             {"backend", "import"},
             {"imported_from", {{"path", fs::absolute(src).lexically_normal().string()}, {"dtype", dtypes}}},
             {"identity", run_identity(rc, none)},
             {"files", {{{"name", rec.name}, {"rank", 0}, {"grid_coord", {0, 0, 0}}, {"bytes", rec.bytes},
                         {"xxh3", rec.xxh3}, {"slices", rec.slices}}}},
             {"tensors", tensors}};
  if (!tok_text.empty()) {
    write_text_atomic((tmp / ckpt::kTokenizerFile).string(), tok_text);
    mf["tokenizer"] = {{"file", ckpt::kTokenizerFile}, {"sha256", tok_sha}};
  }
  write_text_atomic((tmp / "manifest.json").string(), mf.dump(1) + "\n");
  ckpt::fsync_path(tmp.string());
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  WIOLA_CHECK(!ec, final_dir.string(), ": cannot move the checkpoint into place: ", ec.message());
  write_text_atomic((fs::path(ckdir) / "latest").string(), ckpt::step_name(0) + "\n");
  ckpt::fsync_path(ckdir);

  stats.folder = final_dir.string();
  stats.model = cfg;
  stats.tensors = int64_t(layout.entries().size());
  stats.source_dtype = dtypes;
  stats.tokenizer = !tok_text.empty();
  return stats;
}

}  // namespace wiola::infer
