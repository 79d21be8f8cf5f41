#include "data/prep.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "data/doc_dedup.h"
#include "data/loader.h"
#include "data/prep_progress.h"
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

bool goes_to_val(uint64_t d, double f) { return std::floor(double(d + 1) * f) > std::floor(double(d) * f); }

enum SplitId { kTrain = 0, kVal = 1 };
constexpr const char* kSplitNames[2] = {"train", "val"};

// An interrupted prep: SIGINT/SIGTERM. Keeps the partial folder to resume.
class Interrupted : public Error {
 public:
  using Error::Error;
};
void check_interrupted() {
  if (g_interrupted)
    throw Interrupted(detail::concat("prep: interrupted by signal ", int(g_interrupted),
                                     "; rerun the same command to resume after the last shard written"));
}

// One document to tokenize, and where its tokens go.
struct Routed {
  std::string text;
  SplitId split = kTrain;
  uint64_t skip_tokens = 0;  // its first tokens, already in a shard (a resumed prep)
};

// Each document's fate, in input order: a duplicate of an earlier one
// (--dedup) is dropped; the others are numbered d = 0, 1, ... and go to val
// or train by d; on a resumed prep a document whose tokens are all in
// written shards is dropped too, after being counted.
class DocRouter {
 public:
  DocRouter(double val_fraction, bool dedup, const std::array<SplitResume, 2>& resume)
      : val_fraction_(val_fraction), dedup_(dedup), resume_(resume) {}

  // Appends `text` to `out` unless dropped.
  void route(std::string&& text, std::vector<Routed>& out) {
    if (dedup_ && !seen_texts_.insert(text)) {
      ++duplicates_;
      return;
    }
    const SplitId split = goes_to_val(documents_++, val_fraction_) ? kVal : kTrain;
    const uint64_t nth = in_split_[split]++;
    const SplitResume& r = resume_[split];
    if (nth < r.docs_written) return;
    out.push_back(Routed{std::move(text), split, nth == r.docs_written ? r.partial_tokens : 0});
  }
  uint64_t documents() const { return documents_; }
  uint64_t duplicates() const { return duplicates_; }

 private:
  double val_fraction_;
  bool dedup_;
  std::array<SplitResume, 2> resume_;
  DocDedup seen_texts_;
  uint64_t documents_ = 0, duplicates_ = 0;
  std::array<uint64_t, 2> in_split_{};
};

// Documents routed, a batch at a time, and the input bytes read before them.
struct Batch {
  std::vector<Routed> docs;
  uint64_t bytes_read = 0;
};

// Reads the inputs in order on its own thread (decompression, parsing,
// UTF-8 checks, routing), up to two batches of about `batch_bytes` of text
// ahead of the consumer, so reading overlaps tokenizing and memory stays
// bounded whatever the corpus size.
class DocumentFeed {
 public:
  DocumentFeed(const std::vector<std::string>& files, const DocReaderOptions& reader, DocRouter& router,
               uint64_t batch_bytes)
      : files_(files), reader_(reader), router_(router), batch_bytes_(batch_bytes), thread_([this] { run(); }) {}
  ~DocumentFeed() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  DocumentFeed(const DocumentFeed&) = delete;
  DocumentFeed& operator=(const DocumentFeed&) = delete;

  // The next batch into `b`; false once all input was read. Rethrows the reader's error.
  bool next(Batch& b) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || done_; });
    if (queue_.empty()) {
      if (error_) std::rethrow_exception(error_);
      return false;
    }
    b = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();
    return true;
  }
  uint64_t bad_skipped() const { return bad_skipped_; }  // after next() returned false

 private:
  struct Stopped {};  // unwinds the reader when the consumer gave up

  void run() {
    try {
      for (const std::string& f : files_)
        read_documents(
            f, reader_,
            [&](std::string&& doc) {
              pending_.bytes_read = bytes_read_;
              text_bytes_ += doc.size();
              router_.route(std::move(doc), pending_.docs);
              if (text_bytes_ >= batch_bytes_) push();
            },
            [&](uint64_t n) { bytes_read_ += n; }, [&](const std::string& why) { report_skip(why); });
      pending_.bytes_read = bytes_read_;
      push();
    } catch (const Stopped&) {
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void push() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.size() < 2 || stop_; });
    if (stop_) throw Stopped{};
    queue_.push_back(std::move(pending_));
    pending_ = Batch{};
    text_bytes_ = 0;
    cv_.notify_all();
  }
  void report_skip(const std::string& why) {
    if (++bad_skipped_ <= 20) std::fprintf(stderr, "wiola prep: skipped (--skip-bad): %s\n", why.c_str());
    if (bad_skipped_ == 20) std::fprintf(stderr, "wiola prep: further skips are counted, not listed\n");
  }

  const std::vector<std::string>& files_;
  const DocReaderOptions& reader_;
  DocRouter& router_;
  const uint64_t batch_bytes_;
  Batch pending_;  // reader thread only
  uint64_t text_bytes_ = 0, bytes_read_ = 0;
  std::atomic<uint64_t> bad_skipped_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after the members it uses
};

// Reads a shard through, adding its tokens to `shard` and `split` (content hashes).
void hash_shard(const ShardReader& r, TokenHash& shard, TokenHash& split) {
  std::vector<int32_t> buf(size_t(1) << 20);
  for (uint64_t at = 0; at < r.size(); at += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), r.size() - at);
    r.read(at, n, buf.data());  // checks every id < vocab_size
    shard.add(buf.data(), n);
    split.add(buf.data(), n);
  }
}

// Accumulates one split's token stream and cuts it into shards.
class SplitWriter {
 public:
  SplitWriter(SplitId id, const fs::path& dir, const ShardMeta& proto, const PrepOptions& opt)
      : name_(kSplitNames[id]), dir_(dir), proto_(proto), opt_(opt) {}

  // A resumed prep: the shards an interrupted one wrote (read back for the
  // split's content hash, each checked against its own) and where the
  // stream stands in them.
  void resume(const ManifestSplit& written, const SplitResume& at) {
    for (const ManifestShard& sh : written.shards) {
      const ShardReader r((dir_ / sh.file).string());
      TokenHash shard;
      hash_shard(r, shard, stream_);
      if (shard.hex() != sh.xxh3 || r.size() != sh.num_tokens)
        fail(r.path(), ": changed since the interrupted prep wrote it; cannot resume (add --fresh to start over)");
      split_.shards.push_back(ManifestShard{sh.file, r.path(), sh.num_tokens, sh.num_documents, sh.xxh3});
      written_tokens_ += sh.num_tokens;
      written_docs_ += sh.num_documents;
    }
    WIOLA_CHECK(written_docs_ == at.docs_written && at.partial_tokens <= written_tokens_, dir_.string(),
                ": the progress record does not match its ", name_, " shards; add --fresh to start over");
    last_end_written_ = written_tokens_ - at.partial_tokens;
    split_.num_tokens = written_tokens_;
    split_.num_documents = written_docs_;
  }

  // Appends a document's tokens, less the first `skip` (already in a shard),
  // and the EOS id; returns the number of shards it completed.
  int add_document(const std::vector<int32_t>& ids, uint64_t skip) {
    buf_.insert(buf_.end(), ids.begin() + std::ptrdiff_t(std::min<uint64_t>(skip, ids.size())), ids.end());
    buf_.push_back(int32_t(proto_.eos_id));
    doc_ends_.push_back(written_tokens_ + buf_.size());
    split_.num_tokens += ids.size() + 1 - skip;
    split_.num_documents += 1;
    int shards = 0;
    for (; buf_.size() >= opt_.shard_tokens; ++shards) flush(opt_.shard_tokens);
    return shards;
  }
  void finish() {
    if (!buf_.empty()) flush(buf_.size());
    split_.xxh3 = stream_.hex();
  }
  const ManifestSplit& split() const { return split_; }
  // What is in written shards, for the progress record.
  ManifestSplit written() const {
    ManifestSplit w;
    w.shards = split_.shards;
    w.num_tokens = written_tokens_;
    w.num_documents = written_docs_;
    return w;
  }
  SplitResume position() const { return {written_docs_, written_tokens_ - last_end_written_}; }

 private:
  void flush(uint64_t n) {
    const uint64_t end = written_tokens_ + n;
    uint64_t docs = 0;
    for (; !doc_ends_.empty() && doc_ends_.front() <= end; doc_ends_.pop_front(), ++docs)
      last_end_written_ = doc_ends_.front();
    char file[64];
    std::snprintf(file, sizeof file, "%s-%05zu.h5", name_.c_str(), split_.shards.size());
    ShardMeta meta = proto_;
    meta.num_tokens = n;
    meta.num_documents = docs;
    write_shard((dir_ / file).string(), buf_.data(), n, meta, opt_.shard);
    // The content hashes (data/manifest.h): the shard's and the split's stream.
    TokenHash shard;
    shard.add(buf_.data(), n);
    stream_.add(buf_.data(), n);
    split_.shards.push_back(ManifestShard{file, (dir_ / file).string(), n, docs, shard.hex()});
    buf_.erase(buf_.begin(), buf_.begin() + std::ptrdiff_t(n));
    written_tokens_ = end;
    written_docs_ += docs;
  }

  std::string name_;
  fs::path dir_;
  ShardMeta proto_;
  const PrepOptions& opt_;
  std::vector<int32_t> buf_;       // tokens not yet in a shard
  std::deque<uint64_t> doc_ends_;  // stream offsets of the ends of documents in buf_
  uint64_t written_tokens_ = 0, written_docs_ = 0, last_end_written_ = 0;  // in shards
  ManifestSplit split_;
  TokenHash stream_;  // the split's content hash
};

void check_options(const PrepOptions& opt) {
  WIOLA_CHECK(!opt.inputs.empty(), "prep: no input files");
  WIOLA_CHECK(!opt.output_dir.empty(), "prep: no output folder");
  WIOLA_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "prep: --val-fraction must be in [0, 1), got ",
              opt.val_fraction);
  WIOLA_CHECK(opt.shard_tokens > 0, "prep: --shard-tokens must be positive");
}

// What a resumed prep must share with the interrupted one (JSON text): the
// inputs (absolute path, size, modification time), the tokenizer and every
// option that changes the output. Not the thread count.
std::string prep_identity(const PrepOptions& opt, const std::vector<std::string>& files, const Tokenizer& tok) {
  nlohmann::ordered_json id, inputs = nlohmann::ordered_json::array();
  for (const std::string& f : files) {
    std::error_code ec;
    const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    inputs.push_back({fs::absolute(f).lexically_normal().string(), fs::file_size(f, ec), int64_t(mtime)});
  }
  id["inputs"] = inputs;
  id["tokenizer_sha256"] = tok.sha256();
  id["format"] = int(opt.reader.format);
  id["doc_per_file"] = opt.reader.doc_per_file;
  id["text_field"] = opt.reader.text_field;
  id["skip_bad"] = opt.reader.skip_bad;
  id["dedup"] = opt.dedup;
  id["shard_tokens"] = opt.shard_tokens;
  id["val_fraction"] = opt.val_fraction;
  id["chunk_tokens"] = opt.shard.chunk_tokens;
  id["compression"] = opt.shard.deflate_level;
  id["parse_special"] = opt.parse_special;
  return id.dump();
}

// An exclusive lock on the output folder for one prep's lifetime: a second
// prep into the same folder is refused instead of mixing shards.
class OutputLock {
 public:
  explicit OutputLock(const fs::path& dir) : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) fail(dir.string(), ": cannot open the output folder: ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fail(dir.string(), ": another wiola prep is writing into this folder");
    }
  }
  ~OutputLock() { ::close(fd_); }
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  int fd_;
};

// The progress an interrupted prep left in `partial` (created if missing):
// nullopt when there is none to resume (or --fresh discards it). A shard
// recorded there but already moved into `out_dir` by an interrupted final
// step is moved back.
std::optional<PrepProgress> open_partial(const fs::path& out_dir, const fs::path& partial, const std::string& identity,
                                         bool fresh) {
  std::error_code ec;
  std::optional<PrepProgress> p;
  if (!fresh) p = load_prep_progress(partial.string(), identity);
  if (!p) {
    fs::remove_all(partial, ec);
    fs::create_directories(partial, ec);
    if (ec) fail(partial.string(), ": cannot create: ", ec.message());
    return p;
  }
  for (const auto& [name, split] : p->shards.splits)
    for (const ManifestShard& sh : split.shards)
      if (!fs::exists(partial / sh.file, ec) && fs::exists(out_dir / sh.file, ec))
        fs::rename(out_dir / sh.file, partial / sh.file, ec);
  return p;
}

// The resume positions of both splits (none for a fresh prep).
std::array<SplitResume, 2> resume_positions(const std::optional<PrepProgress>& p) {
  std::array<SplitResume, 2> r{};
  if (p)
    for (SplitId s : {kTrain, kVal})
      if (p->resume.count(kSplitNames[s])) r[s] = p->resume.at(kSplitNames[s]);
  return r;
}

// Tokenizes a batch in parallel, ids[i] for batch.docs[i].
void tokenize_batch(const Tokenizer& tok, const Batch& batch, std::vector<std::vector<int32_t>>& ids, int threads,
                    bool parse_special) {
  ids.resize(batch.docs.size());
  std::string error;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (size_t i = 0; i < batch.docs.size(); ++i) {
    try {
      ids[i].clear();  // encode appends
      tok.encode(batch.docs[i].text, ids[i], parse_special);
    } catch (const Error& e) {
#pragma omp critical
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) fail("prep: ", error);
}

// The final step: the old manifest out, the shards from `partial` into
// `out_dir` (recorded in `moved`), the new manifest in last, `partial` removed.
void commit_output(const fs::path& out_dir, const fs::path& partial, Manifest& m, std::vector<std::string>& moved) {
  std::error_code ec;
  const fs::path manifest_path = out_dir / kManifestName;
  if (fs::exists(manifest_path)) {
    fs::remove(manifest_path, ec);
    if (ec) fail(manifest_path.string(), ": cannot replace the old manifest: ", ec.message());
  }
  for (auto& [name, split] : m.splits)
    for (ManifestShard& sh : split.shards) {
      const fs::path dst = out_dir / sh.file;
      fs::rename(sh.path, dst, ec);
      if (ec) fail(dst.string(), ": cannot move the shard into place: ", ec.message());
      moved.push_back(dst.string());
      sh.path = dst.string();
    }
  m.path = manifest_path.string();
  write_manifest(m.path, m);
  fs::remove_all(partial, ec);
}

[[noreturn]] void fail_empty_corpus(const std::vector<std::string>& files) {
  std::string list;
  for (size_t i = 0; i < files.size() && i < 3; ++i) list += (i ? ", " : "") + files[i];
  fail("prep: empty corpus: no documents in ", list, files.size() > 3 ? ", ..." : "");
}

// The manifest's "prep" record. Optional features add their fields only when on.
std::string prep_record(const PrepOptions& opt, const PrepResult& res, size_t files) {
  nlohmann::ordered_json extra;
  extra["input_files"] = files;
  extra["input_bytes"] = res.input_bytes;
  extra["num_documents"] = res.documents;
  extra["val_fraction"] = opt.val_fraction;
  extra["shard_tokens"] = opt.shard_tokens;
  extra["parse_special"] = opt.parse_special;
  extra["eos_appended_to_each_document"] = true;
  if (opt.dedup) {
    extra["dedup"] = "exact (XXH3-128 of the text)";
    extra["duplicates_removed"] = res.duplicates;
  }
  if (opt.reader.skip_bad) extra["bad_skipped"] = res.bad_skipped;
  return extra.dump();
}

// Tokenizes the documents the feed gives into the two writers, saving the
// progress after each shard; returns the tokens added.
uint64_t tokenize_into(DocumentFeed& feed, const Tokenizer& tok, const PrepOptions& opt, int threads,
                       std::array<SplitWriter, 2>& writers, const std::function<void()>& save_progress,
                       Progress& bar) {
  uint64_t tokens = 0;
  int shards = 0;
  Batch batch;
  std::vector<std::vector<int32_t>> ids;
  while (feed.next(batch)) {
    tokenize_batch(tok, batch, ids, threads, opt.parse_special);
    for (size_t i = 0; i < batch.docs.size(); ++i) {
      const Routed& d = batch.docs[i];
      tokens += ids[i].size() + 1 - d.skip_tokens;
      if (writers[d.split].add_document(ids[i], d.skip_tokens) == 0) continue;
      save_progress();
      if (opt.test_kill_after_shards > 0 && ++shards >= opt.test_kill_after_shards) std::raise(SIGKILL);
    }
    check_interrupted();
    bar.update(batch.bytes_read, tokens);
  }
  return tokens;
}

}  // namespace

PrepResult run_prep(const PrepOptions& opt) {
  check_options(opt);
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
  const fs::path out_dir = fs::path(opt.output_dir), partial = out_dir / kPrepPartialDir;
  OutputLock lock(out_dir);
  const std::string identity = prep_identity(opt, files, tok);
  const std::optional<PrepProgress> progress = open_partial(out_dir, partial, identity, opt.fresh);

  ShardMeta proto;
  proto.vocab_size = tok.vocab_size();
  proto.eos_id = uint32_t(tok.eos_id());
  proto.tokenizer_sha256 = tok.sha256();
  PrepResult res;
  res.input_bytes = total_bytes;
  Manifest& m = res.manifest;
  m.vocab_size = proto.vocab_size;
  m.eos_id = proto.eos_id;
  m.tokenizer_sha256 = proto.tokenizer_sha256;
  m.tokenizer_file = fs::absolute(opt.tokenizer_path).lexically_normal().string();
  std::array<SplitWriter, 2> writers{SplitWriter(kTrain, partial, proto, opt), SplitWriter(kVal, partial, proto, opt)};
  const std::array<SplitResume, 2> resume = resume_positions(progress);
  for (SplitId s : {kTrain, kVal})
    if (progress && progress->shards.splits.count(kSplitNames[s])) {
      writers[s].resume(progress->shards.splits.at(kSplitNames[s]), resume[s]);
      res.resumed_shards += writers[s].split().shards.size();
    }
  if (progress && opt.progress)
    std::fprintf(stderr, "prep: resuming an interrupted prep after %llu shard(s) in %s\n",
                 (unsigned long long)res.resumed_shards, partial.c_str());
  SignalGuard signals;
  std::vector<std::string> moved;  // shards already moved into out_dir (removed on failure)
  try {
    auto save_progress = [&] {
      for (SplitId s : {kTrain, kVal}) m.splits[kSplitNames[s]] = writers[s].written();
      save_prep_progress(partial.string(), identity, m,
                         {{kSplitNames[kTrain], writers[kTrain].position()}, {kSplitNames[kVal], writers[kVal].position()}});
    };

    Progress bar(opt.progress, total_bytes);
    DocRouter router(opt.val_fraction, opt.dedup, resume);
    uint64_t tokens = 0;
    {
      DocumentFeed feed(files, opt.reader, router, opt.batch_bytes ? opt.batch_bytes : (8u << 20) * uint64_t(threads));
      tokens = tokenize_into(feed, tok, opt, threads, writers, save_progress, bar);
      res.bad_skipped = feed.bad_skipped();
    }
    check_interrupted();
    for (SplitWriter& w : writers) w.finish();
    bar.update(total_bytes, tokens, true);
    res.documents = router.documents();
    res.duplicates = router.duplicates();
    if (res.documents == 0) fail_empty_corpus(files);
    WIOLA_CHECK(writers[kTrain].split().num_documents > 0, "prep: the train split is empty (val fraction ",
                opt.val_fraction, " of ", res.documents, " documents)");

    for (SplitId s : {kTrain, kVal}) m.splits[kSplitNames[s]] = writers[s].split();
    m.extra_json = prep_record(opt, res, files.size());
    commit_output(out_dir, partial, m, moved);
    res.manifest_path = m.path;
    res.seconds = bar.seconds();
  } catch (const Interrupted&) {
    throw;  // the partial folder stays for a rerun to resume
  } catch (...) {
    fs::remove_all(partial, ec);
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
    hash_shard(r, shard_stream, split_stream);
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
