#include "ckpt/format.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "ckpt/h5.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/test_hooks.h"

namespace fs = std::filesystem;

namespace wiola::ckpt {
namespace {

using H5Id = h5::Id;
using h5::attr_i64;
using h5::attr_str;
using h5::attr_u64;
using h5::read_attr_i64;
using h5::read_attr_str;
void quiet_hdf5() { h5::quiet(); }

// Contiguous runs of a local -> global index map over local [lo, hi):
// (local start, global start, length). An empty map is the identity.
struct Run {
  int64_t local = 0, global = 0, len = 0;
};
std::vector<Run> runs_of(const std::vector<int32_t>& map, int64_t lo, int64_t hi) {
  if (map.empty()) return {{lo, lo, hi - lo}};
  std::vector<Run> out;
  for (int64_t i = lo; i < hi;) {
    int64_t j = i + 1;
    while (j < hi && map[size_t(j)] == map[size_t(j - 1)] + 1) ++j;
    out.push_back({i, map[size_t(i)], j - i});
    i = j;
  }
  return out;
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}

hid_t need(hid_t id, const std::string& file, const std::string& what) {
  WIOLA_CHECK(id >= 0, file, ": HDF5 failed at ", what);
  return id;
}
void need(herr_t e, const std::string& file, const std::string& what, int) {
  WIOLA_CHECK(e >= 0, file, ": HDF5 failed at ", what);
}

void write_piece(const std::string& file, hid_t kind_group, const TensorPiece& p) {
  H5Id g(need(H5Gcreate2(kind_group, p.name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), file, p.name),
         H5Gclose);
  attr_i64(file, g, "shape", {p.rows, p.cols});
  size_t off = 0;
  for (size_t k = 0; k < p.slices.size(); ++k) {
    const Slice& s = p.slices[k];
    const std::string ds_name = std::to_string(k);
    const hsize_t dims[2] = {hsize_t(s.nr), hsize_t(s.nc)};
    H5Id sp(need(H5Screate_simple(2, dims, nullptr), file, p.name), H5Sclose);
    H5Id ds(need(H5Dcreate2(g, ds_name.c_str(), H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 file, p.kind + "/" + p.name + "/" + ds_name),
            H5Dclose);
    const float* d = p.data.data() + off;
    need(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, d), file,
         "writing " + p.kind + "/" + p.name, 0);
    attr_i64(file, ds, "offset", {s.r0, s.c0});
    attr_u64(file, ds, "xxh3", XXH3_64bits(d, size_t(s.size()) * sizeof(float)));
    off += size_t(s.size());
  }
  WIOLA_CHECK(off == p.data.size(), "checkpoint: ", p.kind, "/", p.name, ": ", p.data.size(),
              " values for slices of ", off);
}

// A descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A rank file's HDF5 image, built in memory (no disk error can reach
// HDF5). Each piece's data is released once written, so the snapshot and
// the image together take little more than one of them. Returns the file's
// bytes; `slices` receives the slices it holds, as the manifest lists them.
std::vector<char> encode(const std::string& name, const FileHeader& h, std::vector<TensorPiece>& pieces,
                         nlohmann::json& slices) {
  size_t data_bytes = 0;
  for (const TensorPiece& p : pieces) data_bytes += p.data.size() * sizeof(float);
  h5::MemoryFile image(data_bytes + data_bytes / 64 + (size_t(1) << 20));
  need(hid_t(image), name, "creating the file in memory");
  attr_str(name, image, "format", kFormat);
  attr_str(name, image, "run_id", h.run_id);
  attr_i64(name, image, "step", {h.step});
  attr_i64(name, image, "rank", {h.rank});
  attr_i64(name, image, "grid_coord", {h.tp, h.pp, h.dp});
  slices = nlohmann::json::object();
  {
    std::map<std::string, std::unique_ptr<H5Id>> groups;
    for (const char* k : kKinds)
      groups[k] = std::make_unique<H5Id>(need(H5Gcreate2(image, k, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name, k),
                                         H5Gclose);
    for (TensorPiece& p : pieces) {
      WIOLA_CHECK(groups.count(p.kind), "checkpoint: unknown tensor kind '", p.kind, "'");
      if (p.slices.empty()) continue;
      write_piece(name, *groups[p.kind], p);
      std::vector<float>().swap(p.data);
      auto& arr = slices[p.kind][p.name];
      arr = nlohmann::json::array();
      for (const Slice& s : p.slices) arr.push_back({s.r0, s.c0, s.nr, s.nc});
    }
  }
  std::vector<char> bytes = image.bytes();
  WIOLA_CHECK(!bytes.empty(), name, ": HDF5 failed at finishing the file in memory");
  return bytes;
}

// The stages "create", "write" and "close" of a rank file: `bytes` written
// to `tmp`, fsynced and closed; each error names the path and the system's
// reason (disk full, read-only, quota...).
void write_to_disk(const std::vector<char>& bytes, const std::string& tmp, const FileHeader& h) {
  fail_if_injected("create", h.step, h.rank, tmp);
  Fd to{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  WIOLA_CHECK(to.fd >= 0, tmp, ": cannot create: ", std::strerror(errno));
  fail_if_injected("write", h.step, h.rank, tmp);
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t w = ::write(to.fd, bytes.data() + done, std::min(bytes.size() - done, size_t(1) << 30));
    WIOLA_CHECK(w > 0, tmp, ": write failed: ", std::strerror(w < 0 ? errno : EIO));
    done += size_t(w);
  }
  const bool synced = ::fsync(to.fd) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(std::exchange(to.fd, -1)) == 0;
  WIOLA_CHECK(synced && closed, tmp, ": ", synced ? "close" : "fsync", " failed: ",
              std::strerror(synced ? errno : sync_errno));
  fail_if_injected("close", h.step, h.rank, tmp);
}

}  // namespace

// ---- slices ------------------------------------------------------------------------
std::vector<Slice> slices_of(const ParamEntry& e, size_t a, size_t b) {
  std::vector<Slice> out;
  if (a >= b) return out;
  const int64_t C = e.cols;
  auto rect = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (const Run& rr : runs_of(e.row_map, r0, r1))
      for (const Run& cr : runs_of(e.col_map, c0, c1))
        out.push_back({rr.global, cr.global, rr.len, cr.len, rr.local, cr.local});
  };
  int64_t ra = int64_t(a) / C, ca = int64_t(a) % C;
  const int64_t rb = int64_t(b) / C, cb = int64_t(b) % C;
  if (ra == rb) {
    rect(ra, ra + 1, ca, cb);
    return out;
  }
  if (ca > 0) rect(ra, ra + 1, ca, C), ++ra;
  if (ra < rb) rect(ra, rb, 0, C);
  if (cb > 0) rect(rb, rb + 1, 0, cb);
  return out;
}

void gather_slice(const ParamEntry& e, const Slice& s, const float* local, int64_t a, float* out) {
  for (int64_t i = 0; i < s.nr; ++i)
    std::memcpy(out + i * s.nc, local + ((s.lr0 + i) * e.cols + s.lc0 - a), size_t(s.nc) * sizeof(float));
}
void scatter_slice(const ParamEntry& e, const Slice& s, const float* in, float* local, int64_t a) {
  for (int64_t i = 0; i < s.nr; ++i)
    std::memcpy(local + ((s.lr0 + i) * e.cols + s.lc0 - a), in + i * s.nc, size_t(s.nc) * sizeof(float));
}

// ---- writing -----------------------------------------------------------------------
void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  WIOLA_CHECK(fd >= 0, path, ": cannot open to sync: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  WIOLA_CHECK(rc == 0, path, ": fsync failed: ", std::strerror(e));
}

std::vector<std::string> stored_kinds(const nlohmann::json& manifest, const std::string& where) {
  if (!manifest.is_object() || !manifest.contains("kinds")) return {std::begin(kKinds), std::end(kKinds)};
  const nlohmann::json& k = manifest["kinds"];
  std::vector<std::string> out;
  bool ok = k.is_array();
  for (size_t i = 0; ok && i < k.size(); ++i) {
    const std::string kind = k[i].is_string() ? k[i].get<std::string>() : "";
    ok = std::find(std::begin(kKinds), std::end(kKinds), kind) != std::end(kKinds) &&
         std::find(out.begin(), out.end(), kind) == out.end();
    if (ok) out.push_back(kind);
  }
  WIOLA_CHECK(ok && std::find(out.begin(), out.end(), "param") != out.end(), where, ": \"kinds\" is ", k.dump(),
              ", expected distinct entries of \"param\", \"exp_avg\", \"exp_avg_sq\" with \"param\" among them");
  return out;
}

bool holds_optimizer(const nlohmann::json& manifest) { return stored_kinds(manifest, "checkpoint manifest").size() == 3; }

std::string step_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08lld", (long long)step);
  return b;
}

std::string rank_file(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.h5", rank);
  return b;
}

std::string file_xxh3(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  WIOLA_CHECK(f.good(), path, ": cannot read: ", std::strerror(errno));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(size_t(8) << 20);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    if (f.gcount() > 0) XXH3_64bits_update(st, buf.data(), size_t(f.gcount()));
  }
  const bool bad = f.bad();
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  WIOLA_CHECK(!bad, path, ": read error");
  return hex64(h);
}

FileRecord write_rank_file(const std::string& path, const FileHeader& h, std::vector<TensorPiece> pieces) {
  quiet_hdf5();
  const std::string tmp = path + ".tmp";
  FileRecord rec;
  rec.name = fs::path(path).filename().string();
  rec.header = h;
  const std::vector<char> bytes = encode(tmp, h, pieces, rec.slices);
  try {
    write_to_disk(bytes, tmp, h);
    fail_if_injected("rename", h.step, h.rank, path);
    WIOLA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": cannot rename into place: ",
                std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  rec.bytes = uint64_t(fs::file_size(path));
  rec.xxh3 = file_xxh3(path);
  return rec;
}

// ---- failures on purpose -------------------------------------------------------------
namespace {
// WIOLA_CKPT_FAIL_AT, parsed (docs/checkpoints.md#when-a-save-fails).
struct FaultPlan {
  std::string spec, stage;  // spec empty: no failures
  int64_t first = 0, last = INT64_MAX;
  int rank = -1;  // -1: every rank
};

FaultPlan parse_fault_plan() {
  FaultPlan p;
  const TestHook h(Hook::CkptFailAt);
  if (!h.set()) return p;
  p.spec = h.value();
  const size_t n = h.fields(1, 3);
  p.stage = h.word(0, std::vector<std::string>(std::begin(kSaveStages), std::end(kSaveStages)));
  if (n > 1) {
    const std::string& step = h.field(1);
    const bool onward = !step.empty() && step.back() == '-';
    p.first = h.integer_text(onward ? step.substr(0, step.size() - 1) : step, 0);
    p.last = onward ? INT64_MAX : p.first;
  }
  if (n > 2) p.rank = int(h.integer(2, 0, INT32_MAX));
  return p;
}

const FaultPlan& fault_plan() {
  static const FaultPlan plan = parse_fault_plan();
  return plan;
}
}  // namespace

void fail_if_injected(const char* stage, int64_t step, int rank, const std::string& path) {
  const FaultPlan& p = fault_plan();
  if (!p.spec.empty() && p.stage == stage && step >= p.first && step <= p.last && (p.rank < 0 || p.rank == rank))
    fail(path, ": ", stage, " failed: ", std::strerror(ENOSPC), " (WIOLA_CKPT_FAIL_AT=", fault_plan().spec, ")");
}

// ---- reading -----------------------------------------------------------------------
Reader::Reader(const std::string& folder) : folder_(folder) {
  quiet_hdf5();
  const std::string mpath = (fs::path(folder) / "manifest.json").string();
  std::ifstream in(mpath);
  WIOLA_CHECK(in.good(), "checkpoint '", folder, "': no manifest.json (an incomplete or foreign folder)");
  try {
    manifest_ = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(mpath, ": not valid JSON (", e.what(), ")");
  }
  auto bad = [&](const std::string& what) { fail(mpath, ": ", what); };
  std::vector<std::string> kinds;
  try {
    if (manifest_.value("format", std::string()) != kFormat)
      bad(std::string("not a wiola checkpoint manifest (format is not ") + kFormat + ")");
    for (const auto& f : manifest_.at("files")) {
      FileRecord r;
      r.name = f.at("name").get<std::string>();
      r.header.run_id = manifest_.at("run_id").get<std::string>();
      const std::string file = mpath + ": file " + r.name;
      r.header.step = json_int<int64_t>(manifest_.at("step"), mpath + ": step");
      r.header.rank = json_int<int>(f.at("rank"), file + ": rank");
      const auto c = json_ints<int>(f.at("grid_coord"), file + ": grid_coord");
      if (c.size() != 3) bad("file " + r.name + ": grid_coord must have 3 entries");
      r.header.tp = c[0], r.header.pp = c[1], r.header.dp = c[2];
      r.bytes = json_int<uint64_t>(f.at("bytes"), file + ": bytes");
      r.xxh3 = f.at("xxh3").get<std::string>();
      r.slices = f.at("slices");
      if (!is_plain_file_name(r.name)) bad("file name '" + r.name + "' is not a plain name");
      files_.push_back(std::move(r));
    }
    for (const auto& [name, t] : manifest_.at("tensors").items()) {
      const auto shape = json_ints<int64_t>(t.at("shape"), mpath + ": tensor " + name + ": shape");
      // Bounded so that element counts and slice ends cannot overflow.
      if (shape.size() != 2 || shape[0] < 1 || shape[1] < 1 || shape[0] > kMaxElements / shape[1])
        bad("tensor " + name + ": bad shape");
      tensors_[name].rows = shape[0];
      tensors_[name].cols = shape[1];
    }
    if (tensors_.empty()) bad("lists no tensors");
    // Slices by tensor and kind, each inside its tensor.
    for (size_t i = 0; i < files_.size(); ++i) {
      for (const auto& [kind, by_name] : files_[i].slices.items()) {
        if (std::find(std::begin(kKinds), std::end(kKinds), kind) == std::end(kKinds))
          bad("file " + files_[i].name + ": unknown tensor kind '" + kind + "'");
        for (const auto& [name, arr] : by_name.items()) {
          auto it = tensors_.find(name);
          if (it == tensors_.end()) bad("file " + files_[i].name + " holds " + name + ", which the manifest does not list");
          int k = 0;
          for (const auto& s : arr) {
            const auto v = json_ints<int64_t>(s, mpath + ": file " + files_[i].name + ": slices." + kind + "." + name);
            if (v.size() != 4 || v[0] < 0 || v[1] < 0 || v[2] < 1 || v[3] < 1 || v[0] > it->second.rows - v[2] ||
                v[1] > it->second.cols - v[3])
              bad("file " + files_[i].name + ": slice " + std::to_string(k) + " of " + kind + "/" + name +
                  " lies outside the tensor");
            it->second.by_kind[kind].push_back(
                {int(i), "/" + kind + "/" + name + "/" + std::to_string(k), v[0], v[1], v[2], v[3]});
            ++k;
          }
        }
      }
    }
    kinds = stored_kinds(manifest_, mpath);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    bad(std::string("missing or mistyped field (") + e.what() + ")");
  }
  // Every kind of every tensor is tiled exactly once: stored somewhere, its
  // slices pairwise disjoint and adding up to its size (a sum alone would let
  // an overlap hide a hole of the same size, which read() then leaves unset).
  for (auto& [name, t] : tensors_) {
    for (const std::string& kind : kinds) {
      auto kt = t.by_kind.find(kind);
      if (kt == t.by_kind.end()) bad(std::string(kind) + "/" + name + ": in no file (the tensor is not covered)");
      std::vector<Stored>& ss = kt->second;
      std::sort(ss.begin(), ss.end(), [](const Stored& x, const Stored& y) { return x.r0 < y.r0; });
      int64_t n = 0;
      for (size_t a = 0; a < ss.size(); ++a) {
        n += ss[a].nr * ss[a].nc;
        // Sorted by first row: only the following slices starting above
        // a's last row can share rows with it.
        for (size_t b = a + 1; b < ss.size() && ss[b].r0 < ss[a].r0 + ss[a].nr; ++b)
          if (ss[b].c0 < ss[a].c0 + ss[a].nc && ss[a].c0 < ss[b].c0 + ss[b].nc)
            bad(std::string(kind) + "/" + name + ": slice " + files_[size_t(ss[a].file)].name + ss[a].dataset +
                " overlaps " + files_[size_t(ss[b].file)].name + ss[b].dataset);
      }
      if (n != t.rows * t.cols)
        bad(std::string(kind) + "/" + name + ": slices hold " + std::to_string(n) + " elements of " +
            std::to_string(t.rows * t.cols) + " (the tensor is not covered)");
    }
  }
  handles_.assign(files_.size(), -1);
}

Reader::~Reader() {
  for (int64_t h : handles_)
    if (h >= 0) H5Fclose(hid_t(h));
}

int64_t Reader::step() const { return manifest_.at("step").get<int64_t>(); }

std::vector<std::string> Reader::verify(int stride, int offset) const {
  quiet_hdf5();
  std::vector<std::string> problems;
  for (size_t i = 0; i < files_.size(); ++i) {
    if (int(i % size_t(stride)) != offset) continue;
    const FileRecord& r = files_[i];
    const std::string p = (fs::path(folder_) / r.name).string();
    std::error_code ec;
    const auto bytes = fs::file_size(p, ec);
    if (ec) { problems.push_back(r.name + ": missing"); continue; }
    if (bytes != r.bytes) {
      problems.push_back(r.name + ": " + std::to_string(bytes) + " bytes, the manifest says " +
                         std::to_string(r.bytes) + " (truncated or replaced)");
      continue;
    }
    if (file_xxh3(p) != r.xxh3) { problems.push_back(r.name + ": checksum mismatch (corrupt)"); continue; }
    H5Id f(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (f < 0) { problems.push_back(r.name + ": not a readable HDF5 file"); continue; }
    std::string fmt, run;
    std::vector<int64_t> step, rank, coord;
    if (!read_attr_str(f, "format", fmt) || fmt != kFormat || !read_attr_str(f, "run_id", run) ||
        !read_attr_i64(f, "step", step) || !read_attr_i64(f, "rank", rank) ||
        !read_attr_i64(f, "grid_coord", coord) || step.size() != 1 || rank.size() != 1 || coord.size() != 3) {
      problems.push_back(r.name + ": not a wiola checkpoint shard (header attributes missing)");
      continue;
    }
    if (run != r.header.run_id)
      problems.push_back(r.name + ": belongs to run " + run + ", this checkpoint is run " + r.header.run_id);
    else if (step[0] != r.header.step)
      problems.push_back(r.name + ": written at step " + std::to_string(step[0]) + ", this checkpoint is step " +
                         std::to_string(r.header.step));
    else if (rank[0] != r.header.rank || coord[0] != r.header.tp || coord[1] != r.header.pp ||
             coord[2] != r.header.dp)
      problems.push_back(r.name + ": written by rank " + std::to_string(rank[0]) + ", the manifest expects rank " +
                         std::to_string(r.header.rank));
  }
  return problems;
}

bool Reader::has(const std::string& kind, const std::string& name) const {
  auto it = tensors_.find(name);
  return it != tensors_.end() && it->second.by_kind.count(kind);
}

std::pair<int64_t, int64_t> Reader::shape(const std::string& name) const {
  auto it = tensors_.find(name);
  WIOLA_CHECK(it != tensors_.end(), "checkpoint '", folder_, "' has no tensor ", name);
  return {it->second.rows, it->second.cols};
}

int64_t Reader::open_file(int file) {
  if (handles_[size_t(file)] < 0) {
    const std::string p = (fs::path(folder_) / files_[size_t(file)].name).string();
    const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    WIOLA_CHECK(f >= 0, "checkpoint '", folder_, "': cannot open ", files_[size_t(file)].name,
                " (missing or not HDF5)");
    handles_[size_t(file)] = int64_t(f);
  }
  return handles_[size_t(file)];
}

void Reader::read(const std::string& kind, const ParamEntry& e, size_t a, size_t b, float* out) {
  auto it = tensors_.find(e.name);
  WIOLA_CHECK(it != tensors_.end(), "checkpoint '", folder_, "' has no tensor ", e.name);
  const Tensor& t = it->second;
  WIOLA_CHECK(t.rows == e.grows && t.cols == e.gcols, "checkpoint '", folder_, "': ", e.name, " is [", t.rows,
              ", ", t.cols, "], this model's is [", e.grows, ", ", e.gcols, "]");
  auto kt = t.by_kind.find(kind);
  WIOLA_CHECK(kt != t.by_kind.end(), "checkpoint '", folder_, "' holds no ", kind, " of ", e.name);
  std::vector<float> tmp;
  int64_t filled = 0, wanted = 0;
  for (const Slice& n : slices_of(e, a, b)) {
    wanted += n.size();
    for (const Stored& s : kt->second) {
      const int64_t r0 = std::max(n.r0, s.r0), r1 = std::min(n.r0 + n.nr, s.r0 + s.nr);
      const int64_t c0 = std::max(n.c0, s.c0), c1 = std::min(n.c0 + n.nc, s.c0 + s.nc);
      if (r0 >= r1 || c0 >= c1) continue;
      const hid_t f = hid_t(open_file(s.file));
      const std::string& fname = files_[size_t(s.file)].name;
      H5Id ds(H5Dopen2(f, s.dataset.c_str(), H5P_DEFAULT), H5Dclose);
      WIOLA_CHECK(ds >= 0, "checkpoint '", folder_, "': ", fname, " lacks dataset ", s.dataset);
      H5Id fsp(H5Dget_space(ds), H5Sclose);
      hsize_t dims[2] = {0, 0};
      WIOLA_CHECK(H5Sget_simple_extent_ndims(fsp) == 2 && H5Sget_simple_extent_dims(fsp, dims, nullptr) == 2 &&
                      int64_t(dims[0]) == s.nr && int64_t(dims[1]) == s.nc,
                  "checkpoint '", folder_, "': ", fname, s.dataset, " does not have the manifest's shape");
      const hsize_t start[2] = {hsize_t(r0 - s.r0), hsize_t(c0 - s.c0)};
      const hsize_t count[2] = {hsize_t(r1 - r0), hsize_t(c1 - c0)};
      H5Sselect_hyperslab(fsp, H5S_SELECT_SET, start, nullptr, count, nullptr);
      H5Id msp(H5Screate_simple(2, count, nullptr), H5Sclose);
      tmp.resize(size_t(count[0] * count[1]));
      WIOLA_CHECK(H5Dread(ds, H5T_NATIVE_FLOAT, msp, fsp, H5P_DEFAULT, tmp.data()) >= 0, "checkpoint '", folder_,
                  "': reading ", s.dataset, " from ", fname, " failed (corrupt file?)");
      const Slice part{r0, c0, r1 - r0, c1 - c0, n.lr0 + (r0 - n.r0), n.lc0 + (c0 - n.c0)};
      scatter_slice(e, part, tmp.data(), out, int64_t(a));
      filled += part.size();
    }
  }
  WIOLA_CHECK(filled == wanted, "checkpoint '", folder_, "': ", kind, " of ", e.name, " covers ", filled, " of the ",
              wanted, " elements this rank needs");
}

// ---- finding checkpoints -------------------------------------------------------------
std::vector<std::string> list_checkpoints(const std::string& dir, bool incomplete) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& ent : fs::directory_iterator(dir, ec)) {
    const std::string n = ent.path().filename().string();
    if (n.rfind("step-", 0) != 0 || n.size() <= 5) continue;
    const std::string digits = n.substr(5);
    // At most 18 digits: any such number fits stoll (a longer name is foreign).
    if (digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    if (!incomplete && !fs::exists(ent.path() / "manifest.json")) continue;
    found.emplace_back(std::stoll(digits), ent.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  WIOLA_CHECK(fs::is_directory(p), "checkpoint '", path, "': no such directory");
  if (fs::exists(p / "manifest.json")) return p.string();
  std::ifstream latest(p / "latest");
  std::string name;
  if (latest && std::getline(latest, name) && !name.empty() && fs::exists(p / name / "manifest.json"))
    return (p / name).string();
  const auto all = list_checkpoints(path);
  WIOLA_CHECK(!all.empty(), "checkpoint '", path, "': neither a checkpoint (no manifest.json) nor a directory "
              "holding one");
  return all.front();
}

}  // namespace wiola::ckpt
