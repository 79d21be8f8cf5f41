#include "train/checkpointer.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <random>
#include <filesystem>
#include <sstream>

#include "dist/agree.h"
#include "train/gemm_record.h"
#include "train/spike_detector.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/trace.h"

namespace fs = std::filesystem;

namespace wiola {
namespace {

using Clock = std::chrono::steady_clock;
using dist::DType;

constexpr const char* kEmbed = "model.embed_tokens.weight";

using ckpt::rank_file;
using ckpt::step_name;

// One "key: checkpoint A, this run B" per differing key of two flat objects.
void diff_into(const nlohmann::json& saved, const nlohmann::json& mine, const std::string& name,
               std::vector<std::string>& out) {
  if (saved.is_object() && mine.is_object()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : saved.items()) keys.push_back(k);
    for (const auto& [k, v] : mine.items())
      if (!saved.contains(k)) keys.push_back(k);
    for (const std::string& k : keys)
      diff_into(saved.contains(k) ? saved.at(k) : nlohmann::json("(absent)"),
                mine.contains(k) ? mine.at(k) : nlohmann::json("(absent)"), name.empty() ? k : name + "." + k, out);
  } else if (saved.is_array() && mine.is_array() && saved.size() == mine.size()) {
    for (size_t i = 0; i < saved.size(); ++i) diff_into(saved[i], mine[i], name + "[" + std::to_string(i) + "]", out);
  } else if (saved != mine) {
    out.push_back(name + " = " + saved.dump() + " in the checkpoint, " + mine.dump() + " in this run");
  }
}

// A content hash is compared only where both sides know it: a checkpoint
// from before wiola prep wrote them resumes on re-prepped data, and data
// prepped before then resumes a newer checkpoint (their counts still must
// agree).
void drop_unless_both(nlohmann::json& saved, nlohmann::json& mine, const std::string& key) {
  if (!saved.is_object() || !mine.is_object() || (saved.contains(key) && mine.contains(key))) return;
  saved.erase(key);
  mine.erase(key);
}

}  // namespace

Checkpointer::Checkpointer(const RunConfig& rc, dist::Grid& grid, Ops<float>& ops, Model<float>& model,
                           dist::DistAdamW& adam, nlohmann::json identity, nlohmann::json info)
    : rc_(rc),
      grid_(grid),
      ops_(ops),
      model_(model),
      adam_(adam),
      identity_(std::move(identity)),
      info_(std::move(info)),
      dir_(rc.checkpoint.dir) {
  // A run id that tells this run's shards from any other's: rank 0's, shared.
  std::string id;
  if (grid_.world_rank() == 0) {
    std::random_device rd;
    char b[32];
    std::snprintf(b, sizeof b, "%08x%08x", rd(), unsigned(std::time(nullptr)));
    id = b;
  }
  run_id_ = agree_string(id);
}

void Checkpointer::set_tokenizer(std::string json_text, std::string sha256) {
  tokenizer_json_ = std::move(json_text);
  tokenizer_sha_ = std::move(sha256);
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();  // an error ends the job elsewhere
}

void Checkpointer::prepare_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  WIOLA_CHECK(!ec, "checkpoint.dir '", dir, "': cannot create: ", ec.message());
  try {
    write_text_atomic((fs::path(dir) / ".write-test").string(), "wiola\n");
  } catch (const Error& e) {
    fail("checkpoint.dir '", dir, "' is not writable (", e.what(), ")");
  }
  fs::remove(fs::path(dir) / ".write-test", ec);
  for (const auto& ent : fs::directory_iterator(dir, ec)) {
    const std::string n = ent.path().filename().string();
    if (n.rfind(".tmp-step-", 0) == 0 || n.rfind(".old-step-", 0) == 0) fs::remove_all(ent.path(), ec);
  }
}

// ---- agreement helpers (control plane) ----------------------------------------------
std::string Checkpointer::agree_string(const std::string& mine) {
  dist::Comm& w = grid_.world();
  if (w.size() == 1) return mine;
  int64_t n = int64_t(mine.size());
  w.broadcast(&n, 1, 0);
  std::string s = w.rank() == 0 ? mine : std::string(size_t(n), '\0');
  if (n > 0) w.broadcast(s.data(), size_t(n), DType::U8, 0);
  return s;
}

namespace {
// Every rank's string on rank 0 (empty vector elsewhere).
std::vector<std::string> gather_strings(dist::Comm& w, const std::string& mine) {
  const int tag = 7101;
  if (w.rank() != 0) {
    const int64_t n = int64_t(mine.size());
    w.isend(&n, 1, DType::I64, 0, tag).wait();
    if (n > 0) w.isend(mine.data(), size_t(n), DType::U8, 0, tag + 1).wait();
    return {};
  }
  std::vector<std::string> all{mine};
  for (int r = 1; r < w.size(); ++r) {
    int64_t n = 0;
    w.irecv(&n, 1, DType::I64, r, tag).wait();
    std::string s(size_t(n), '\0');
    if (n > 0) w.irecv(s.data(), size_t(n), DType::U8, r, tag + 1).wait();
    all.push_back(std::move(s));
  }
  return all;
}
}  // namespace

// ---- resume -----------------------------------------------------------------------
void Checkpointer::verify_everywhere(ckpt::Reader& r, std::vector<std::string>& problems) {
  dist::Comm& w = grid_.world();
  std::vector<std::string> mine = r.verify(w.size(), w.rank());
  std::string joined;
  for (const auto& p : mine) joined += (joined.empty() ? "" : "; ") + p;
  for (const auto& s : gather_strings(w, joined))
    if (!s.empty()) problems.push_back(s);
}

std::string Checkpointer::find_resume() {
  dist::Comm& w = grid_.world();
  const bool root = w.rank() == 0;
  // Step folders without a manifest are candidates too: a save never leaves
  // one (the manifest is written before the rename), so it is damage, and
  // it must be reported, not silently skipped.
  const std::vector<std::string> candidates = root ? ckpt::list_checkpoints(dir_, true) : std::vector<std::string>{};
  std::vector<std::string> damaged;
  for (size_t i = 0;; ++i) {
    const std::string cand = agree_string(root && i < candidates.size() ? candidates[i] : "");
    if (cand.empty()) break;
    std::vector<std::string> problems;
    bool opened = true;
    std::string open_error;
    std::unique_ptr<ckpt::Reader> r;
    try {
      r = std::make_unique<ckpt::Reader>(cand);
    } catch (const Error& e) {
      opened = false;
      open_error = e.what();
    }
    // Every rank reads the same manifest; they agree on whether it opened.
    const int bad_open = w.size() > 1 ? w.all_reduce_value(opened ? 0 : 1, dist::ReduceOp::Max) : (opened ? 0 : 1);
    if (bad_open) {
      problems.push_back(open_error.empty() ? "manifest unreadable on some rank" : open_error);
    } else {
      verify_everywhere(*r, problems);
      int64_t n = int64_t(problems.size());
      if (w.size() > 1) w.broadcast(&n, 1, 0);
      if (n == 0) return cand;
    }
    if (root) {
      std::string all;
      for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
      std::fprintf(stderr, "wiola train: warning: checkpoint %s is damaged (%s); trying an older one\n", cand.c_str(),
                   all.c_str());
      damaged.push_back(cand);
    }
  }
  const int64_t n_damaged =
      w.size() > 1 ? w.all_reduce_value(int64_t(damaged.size()), dist::ReduceOp::Max) : int64_t(damaged.size());
  if (n_damaged > 0) {
    if (root)
      fail("checkpoint.dir '", dir_,
           "' holds checkpoints but none is sound (see the warnings above); "
           "nothing was deleted. Move the damaged ones away, or set checkpoint.resume = false to start over "
           "in another checkpoint.dir");
    throw dist::SetupFailed();
  }
  return "";
}

void Checkpointer::check_identity(const ckpt::Reader& r, bool weights_only) const {
  // The preset is a name for the numbers beside it: only the numbers must agree
  // (an imported model matches a run that writes its sizes out).
  nlohmann::json saved = r.manifest().at("identity"), mine = identity_;
  saved["model"].erase("preset");
  mine["model"].erase("preset");
  // Checkpoints from before data.documents existed trained without it.
  if (!saved.contains("data.documents")) saved["data.documents"] = false;
  drop_unless_both(saved, mine, "data.train_xxh3");
  if (saved.contains("data.blend") && mine.contains("data.blend") && saved["data.blend"].is_array() &&
      mine["data.blend"].is_array() && saved["data.blend"].size() == mine["data.blend"].size())
    for (size_t k = 0; k < saved["data.blend"].size(); ++k)
      drop_unless_both(saved["data.blend"][k], mine["data.blend"][k], "train_xxh3");
  std::vector<std::string> diffs;
  if (weights_only) diff_into(saved.at("model"), mine.at("model"), "model", diffs);
  else diff_into(saved, mine, "", diffs);
  if (diffs.empty()) return;
  // Every rank meets the same difference; rank 0 reports it.
  if (grid_.world_rank() != 0) throw dist::SetupFailed();
  std::string list;
  for (const auto& d : diffs) list += (list.empty() ? "" : "; ") + d;
  if (weights_only) fail("checkpoint '", r.folder(), "' is of another model: ", list);
  fail("cannot resume from '", r.folder(), "': ", list,
       ". These may not change on a resume "
       "(docs/checkpoints.md); start a new checkpoint.dir, or use checkpoint.init_from for a weights-only start");
}

void Checkpointer::read_params(ckpt::Reader& r) {
  const ParamLayout& lay = model_.layout();
  std::vector<float> host(lay.total());  // padding: zero
  for (const ParamEntry& e : lay.entries()) r.read("param", e, 0, e.size(), host.data() + e.offset);
  ops_.upload(model_.params(), host.data(), host.size() * sizeof(float));
  model_.refresh_weights();
}

ResumeState Checkpointer::resume(const std::string& folder) {
  ckpt::Reader r(folder);
  if (!ckpt::holds_optimizer(r.manifest())) {
    if (grid_.world_rank() != 0) throw dist::SetupFailed();
    fail("cannot resume from '", folder,
         "': it holds weights only (an imported model); start a run from it with "
         "checkpoint.init_from in another checkpoint.dir");
  }
  check_identity(r, false);
  read_params(r);
  // The moments of the ranges this rank's optimizer holds in the new layout.
  const ParamLayout& lay = model_.layout();
  size_t owned_total = 0;
  for (const auto& rg : adam_.owned_ranges()) owned_total += rg.size;
  // Tensors are read by name, so any layout's checkpoint (the packed one of
  // before tensors were aligned included) fills them; the padding in the
  // owned ranges stays zero.
  std::vector<float> m(owned_total), v(owned_total);
  size_t pos = 0;
  for (const auto& rg : adam_.owned_ranges()) {
    for (const ParamEntry& e : lay.entries()) {
      const size_t lo = std::max(rg.offset, e.offset), hi = std::min(rg.offset + rg.size, e.offset + e.size());
      if (lo >= hi) continue;
      const size_t at = pos + (lo - rg.offset);
      r.read("exp_avg", e, lo - e.offset, hi - e.offset, m.data() + at);
      r.read("exp_avg_sq", e, lo - e.offset, hi - e.offset, v.data() + at);
    }
    pos += rg.size;
  }
  const nlohmann::json& mf = r.manifest();
  const std::string where = r.folder() + "/manifest.json: ";
  ResumeState st;
  try {
    st.step = json_int<int64_t>(mf.at("step"), where + "step");
    st.tokens = json_int<int64_t>(mf.at("tokens"), where + "tokens");
    st.skipped = json_int<int64_t>(mf.at("skipped"), where + "skipped");
    st.applied_steps = json_int<long>(mf.at("applied_steps"), where + "applied_steps");
    st.loader = loader_state_from_json(mf.at("loader"), where + "loader");
    st.run_id = mf.at("run_id").get<std::string>();
    if (mf.contains("gemm")) st.gemm = mf.at("gemm");
    if (mf.contains("simd")) st.simd = mf.at("simd");
    if (mf.contains("blas")) st.blas = mf.at("blas");
    if (mf.contains("schedule")) st.schedule = mf.at("schedule");
    if (mf.contains("data_stages")) st.data_stages = mf.at("data_stages");
    if (mf.contains("spike")) {
      const nlohmann::json& sp = mf.at("spike");
      st.spike = true;
      for (const auto& w : sp.at("skip_batches"))
        st.skip_batches.push_back({w.at(0).get<int64_t>(), w.at(1).get<int64_t>()});
      st.rewinds = json_int<int64_t>(sp.at("rewinds"), where + "spike.rewinds");
      SpikeState detector = spike_state_from_json(sp, where);
      st.consecutive_skipped = detector.consecutive_skipped;
      st.recent_losses = std::move(detector.recent_losses);
    }
  } catch (const nlohmann::json::exception& e) {
    fail(where, "missing or mistyped resume field (", e.what(), ")");
  }
  adam_.upload_owned(m, v, st.applied_steps);
  run_id_ = st.run_id;
  saved_step_ = st.step;
  return st;
}

void Checkpointer::load_weights(const std::string& checkpoint) {
  ckpt::Reader r(ckpt::resolve_checkpoint(checkpoint));
  std::vector<std::string> problems;
  verify_everywhere(r, problems);  // problems on rank 0 only
  int64_t n = int64_t(problems.size());
  if (grid_.world().size() > 1) grid_.world().broadcast(&n, 1, 0);
  if (n > 0) {
    if (grid_.world_rank() != 0) throw dist::SetupFailed();
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    fail("checkpoint.init_from: checkpoint '", r.folder(), "' is damaged (", all, ")");
  }
  check_identity(r, true);
  read_params(r);
  adam_.reload_master();
}

// ---- save -------------------------------------------------------------------------
// Without ZeRO the dp-0 replica writes everything; with ZeRO each DP rank
// writes the slice of master weights and moments it owns.
std::vector<dist::DistAdamW::Range> Checkpointer::owned() const {
  const bool zero = rc_.parallel.zero && rc_.parallel.dp > 1;
  if (zero) return adam_.owned_ranges();
  if (grid_.coord().dp == 0) return {{0, model_.n_params()}};
  return {};
}

// TP-replicated tensors are written by tp rank 0 only; they must be equal on
// every TP rank (they are by construction: the same update of the same
// all-reduced gradient). A mismatch would silently drop a rank's values, so
// it is an error naming the tensor.
void Checkpointer::check_tp_replicas(const std::vector<float>& params) {
  if (grid_.config().tp == 1) return;
  std::vector<const ParamEntry*> reps;
  std::vector<int64_t> mine;
  for (const ParamEntry& e : model_.layout().entries())
    if (e.tp_replicated) {
      reps.push_back(&e);
      mine.push_back(int64_t(XXH3_64bits(params.data() + e.offset, e.size() * sizeof(float)) >> 1));
    }
  dist::Comm& tp = grid_.tp();
  std::vector<int64_t> all(mine.size() * size_t(tp.size()));
  tp.all_gather(mine.data(), all.data(), mine.size(), DType::I64);
  for (int r = 0; r < tp.size(); ++r)
    for (size_t i = 0; i < mine.size(); ++i)
      WIOLA_CHECK(all[size_t(r) * mine.size() + i] == mine[i], "checkpoint at step ", saving_.step, ": ", reps[i]->name,
                  " differs between TP ranks ", tp.rank(), " and ", r, " of stage ", grid_.coord().pp,
                  " (TP-replicated tensors must be identical)");
}

std::vector<ckpt::TensorPiece> Checkpointer::snapshot() {
  const ParamLayout& lay = model_.layout();
  std::vector<float> params(lay.total()), m, v;
  ops_.download(params.data(), model_.params(), params.size() * sizeof(float));
  check_tp_replicas(params);
  const auto ranges = owned();
  if (ranges.empty()) return {};
  adam_.download_owned(m, v);  // the same ranges, concatenated
  const bool tp0 = grid_.coord().tp == 0, first = grid_.first_stage();
  std::vector<ckpt::TensorPiece> pieces;
  for (const ParamEntry& e : lay.entries()) {
    if ((e.tp_replicated && !tp0) || (e.name == kEmbed && !first)) continue;  // a lower rank writes it
    ckpt::TensorPiece kinds[3];
    for (int k = 0; k < 3; ++k) kinds[k] = {ckpt::kKinds[k], e.name, e.grows, e.gcols, {}, {}};
    size_t pos = 0;
    for (const auto& rg : ranges) {
      const size_t lo = std::max(rg.offset, e.offset), hi = std::min(rg.offset + rg.size, e.offset + e.size());
      if (lo < hi) {
        const int64_t a = int64_t(lo - e.offset);
        const float* src[3] = {params.data() + lo, m.data() + pos + (lo - rg.offset),
                               v.data() + pos + (lo - rg.offset)};
        for (const ckpt::Slice& s : ckpt::slices_of(e, size_t(a), hi - e.offset))
          for (int k = 0; k < 3; ++k) {
            auto& d = kinds[k].data;
            const size_t at = d.size();
            d.resize(at + size_t(s.size()));
            ckpt::gather_slice(e, s, src[k], a, d.data() + at);
            kinds[k].slices.push_back(s);
          }
      }
      pos += rg.size;
    }
    for (auto& p : kinds)
      if (!p.slices.empty()) pieces.push_back(std::move(p));
  }
  return pieces;
}

void Checkpointer::save(const ResumeState& state) {
  WIOLA_CHECK(!in_flight(), "internal: a checkpoint save is already in flight");
  save_t0_ = Clock::now();
  saving_ = state;
  std::vector<ckpt::TensorPiece> pieces = snapshot();
  has_file_ = !pieces.empty();
  pending_ = true;
  write_error_.clear();
  if (!has_file_) return;
  const fs::path tmpdir = fs::path(dir_) / (".tmp-" + step_name(state.step));
  const ckpt::FileHeader h{run_id_,          state.step,       grid_.world_rank(),
                           grid_.coord().tp, grid_.coord().pp, grid_.coord().dp};
  done_ = false;
  writer_ = std::thread([this, tmpdir, h, pieces = std::move(pieces)]() mutable {
    trace::name_thread("checkpoint writer");
    const trace::Span span("checkpoint", "checkpoint write, step " + std::to_string(h.step));
    try {
      ckpt::fail_if_injected("mkdir", h.step, h.rank, tmpdir.string());
      std::error_code ec;
      fs::create_directories(tmpdir, ec);
      WIOLA_CHECK(!ec, tmpdir.string(), ": cannot create: ", ec.message());
      record_ = ckpt::write_rank_file((tmpdir / rank_file(h.rank)).string(), h, std::move(pieces));
    } catch (const std::exception& e) {
      write_error_ = e.what();
    }
    done_ = true;
  });
  if (!rc_.checkpoint.async) writer_.join();
}

bool Checkpointer::written() {
  if (writer_.joinable()) {
    if (!done_) return false;
    writer_.join();
  }
  return true;
}

bool Checkpointer::finish(bool final) {
  if (!pending_) return true;
  if (writer_.joinable()) writer_.join();
  return commit(final);
}

bool Checkpointer::commit(bool final) {
  WIOLA_CHECK(pending_ && written(), "internal: no written checkpoint to commit");
  dist::Comm& w = grid_.world();
  // This rank's outcome: its file's record, its error, or null (no file).
  nlohmann::json mine = nullptr;
  if (!write_error_.empty()) {
    mine = {{"error", write_error_}};
  } else if (has_file_) {
    const auto& r = record_;
    mine = {{"name", r.name},   {"rank", r.header.rank}, {"grid_coord", {r.header.tp, r.header.pp, r.header.dp}},
            {"bytes", r.bytes}, {"xxh3", r.xxh3},        {"slices", r.slices}};
  }
  const auto reports = gather_strings(w, mine.dump());
  const nlohmann::json verdict =
      nlohmann::json::parse(agree_string(w.rank() == 0 ? judge_on_root(reports, final).dump() : ""));
  pending_ = false;
  has_file_ = false;
  last_save_s_ = std::chrono::duration<double>(Clock::now() - save_t0_).count();
  const std::string error = verdict.at("error").get<std::string>();
  if (error.empty()) return true;
  if (verdict.at("fatal").get<bool>()) {
    if (w.rank() == 0) fail(error);
    throw dist::SetupFailed();  // reported by rank 0
  }
  if (w.rank() == 0) {
    std::fprintf(stderr, "wiola train: warning: %s\n", error.c_str());
    std::fflush(stderr);
  }
  return false;
}

nlohmann::json Checkpointer::judge_on_root(const std::vector<std::string>& reports, bool final) {
  const bool several = reports.size() > 1;
  nlohmann::json files = nlohmann::json::array();
  std::string cause;
  for (size_t r = 0; r < reports.size(); ++r) {
    nlohmann::json rec = nlohmann::json::parse(reports[r]);
    if (rec.is_object() && rec.contains("error")) {
      if (cause.empty()) cause = (several ? "rank " + std::to_string(r) + ": " : "") + rec["error"].get<std::string>();
    } else if (!rec.is_null()) {
      files.push_back(std::move(rec));
    }
  }
  if (cause.empty()) {
    try {
      publish(files);
    } catch (const std::exception& e) {
      cause = e.what();
    }
  }
  if (cause.empty()) {
    saved_step_ = saving_.step;
    failing_step_ = 0;
    return {{"error", ""}, {"fatal", false}};
  }
  std::error_code ec;
  fs::remove_all(fs::path(dir_) / (".tmp-" + step_name(saving_.step)), ec);
  if (failing_step_ == 0) {
    failing_step_ = saving_.step;
    failing_since_ = Clock::now();
  }
  const double minutes = std::chrono::duration<double>(Clock::now() - failing_since_).count() / 60.0;
  const bool fatal = final || minutes >= rc_.checkpoint.max_failed_minutes;
  return {{"error", failure_message(cause, final, fatal, minutes)}, {"fatal", fatal}};
}

// One line: the step, the cause (it names the path), what the directory
// still holds, and what happens next.
std::string Checkpointer::failure_message(const std::string& cause, bool final, bool fatal, double minutes) const {
  const double limit = rc_.checkpoint.max_failed_minutes;
  const std::string kept = saved_step_ > 0
                               ? "the newest checkpoint in " + dir_ + " is still step " + std::to_string(saved_step_)
                               : dir_ + " holds no checkpoint of this run";
  std::ostringstream m;
  m << "checkpoint step " << saving_.step << " not saved (" << cause << "); " << kept;
  if (final) m << "; this was the run's final checkpoint, so the run ends with an error";
  else if (fatal)
    m << "; checkpoints have failed since step " << failing_step_ << " (" << minutes
      << " min, checkpoint.max_failed_minutes = " << limit << "): the run stops";
  else
    m << "; training goes on and saves again at the next checkpoint (the run stops when checkpoints fail for " << limit
      << " min: checkpoint.max_failed_minutes)";
  return m.str();
}

nlohmann::json Checkpointer::manifest(nlohmann::json files) const {
  nlohmann::json mf = info_;
  mf["format"] = ckpt::kFormat;
  mf["run_id"] = run_id_;
  mf["step"] = saving_.step;
  mf["tokens"] = saving_.tokens;
  mf["skipped"] = saving_.skipped;
  mf["applied_steps"] = saving_.applied_steps;
  mf["loader"] = loader_state_to_json(saving_.loader);
  mf["gemm"] = gemm_record(ops_, rc_.train.backend_options);  // what the saved state was computed with
  if (saving_.spike) {
    nlohmann::json w = nlohmann::json::array();
    for (const StepWindow& x : saving_.skip_batches) w.push_back({x.from, x.to});
    mf["spike"] = {{"skip_batches", w}, {"rewinds", saving_.rewinds}};
    spike_state_to_json({saving_.recent_losses, saving_.consecutive_skipped}, mf["spike"]);
  }
  mf["identity"] = identity_;
  mf["files"] = std::move(files);
  nlohmann::json tensors = nlohmann::json::object();
  const ParamLayout full(rc_.model, ModelShard{});
  for (const ParamEntry& e : full.entries()) tensors[e.name] = {{"shape", {e.grows, e.gcols}}};
  mf["tensors"] = std::move(tensors);
  if (!tokenizer_json_.empty()) mf["tokenizer"] = {{"file", ckpt::kTokenizerFile}, {"sha256", tokenizer_sha_}};
  return mf;
}

namespace {
// `text` into `path` (temporary name, fsync, rename), unless a test fails
// `stage` on purpose.
void write_durably(const fs::path& path, const std::string& text, const char* stage, int64_t step) {
  ckpt::fail_if_injected(stage, step, 0, path.string());
  write_text_atomic(path.string(), text);
  ckpt::fsync_path(path.string());
}
}  // namespace

// Rank 0, every rank's file written: the tokenizer and the manifest into the
// temporary folder, the folder renamed to step-N, `latest` moved, old
// checkpoints pruned. Throws at the first stage that fails, after undoing
// the rename (a damaged step-N it replaced is put back), so the complete
// checkpoints and `latest` are as they were; the caller removes the
// temporary folder.
void Checkpointer::publish(const nlohmann::json& files) {
  const int64_t step = saving_.step;
  const fs::path tmpdir = fs::path(dir_) / (".tmp-" + step_name(step));
  const fs::path final_dir = fs::path(dir_) / step_name(step);
  std::error_code ec;
  fs::create_directories(tmpdir, ec);
  if (!tokenizer_json_.empty()) write_durably(tmpdir / ckpt::kTokenizerFile, tokenizer_json_, "tokenizer", step);
  write_durably(tmpdir / "manifest.json", manifest(files).dump(1) + "\n", "manifest", step);
  ckpt::fsync_path(tmpdir.string());
  // A damaged checkpoint of the same step (resume fell back past it) is
  // replaced only once the new one is complete.
  const fs::path old = fs::path(dir_) / (".old-" + step_name(step));
  const bool replacing = fs::exists(final_dir);
  if (replacing) fs::rename(final_dir, old);
  try {
    ckpt::fail_if_injected("commit", step, 0, final_dir.string());
    fs::rename(tmpdir, final_dir);
    ckpt::fsync_path(dir_);
    try {
      write_durably(fs::path(dir_) / "latest", step_name(step) + "\n", "latest", step);
    } catch (...) {
      fs::rename(final_dir, tmpdir, ec);
      throw;
    }
  } catch (...) {
    if (replacing) fs::rename(old, final_dir, ec);
    throw;
  }
  fs::remove_all(old, ec);
  ckpt::fsync_path(dir_);
  prune();
}

// Keeps the `keep` newest checkpoints up to the one just committed (a later
// step can only be a damaged checkpoint resume fell back past: it is neither
// counted nor deleted here) plus the multiples of keep_every.
void Checkpointer::prune() const {
  const int keep = rc_.checkpoint.keep, every = rc_.checkpoint.keep_every;
  int kept = 0;
  for (const std::string& path : ckpt::list_checkpoints(dir_)) {  // newest first
    const int64_t step = std::stoll(fs::path(path).filename().string().substr(5));
    if (step > saving_.step) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    if (every > 0 && step % every == 0) continue;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
}

}  // namespace wiola
