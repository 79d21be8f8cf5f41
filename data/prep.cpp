#include "data/prep.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <deque>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace wiola {
namespace {

std::atomic<int> g_interrupted{0};
extern "C" void prep_on_signal(int sig) { g_interrupted = sig; }

// Installs SIGINT/SIGTERM handlers for its lifetime.
struct SignalGuard {
  struct sigaction old_int {}, old_term {};
  SignalGuard() {
    g_interrupted = 0;
    struct sigaction sa {};
    sa.sa_handler = prep_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
};

std::string human(double v) {
  char b[32];
  if (v >= 1e9) std::snprintf(b, sizeof b, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

std::string with_commas(uint64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

class Progress {
 public:
  Progress(bool on, uint64_t total) : on_(on), tty_(isatty(2)), total_(total), t0_(clock::now()) {}
  void update(uint64_t bytes, uint64_t tokens, bool final = false) {
    if (!on_) return;
    double el = seconds();
    if (!final && el - last_ < (tty_ ? 0.2 : 5.0)) return;
    last_ = el;
    double frac = total_ ? std::min(1.0, double(bytes) / double(total_)) : 1.0;
    int w = 24, fill = int(frac * w);
    std::string bar = std::string(fill, '#') + std::string(w - fill, '-');
    double tps = el > 0 ? tokens / el : 0, eta = frac > 0 ? el * (1 - frac) / frac : 0;
    std::fprintf(stderr, "%sprep [%s] %5.1f%% %s/%sB  %s tokens  %s tok/s  ETA %.0fs%s", tty_ ? "\r" : "",
                 bar.c_str(), 100 * frac, human(double(bytes)).c_str(), human(double(total_)).c_str(),
                 human(double(tokens)).c_str(), human(tps).c_str(), final ? 0.0 : eta, tty_ && !final ? "" : "\n");
    std::fflush(stderr);
  }
  double seconds() const { return std::chrono::duration<double>(clock::now() - t0_).count(); }

 private:
  using clock = std::chrono::steady_clock;
  bool on_, tty_;
  uint64_t total_;
  clock::time_point t0_;
  double last_ = -1e9;
};

// Accumulates one split's token stream and cuts it into shards.
class SplitWriter {
 public:
  SplitWriter(std::string name, const fs::path& tmp_dir, const ShardMeta& proto, const PrepOptions& opt)
      : name_(std::move(name)), tmp_dir_(tmp_dir), proto_(proto), opt_(opt) {}

  void add_document(const std::vector<int32_t>& ids) {
    buf_.insert(buf_.end(), ids.begin(), ids.end());
    buf_.push_back(int32_t(proto_.eos_id));
    doc_ends_.push_back(buf_.size());
    split_.num_tokens += ids.size() + 1;
    split_.num_documents += 1;
    while (buf_.size() >= opt_.shard_tokens) flush(opt_.shard_tokens);
  }
  void finish() {
    if (!buf_.empty()) flush(buf_.size());
    split_.xxh3 = stream_.hex();
  }
  const ManifestSplit& split() const { return split_; }

 private:
  void flush(uint64_t n) {
    uint64_t docs = 0;
    while (!doc_ends_.empty() && doc_ends_.front() <= n) {
      doc_ends_.pop_front();
      ++docs;
    }
    for (uint64_t& e : doc_ends_) e -= n;
    char file[64];
    std::snprintf(file, sizeof file, "%s-%05zu.h5", name_.c_str(), split_.shards.size());
    ShardMeta meta = proto_;
    meta.num_tokens = n;
    meta.num_documents = docs;
    write_shard((tmp_dir_ / file).string(), buf_.data(), n, meta, opt_.shard);
    // The content hashes (data/manifest.h): the shard's and the split's stream.
    TokenHash shard;
    shard.add(buf_.data(), n);
    stream_.add(buf_.data(), n);
    split_.shards.push_back(ManifestShard{file, (tmp_dir_ / file).string(), n, docs, shard.hex()});
    buf_.erase(buf_.begin(), buf_.begin() + std::ptrdiff_t(n));
  }

  std::string name_;
  fs::path tmp_dir_;
  ShardMeta proto_;
  const PrepOptions& opt_;
  std::vector<int32_t> buf_;
  std::deque<uint64_t> doc_ends_;
  ManifestSplit split_;
  TokenHash stream_;  // the split's content hash
};

}  // namespace

PrepResult run_prep(const PrepOptions& opt) {
  WIOLA_CHECK(!opt.inputs.empty(), "prep: no input files");
  WIOLA_CHECK(!opt.output_dir.empty(), "prep: no output folder");
  WIOLA_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "prep: --val-fraction must be in [0, 1), got ",
              opt.val_fraction);
  WIOLA_CHECK(opt.shard_tokens > 0, "prep: --shard-tokens must be positive");
  std::vector<std::string> files = expand_inputs(opt.inputs);
  uint64_t total_bytes = 0;
  for (const std::string& f : files) {
    std::error_code ec;
    auto sz = fs::file_size(f, ec);
    if (ec) fail(f, ": cannot read: ", ec.message());
    total_bytes += sz;
  }
  Tokenizer tok = Tokenizer::load(opt.tokenizer_path);
  WIOLA_CHECK(tok.eos_id() >= 0, opt.tokenizer_path,
              ": the tokenizer has no end-of-document token (<eos>, </s>, <|endoftext|>)");
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();

  std::error_code ec;
  fs::create_directories(opt.output_dir, ec);
  if (ec || !fs::is_directory(opt.output_dir)) fail(opt.output_dir, ": cannot create output folder: ", ec.message());
  fs::path out_dir = fs::path(opt.output_dir);
  fs::path tmp_dir = out_dir / (".prep-tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) fail(tmp_dir.string(), ": cannot create: ", ec.message());

  ShardMeta proto;
  proto.vocab_size = tok.vocab_size();
  proto.eos_id = uint32_t(tok.eos_id());
  proto.tokenizer_sha256 = tok.sha256();
  PrepResult res;
  SignalGuard signals;
  std::vector<std::string> moved;  // shards already moved into out_dir (removed on failure)
  try {
    SplitWriter train("train", tmp_dir, proto, opt), val("val", tmp_dir, proto, opt);
    Progress bar(opt.progress, total_bytes);
    uint64_t bytes_done = 0, tokens = 0, doc_index = 0;
    std::vector<std::string> batch;
    std::vector<std::vector<int32_t>> ids;
    uint64_t batch_bytes = 0;
    std::string batch_error;

    auto run_batch = [&] {
      ids.assign(batch.size(), {});
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
      for (size_t i = 0; i < batch.size(); ++i) {
        try {
          tok.encode(batch[i], ids[i], opt.parse_special);
        } catch (const Error& e) {
#pragma omp critical
          if (batch_error.empty()) batch_error = e.what();
        }
      }
      if (!batch_error.empty()) fail("prep: ", batch_error);
      for (size_t i = 0; i < batch.size(); ++i, ++doc_index) {
        bool to_val = std::floor(double(doc_index + 1) * opt.val_fraction) > std::floor(double(doc_index) * opt.val_fraction);
        (to_val ? val : train).add_document(ids[i]);
        tokens += ids[i].size() + 1;
      }
      batch.clear();
      batch_bytes = 0;
      if (g_interrupted) fail("prep: interrupted by signal ", int(g_interrupted), "; nothing was written");
      bar.update(bytes_done, tokens);
    };
    for (const std::string& f : files) {
      read_documents(
          f, opt.reader,
          [&](std::string&& doc) {
            batch_bytes += doc.size();
            batch.push_back(std::move(doc));
            if (batch_bytes >= (8u << 20) * uint64_t(threads)) run_batch();
          },
          [&](uint64_t n) { bytes_done += n; });
      if (g_interrupted) fail("prep: interrupted by signal ", int(g_interrupted), "; nothing was written");
    }
    if (!batch.empty()) run_batch();
    train.finish();
    val.finish();
    bar.update(total_bytes, tokens, true);
    if (train.split().num_documents == 0 && val.split().num_documents == 0) {
      std::string list;
      for (size_t i = 0; i < files.size() && i < 3; ++i) list += (i ? ", " : "") + files[i];
      fail("prep: empty corpus: no documents in ", list, files.size() > 3 ? ", ..." : "");
    }
    WIOLA_CHECK(train.split().num_documents > 0, "prep: the train split is empty (val fraction ", opt.val_fraction,
                " of ", doc_index, " documents)");

    Manifest& m = res.manifest;
    m.vocab_size = proto.vocab_size;
    m.eos_id = proto.eos_id;
    m.tokenizer_sha256 = proto.tokenizer_sha256;
    m.tokenizer_file = fs::absolute(opt.tokenizer_path).lexically_normal().string();
    m.splits["train"] = train.split();
    m.splits["val"] = val.split();
    nlohmann::ordered_json extra;
    extra["input_files"] = files.size();
    extra["input_bytes"] = total_bytes;
    extra["num_documents"] = doc_index;
    extra["val_fraction"] = opt.val_fraction;
    extra["shard_tokens"] = opt.shard_tokens;
    extra["parse_special"] = opt.parse_special;
    extra["eos_appended_to_each_document"] = true;
    m.extra_json = extra.dump();

    // Commit: old manifest out first, shards in, new manifest last.
    fs::path manifest_path = out_dir / kManifestName;
    if (fs::exists(manifest_path)) {
      fs::remove(manifest_path, ec);
      if (ec) fail(manifest_path.string(), ": cannot replace the old manifest: ", ec.message());
    }
    for (auto* s : {&m.splits["train"], &m.splits["val"]})
      for (ManifestShard& sh : s->shards) {
        fs::path dst = out_dir / sh.file;
        fs::rename(sh.path, dst, ec);
        if (ec) fail(dst.string(), ": cannot move the shard into place: ", ec.message());
        moved.push_back(dst.string());
        sh.path = dst.string();
      }
    m.path = manifest_path.string();
    write_manifest(m.path, m);
    fs::remove_all(tmp_dir, ec);
    res.manifest_path = m.path;
    res.input_bytes = total_bytes;
    res.seconds = bar.seconds();
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    for (const std::string& p : moved) fs::remove(p, ec);
    throw;
  }
  return res;
}

namespace {

// One shard of a split: its problems into `problems`; its tokens into the
// split's hash stream. Returns false when it could not be read to the end.
bool verify_shard(const Manifest& m, const ManifestShard& e, TokenHash& split_stream,
                  std::vector<std::string>& problems, DataVerifyStats& st) {
  try {
    const ShardReader r(e.path);
    const ShardMeta& s = r.meta();
    const std::string diff =
        tokenizer_difference(s.vocab_size, s.eos_id, s.tokenizer_sha256, m.vocab_size, m.eos_id, m.tokenizer_sha256);
    if (!diff.empty()) problems.push_back(e.path + ": made with another tokenizer than the manifest says" + diff);
    if (s.num_tokens != e.num_tokens || s.num_documents != e.num_documents)
      problems.push_back(e.path + ": holds " + std::to_string(s.num_tokens) + " tokens / " +
                         std::to_string(s.num_documents) + " documents, the manifest says " +
                         std::to_string(e.num_tokens) + " / " + std::to_string(e.num_documents));
    TokenHash shard_stream;
    std::vector<int32_t> buf(size_t(1) << 20);
    for (uint64_t at = 0; at < r.size(); at += buf.size()) {
      const uint64_t n = std::min<uint64_t>(buf.size(), r.size() - at);
      r.read(at, n, buf.data());  // checks every id < vocab_size
      shard_stream.add(buf.data(), n);
      split_stream.add(buf.data(), n);
    }
    ++st.shards;
    st.tokens += r.size();
    if (e.xxh3.empty()) {
      ++st.hashes_absent;
    } else {
      ++st.hashes_checked;
      const std::string got = shard_stream.hex();
      if (got != e.xxh3)
        problems.push_back(e.path + ": content hash " + got + ", the manifest says " + e.xxh3 +
                           " (the tokens changed since wiola prep wrote them)");
    }
    return true;
  } catch (const Error& err) {
    problems.push_back(err.what());
    return false;
  }
}

}  // namespace

std::vector<std::string> verify_data(const std::string& path, DataVerifyStats* stats) {
  std::vector<std::string> problems;
  DataVerifyStats st;
  std::error_code ec;
  const std::string manifest = fs::is_directory(path, ec) ? (fs::path(path) / kManifestName).string() : path;
  Manifest m;
  try {
    m = read_manifest(manifest);
  } catch (const Error& e) {
    problems.push_back(e.what());
    if (stats) *stats = st;
    return problems;
  }
  for (const auto& [name, split] : m.splits) {
    TokenHash stream;
    bool whole = true;
    uint64_t tokens = 0;
    for (const ManifestShard& e : split.shards) {
      whole = verify_shard(m, e, stream, problems, st) && whole;
      tokens += e.num_tokens;
    }
    if (tokens != split.num_tokens)
      problems.push_back(manifest + ": split '" + name + "' says " + std::to_string(split.num_tokens) +
                         " tokens, its shards " + std::to_string(tokens));
    if (split.xxh3.empty()) {
      ++st.hashes_absent;
    } else if (whole) {
      ++st.hashes_checked;
      const std::string got = stream.hex();
      if (got != split.xxh3)
        problems.push_back(manifest + ": split '" + name + "': content hash " + got + ", the manifest says " +
                           split.xxh3 + " (shards reordered, replaced or changed)");
    }
  }
  if (stats) *stats = st;
  return problems;
}

void print_chinchilla_report(FILE* f, uint64_t train_tokens) {
  struct Size {
    const char* name;
    uint64_t params;
  };
  const Size sizes[] = {{"wiola-120m", 147297804ull},
                        {"wiola-360m", 318048272ull},
                        {"wiola-700m", 1068518424ull},
                        {"wiola-1.5b", 2179698716ull}};
  std::fprintf(f, "Chinchilla budget (20 x exact parameters) vs %s train tokens:\n", with_commas(train_tokens).c_str());
  std::fprintf(f, "  %-11s %15s %17s %9s %12s\n", "model", "parameters", "budget tokens", "covered", "epochs");
  for (const Size& s : sizes) {
    uint64_t budget = 20 * s.params;
    double cov = double(train_tokens) / double(budget);
    std::fprintf(f, "  %-11s %15s %17s %8.3f%% %12.1f\n", s.name, with_commas(s.params).c_str(),
                 with_commas(budget).c_str(), 100 * cov, train_tokens ? double(budget) / double(train_tokens) : 0.0);
  }
}

}  // namespace wiola
